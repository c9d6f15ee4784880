// The Tokenizer implementation behind Tokenizer::Load: the Hugging Face pipeline
// added tokens -> normalizer -> pre-tokenizer -> BPE model, and ids -> decoder for the way back.
// Immutable after loading (the BPE word cache is internally locked); thread-safe.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/tokenizer/added_tokens.h"
#include "model/tokenizer/bpe.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/decoder.h"
#include "model/tokenizer/normalizer.h"
#include "model/tokenizer/pretokenizer.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::tokenizer {

class TokenizerImpl : public Tokenizer {
 public:
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const override;
  StatusOr<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  StatusOr<std::string> DecodeBytes(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  bool IsSpecial(int32_t id) const override;
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::vector<int32_t> eos_ids() const override { return eos_ids_; }
  ChatFormat chat_format() const override { return chat_.format; }
  StatusOr<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt) const override;
  StatusOr<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                          const ChatRenderOptions& options) const override;

 private:
  friend class TokenizerLoader;
  void EncodeText(std::string_view text, bool at_text_start, std::vector<int32_t>* ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_tokens_;
  std::unordered_map<int32_t, size_t> added_by_id_;          // id -> index in added_tokens_
  std::unordered_map<std::string, int32_t> added_by_content_;
  AddedTokenMatcher raw_matcher_;         // tokens with normalized = false, matched on the input
  AddedTokenMatcher normalized_matcher_;  // tokens with normalized = true, matched after normalizing
  int vocab_size_ = 0;

  std::vector<int32_t> prefix_ids_, suffix_ids_;  // added around the text with add_special_tokens
  std::optional<int32_t> bos_id_;
  std::vector<int32_t> eos_ids_;
  ChatTemplate chat_;
};

// The pipeline of a tokenizer.json already read (`doc`, `data` as ReadTokenizerJson gives them)
// with an optional tokenizer_config.json object `config` (null when absent) and
// generation_config.json object; what Tokenizer::Load does after reading the files. Errors start
// with `source` (tokenizer problems) or `config_source` (config problems). Also used to build
// tokenizers described by GGUF metadata (gguf_vocab.h).
StatusOr<std::unique_ptr<Tokenizer>> BuildTokenizer(nlohmann::json doc, BpeData data, const nlohmann::json& config,
                                                    const nlohmann::json* generation_config, const std::string& source,
                                                    const std::string& config_source);

}  // namespace icecache::tokenizer
