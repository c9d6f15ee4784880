// A minimal little-endian binary writer/reader for the kvstore wire forms (sequence metadata).
// Reader errors are DATA_LOSS statuses naming what was being read; never a crash on bad input.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "common/status.h"

namespace icecache::kvstore {

// Version of the kvstore wire forms (SequenceCache metadata and the DciTree form inside it).
// Readers accept only their own version. Bumped whenever a form changes; what each version added
// or dropped: docs/kvstore.md, "Known gaps", the wire-version item (9: the DciParams fields of the
// options in "Tried and not served" dropped).
inline constexpr uint32_t kKvWireVersion = 9;

class WireWriter {
 public:
  template <typename T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t off = buf_.size();
    buf_.resize(off + sizeof(T));
    std::memcpy(buf_.data() + off, &v, sizeof(T));
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    Put<uint64_t>(v.size());
    const size_t off = buf_.size();
    buf_.resize(off + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(buf_.data() + off, v.data(), v.size() * sizeof(T));
  }
  std::vector<uint8_t>& buffer() { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

class WireReader {
 public:
  WireReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  Status Get(T* v, const char* what) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (size_ - pos_ < sizeof(T)) return Truncated(what);
    std::memcpy(v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  // `max_len` bounds the element count so that corrupt input cannot request huge allocations.
  template <typename T>
  Status GetVector(std::vector<T>* v, const char* what, uint64_t max_len) {
    uint64_t n = 0;
    ICE_RETURN_IF_ERROR(Get(&n, what));
    if (n > max_len)
      return DataLossError(std::string("sequence wire form: ") + what + " has " + std::to_string(n) +
                           " elements, more than the allowed " + std::to_string(max_len));
    if ((size_ - pos_) / sizeof(T) < n) return Truncated(what);
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), data_ + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return Status::Ok();
  }
  bool done() const { return pos_ == size_; }
  size_t remaining() const { return size_ - pos_; }

 private:
  Status Truncated(const char* what) const {
    return DataLossError(std::string("sequence wire form truncated while reading ") + what + " at byte " +
                         std::to_string(pos_) + " of " + std::to_string(size_));
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace icecache::kvstore
