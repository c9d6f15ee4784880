// Tokenizers described by GGUF metadata (tokenizer.ggml.*), built into the same pipeline as a
// tokenizer.json:
//   * model "gpt2": byte-level BPE with tokenizer.ggml.merges. tokenizer.ggml.pre picks the
//     pre-tokenizer that the model's own tokenizer.json has:
//       "gpt2", "default" (or absent)         ByteLevel (GPT-2 regex)
//       "smollm"                              Digits(individual) + ByteLevel (GPT-2 regex)
//       "llama-bpe", "llama3", "smaug-bpe", "dbrx"   Split(Llama-3 regex) + ByteLevel
//       "qwen2", "deepseek-r1-qwen"           Split(Qwen2 regex) + ByteLevel
//     any other pre type is refused (INVALID_ARGUMENT naming it and the list).
//   * model "llama": SentencePiece BPE with scores and <0xNN> byte fallback (Prepend + Replace
//     normalizer when tokenizer.ggml.add_space_prefix, the default); merges are derived from the
//     scores: a pair (a, b) whose concatenation is a token merges with the rank of that token's
//     score (higher score first, ties by the merged token's id).
// Token types (tokenizer.ggml.token_type): 3 (control) are special added tokens matched in text,
// 4 (user-defined) are non-special added tokens. bos / eos from tokenizer.ggml.bos_token_id /
// eos_token_id (eos_ids also gets the chat format's end-of-turn token); add_bos_token /
// add_eos_token from tokenizer.ggml.add_bos_token / add_eos_token (defaults: true for llama,
// false for gpt2); the chat template from tokenizer.chat_template.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::tokenizer {

struct GgufVocab {
  std::string source;  // the file, for messages
  std::string model;   // tokenizer.ggml.model
  std::string pre;     // tokenizer.ggml.pre ("" when absent)
  std::vector<std::string_view> tokens;
  std::vector<int64_t> token_types;      // empty: all normal
  std::vector<float> scores;             // llama: one per token
  std::vector<std::string_view> merges;  // gpt2: "left right"
  std::optional<int64_t> bos_id, eos_id, unk_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::string chat_template;
};

// Errors (INVALID_ARGUMENT, starting with vocab.source): unsupported model or pre type, sizes that
// disagree (token_type / scores vs tokens), malformed merges, ids outside the vocabulary.
StatusOr<std::unique_ptr<Tokenizer>> BuildGgufTokenizer(const GgufVocab& vocab);

}  // namespace icecache::tokenizer
