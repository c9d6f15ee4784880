#include <algorithm>

#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

// Decodes the window ids_[prefix_offset_ ..) and subtracts the decode of ids_[prefix_offset_,
// read_offset_): the window keeps one already-emitted chunk of context so that decoders which treat
// the first token specially (Metaspace, Strip) see the same token first in both decodes.
StatusOr<std::string> IncrementalDecoder::Push(int32_t id) {
  ids_.push_back(id);
  std::span<const int32_t> all(ids_);
  ICE_ASSIGN_OR_RETURN(std::string prefix,
                       tokenizer_.DecodeBytes(all.subspan(prefix_offset_, read_offset_ - prefix_offset_),
                                              skip_special_tokens_));
  auto full_or = tokenizer_.DecodeBytes(all.subspan(prefix_offset_), skip_special_tokens_);
  if (!full_or.ok()) {
    ids_.pop_back();
    return full_or.status();
  }
  const std::string& full = *full_or;
  // Every supported decoder only appends; should one ever rewrite, nothing already emitted repeats.
  std::string tail = full.substr(std::min(prefix.size(), full.size()));
  size_t stable = StableUtf8PrefixLength(tail);
  std::string out;
  if (stable > emitted_bytes_) {
    out = ToValidUtf8(std::string_view(tail).substr(emitted_bytes_, stable - emitted_bytes_));
    emitted_bytes_ = stable;
  }
  if (stable == tail.size()) {
    // Slide the window only past tokens that produced text, so its first decoded token stays the same.
    if (!tail.empty()) prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
    emitted_bytes_ = 0;
  }
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::span<const int32_t> all(ids_);
  auto prefix = tokenizer_.DecodeBytes(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_tokens_);
  auto full = tokenizer_.DecodeBytes(all.subspan(prefix_offset_), skip_special_tokens_);
  std::string out;
  if (prefix.ok() && full.ok() && full->size() >= prefix->size() + emitted_bytes_) {
    out = ToValidUtf8(std::string_view(*full).substr(prefix->size() + emitted_bytes_));
  }
  prefix_offset_ = read_offset_ = ids_.size();
  emitted_bytes_ = 0;
  return out;
}

}  // namespace icecache::tokenizer
