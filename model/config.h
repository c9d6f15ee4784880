// Model configuration read from a Hugging Face config.json (Llama family).
//
// Supported architectures: LlamaForCausalLM, MistralForCausalLM (without sliding window),
// Qwen2ForCausalLM (q/k/v projections carry a bias), Qwen3ForCausalLM (per-head RMSNorm of q and k
// before RoPE; head_dim may differ from hidden_size / num_attention_heads). Rope scaling: none,
// "linear", "llama3". Anything else (sliding window attention, other rope scalings, MoE, ...) is
// refused with an error that says what is supported.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/rope.h"

namespace icecache::model {

enum class Architecture : int { kLlama = 0, kMistral = 1, kQwen2 = 2, kQwen3 = 3 };

std::string_view ArchitectureName(Architecture a);  // the HF class name, e.g. "LlamaForCausalLM"

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;        // query heads
  int num_kv_heads = 0;     // divides num_heads (GQA)
  int head_dim = 0;         // hidden_size / num_heads unless config.json says otherwise
  int vocab_size = 0;
  int max_position = 0;     // max_position_embeddings
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v have a bias (Qwen2); Llama/Qwen3 attention_bias: q/k/v/o
  bool qk_norm = false;         // per-head RMSNorm of q and k before RoPE (Qwen3)
  kernels::RopeConfig rope;     // rotary_dim == head_dim
  std::vector<int32_t> bos_ids; // from bos_token_id (int or list); may be empty
  std::vector<int32_t> eos_ids; // from eos_token_id (int or list); may be empty
  std::string torch_dtype;      // as written ("bfloat16", ...); informational only
};

// Parses the text of a config.json. `source` names the file in error messages.
// INVALID_ARGUMENT for malformed JSON, missing or inconsistent fields, and unsupported features.
StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source = "config.json");

// Reads and parses `path`. NOT_FOUND when the file does not exist.
StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// Serialises a config as a Hugging Face config.json (used by make-model).
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace icecache::model
