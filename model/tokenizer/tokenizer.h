// Hugging Face tokenizer.json tokenizers: byte-level BPE (Llama-3, Qwen2/3: NFC normalizer,
// Split(regex) + ByteLevel pre-tokenizers) and SentencePiece-style BPE (Llama-2, Mistral:
// Metaspace, byte_fallback). Added/special tokens are matched in text before the model runs.
//
// Thread safety: a loaded Tokenizer is immutable; all const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace icecache::tokenizer {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

// The family of the model's chat template: kNone = the model has none; kLlama3 / kChatMl = it
// writes those turn markers; kOther = any other template (all run through the same interpreter).
enum class ChatFormat { kNone, kLlama3, kChatMl, kOther };

// Per-request options of chat formatting.
struct ChatRenderOptions {
  // Extra template variables as a JSON object, e.g. {"enable_thinking": false} for Qwen3
  // (transformers' apply_chat_template kwargs); empty = none.
  std::string extra_variables_json;
  // The time strftime_now() formats (Llama-3.2's "Today Date"); unset = the current local time.
  std::optional<std::tm> now;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads `path` (a tokenizer.json, or a directory holding one). If a tokenizer_config.json sits
  // beside it, its chat template (compiled by the Jinja-subset interpreter), bos/eos
  // tokens and add_bos_token are read too. Errors name the file and the problem
  // (INVALID_ARGUMENT for malformed or unsupported content, NOT_FOUND for a missing file).
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  // Encodes text. Added tokens present in the text are matched as whole tokens. With
  // add_special_tokens, the model's bos token is prepended where the tokenizer config asks for it
  // (the TemplateProcessing post-processor of tokenizer.json, else add_bos_token / add_eos_token of
  // tokenizer_config.json). INVALID_ARGUMENT when text is not valid UTF-8.
  virtual StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens = false) const = 0;

  // Decodes ids to text. OUT_OF_RANGE for an id outside the vocabulary. Invalid UTF-8 byte
  // sequences (possible mid-stream) are replaced by U+FFFD.
  virtual StatusOr<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const = 0;

  // Like Decode but returns the decoder's raw bytes, which may end in (or contain) incomplete
  // UTF-8; Decode(ids) == the U+FFFD-replaced form of DecodeBytes(ids). IncrementalDecoder uses it.
  // The default calls Decode.
  virtual StatusOr<std::string> DecodeBytes(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Total number of ids (model vocabulary plus added tokens), i.e. max id + 1.
  virtual int vocab_size() const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;

  // From tokenizer_config.json where present (bos_token / eos_token, strings or {"content": ...}),
  // plus generation_config.json's eos_token_id and the end-of-turn tokens the chat template writes
  // (<|eot_id|>, <|eom_id|>, <|im_end|>, <|end|>, <end_of_turn>). Without a config: the single token the post-processor prepends is the
  // bos; the first of <|end_of_text|>, <|endoftext|>, </s>, <|eot_id|>, <|im_end|> found is the eos.
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::vector<int32_t> eos_ids() const = 0;
  virtual ChatFormat chat_format() const = 0;

  // Formats messages with the model's chat template, as transformers' apply_chat_template does
  // (errors: see FormatChat in chat_template.h; FAILED_PRECONDITION when there is no template).
  virtual StatusOr<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                  bool add_generation_prompt) const = 0;
  virtual StatusOr<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                                  const ChatRenderOptions& options) const = 0;
};

// Streaming decoder: feed ids one at a time, get back only text that is complete UTF-8 and will
// not change when more ids arrive. Not thread-safe; one per stream. The Tokenizer must outlive it.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);
  // Returns the new text made final by `id` (possibly empty). An id the tokenizer rejects
  // (OUT_OF_RANGE) is not added to the stream.
  StatusOr<std::string> Push(int32_t id);
  // Returns whatever is left (incomplete UTF-8 becomes U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  // Text comes from decoding the window ids_[prefix_offset_ ..) minus the decode of
  // ids_[prefix_offset_, read_offset_); emitted_bytes_ counts the bytes of that difference
  // already returned (a character still incomplete is held back).
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
  size_t emitted_bytes_ = 0;
};

// Builds the text of a small but real byte-level BPE tokenizer.json (Llama-3 style: Split regex +
// ByteLevel pre-tokenizer, 256 byte tokens, merges learned greedily from `corpus` until
// `vocab_size` regular tokens exist; when the corpus runs out of pairs, existing tokens are
// extended by printable ASCII bytes), plus the given special tokens appended as added tokens with
// ids vocab_size, vocab_size + 1, ... The first special token is the bos of a TemplateProcessing
// post-processor. Byte b has id b. Deterministic. Used by `icecache make-model` and tests.
// INVALID_ARGUMENT when vocab_size < 256 or > 1,000,000, the corpus is not UTF-8, or a special
// token is empty or repeated.
struct ByteLevelBpeSpec {
  int vocab_size = 512;           // regular tokens (bytes + merges), special tokens not counted
  std::string corpus;             // training text for merges; empty = bytes only
  std::vector<std::string> special_tokens = {"<|begin_of_text|>", "<|end_of_text|>"};
};
StatusOr<std::string> BuildByteLevelBpeTokenizerJson(const ByteLevelBpeSpec& spec);

}  // namespace icecache::tokenizer
