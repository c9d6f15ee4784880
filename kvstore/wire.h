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
// 2: DciParams field by field, with bf16_parent_search; 3: DciParams gains fov_sqrt, group_fov,
// centroid_cells, centroid_bonus, score_level1_keys and int8_parent_search, and the tree form carries this version after its
// magic; 4: DciParams gains leaf_layout; 5: DciParams gains sticky_margin; 6: DciParams gains leaf_rank,
// leaf_rank_cells, leaf_rank_leaves and leaf_bonus; 7: DciParams gains cell_spread (last), and a tree
// with CellSpread::kDirectional ships its cell summaries' per-channel sums of squares; 8: DciParams
// gains refine_passes and refine_candidates (last). Readers accept only their own version.
inline constexpr uint32_t kKvWireVersion = 8;

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
