// A Llama-family decoder (model/config.h lists the architectures) loaded from a Hugging Face
// model directory, and its forward pass.
//
// The model runs on one execution device (kernels::Device: cpu, cuda:N, or auto). Weights are
// uploaded to it once, in their stored dtype (bf16/f16/f32; the kernels convert on the fly) — on
// the CPU the upload is the memory-mapped checkpoint itself (no copy). Activations (fp32), token
// ids, positions and logits live in the device's memory, and every op runs there; the CPU device
// is host memory, so the same calls and copies run in every CPU test. Attention is delegated to
// an AttentionBackend (model/attention_backend.h) on the same device, so the same model serves
// dense and sparse (IceCache) KV caches.
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
#include "kernels/backend.h"
#include "kernels/device_buffer.h"
#include "kernels/dtype.h"
#include "model/attention_backend.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace icecache::tokenizer {
class Tokenizer;
}

namespace icecache::model {

// A weight tensor in the device's memory (nullptr data when absent and optional).
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

struct ModelLoadOptions {
  kernels::Device device;  // where weights live and ops run (auto: a CUDA device when present)
};

class Model {
 public:
  // Loads DIR/config.json and the safetensors weights (model.safetensors or sharded via
  // model.safetensors.index.json), and DIR/tokenizer.json if present, and uploads the weights to
  // options.device. `dir` may also be a GGUF file (FILE.gguf) or a directory without config.json
  // holding one: config, weights (dequantised at load, model/gguf_model.h) and tokenizer then come
  // from the file. Errors name the file and the problem: missing tensors, wrong shapes,
  // unsupported architecture or dtype; FAILED_PRECONDITION / INVALID_ARGUMENT for a device that
  // is unavailable or does not exist; RESOURCE_EXHAUSTED when the weights do not fit.
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& dir, const ModelLoadOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  AttentionShape attention_shape() const;
  // nullptr when the directory has no tokenizer.json (the model then serves token ids only).
  const tokenizer::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const std::string& dir() const { return dir_; }
  // The resolved device (never auto).
  kernels::Device device() const { return device_; }
  // Bytes of weights held in device memory (0 on the CPU, which reads the mapped checkpoint).
  int64_t device_weight_bytes() const { return device_weight_bytes_; }

  // Bytes of weights read to decode one token (all layers + final norm + lm_head; the embedding
  // row read is negligible and not counted).
  int64_t decode_weight_bytes() const;

  // One forward step over `inputs` (each sequence at most once; each must exist in `backend`,
  // whose shape matches attention_shape() and whose device is this model's). Token positions
  // continue from backend.SequenceLength(seq_id). Leaves logits [rows, vocab_size] (rows per
  // `mode`) in device memory at logits() and commits the tokens to the backend. On error the
  // backend is unchanged. OUT_OF_RANGE for a token id outside [0, vocab_size) or a position past
  // max_position; INVALID_ARGUMENT for a backend of another shape or device.
  Status Forward(std::span<const SequenceInput> inputs, AttentionBackend& backend, LogitsMode mode);
  // Forward, then the logits copied to host memory (tools, tests and benchmarks that read them).
  Status Forward(std::span<const SequenceInput> inputs, AttentionBackend& backend, LogitsMode mode,
                 std::vector<float>* logits);
  // The last Forward's logits, [logits_rows(), vocab_size] in device memory; valid until the
  // next Forward.
  const float* logits() const { return logits_.as<const float>(); }
  int logits_rows() const { return logits_rows_; }

 private:
  Model() = default;
  Status BindWeights();
  // Embedding and all decoder layers over the step rows in ids_/positions_; result in x_.
  Status RunLayers(AttentionBackend& backend, int total);

  // A checkpoint tensor uploaded to the device (the buffer kept in weights_).
  Status Bind(const std::string& name, const std::vector<int64_t>& shape, WeightRef* out);
  // Device scratch of `count` floats.
  Status Scratch(kernels::DeviceBuffer* buf, size_t count);

  std::string dir_;
  kernels::Device device_;
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::vector<kernels::DeviceBuffer> weights_;
  int64_t device_weight_bytes_ = 0;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  WeightRef embed_, final_norm_, lm_head_;
  std::vector<LayerWeights> layers_;
  kernels::DeviceBuffer inv_freq_;  // [head_dim / 2]

  // Forward scratch (device memory) and the step's host-side ids.
  kernels::DeviceBuffer x_, h_, q_, k_, v_, attn_, gate_, up_, sel_, logits_;
  kernels::DeviceBuffer ids_dev_, positions_dev_, last_rows_dev_;
  int logits_rows_ = 0;
  std::vector<int> positions_;
  std::vector<int32_t> ids_, last_rows_;
};

}  // namespace icecache::model
