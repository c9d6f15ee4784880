// A Llama-family decoder (model/config.h lists the architectures) loaded from a Hugging Face
// model directory, and its forward pass.
//
// Weights stay memory-mapped in their stored dtype (bf16/f16/f32); the kernels convert on the
// fly. Activations are fp32. Attention is delegated to an AttentionBackend
// (model/attention_backend.h), so the same model serves dense and sparse (IceCache) KV caches.
//
// Thread safety: Load()ed models are immutable except for the forward scratch buffers, so
// Forward must not run concurrently on one Model (one engine thread drives it); the const
// accessors may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/dtype.h"
#include "model/attention_backend.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace icecache::tokenizer {
class Tokenizer;
}

namespace icecache::model {

// A weight tensor inside the mapped checkpoint (or nullptr data when absent and optional).
struct WeightRef {
  const void* data = nullptr;
  kernels::DType dtype = kernels::DType::kF32;
  size_t bytes = 0;
};

struct LayerWeights {
  WeightRef input_norm, q_proj, k_proj, v_proj, o_proj, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm;
  WeightRef post_attention_norm, gate_proj, up_proj, down_proj;
};

enum class LogitsMode {
  kLastToken,  // one row per input sequence: the logits after its last new token
  kAllTokens,  // one row per new token, in input order
};

// New tokens of one sequence for one forward step.
struct SequenceInput {
  SequenceId seq_id = 0;
  std::span<const int32_t> tokens;  // >= 1 token
};

class Model {
 public:
  // Loads DIR/config.json and the safetensors weights (model.safetensors or sharded via
  // model.safetensors.index.json), and DIR/tokenizer.json if present. `dir` may also be a GGUF
  // file (FILE.gguf) or a directory without config.json holding one: config, weights (dequantised
  // at load, model/gguf_model.h) and tokenizer then come from the file. Errors name the file and
  // the problem: missing tensors, wrong shapes, unsupported architecture or dtype.
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& dir);
  ~Model();

  const ModelConfig& config() const { return config_; }
  AttentionShape attention_shape() const;
  // nullptr when the directory has no tokenizer.json (the model then serves token ids only).
  const tokenizer::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const std::string& dir() const { return dir_; }

  // Bytes of weights read to decode one token (all layers + final norm + lm_head; the embedding
  // row read is negligible and not counted).
  int64_t decode_weight_bytes() const;

  // One forward step over `inputs` (each sequence at most once; each must exist in `backend`,
  // whose shape matches attention_shape()). Token positions continue from
  // backend.SequenceLength(seq_id). Writes logits [rows, vocab_size] (rows per `mode`) and
  // commits the tokens to the backend. On error the backend is unchanged.
  // OUT_OF_RANGE for a token id outside [0, vocab_size) or a position past max_position.
  Status Forward(std::span<const SequenceInput> inputs, AttentionBackend& backend, LogitsMode mode,
                 std::vector<float>* logits);

 private:
  Model() = default;
  Status BindWeights();
  // Embedding and all decoder layers over the step rows in ids_/positions_; result in x_.
  Status RunLayers(AttentionBackend& backend, int total);

  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  WeightRef embed_, final_norm_, lm_head_;
  std::vector<LayerWeights> layers_;
  std::vector<float> inv_freq_;

  // Forward scratch.
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_, sel_;
  std::vector<int> positions_;
  std::vector<int32_t> ids_;
};

}  // namespace icecache::model
