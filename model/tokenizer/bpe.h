// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): vocabulary, merges applied by
// rank, optional byte_fallback (<0xNN> tokens), unk token, fuse_unk and ignore_merges.
//
// Thread safety: immutable after Parse except for an internal word cache guarded by a mutex;
// Tokenize may be called concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "model/tokenizer/tokenizer_json_reader.h"

namespace icecache::tokenizer {

class BpeModel {
 public:
  // Builds the model from the "model" object (options; its vocab and merges are placeholders) and
  // the vocab and merges read by ReadTokenizerJson. Errors: INVALID_ARGUMENT for a missing vocab
  // or merges, merges naming unknown tokens or producing a token outside the vocabulary, ids out of
  // range, unsupported options (dropout, continuing_subword_prefix, end_of_word_suffix).
  static StatusOr<std::unique_ptr<BpeModel>> Build(const nlohmann::json& model, BpeData data);

  // Appends the ids of one pre-tokenized piece (in the vocabulary's alphabet).
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr for an id the vocabulary lacks.
  const std::string* IdToToken(int32_t id) const;
  // Max id + 1 of the model vocabulary.
  int32_t size() const { return static_cast<int32_t>(id_to_token_.size()); }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  BpeModel() = default;
  void MergeWord(std::string_view word, std::vector<int32_t>* ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::optional<int32_t> unk_id_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_;  // <0xNN> token ids, -1 when absent

  static constexpr size_t kCacheCapacity = 1 << 15;
  static constexpr size_t kMaxCachedWordBytes = 128;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace icecache::tokenizer
