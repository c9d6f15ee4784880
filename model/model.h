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
#include "model/language_model.h"
#include "model/safetensors.h"
#include "model/shard_plan.h"

namespace icecache::parallel {
class Communicator;
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

// Megatron-style tensor parallelism (docs/parallel.md): this Model is rank `rank` of `size`.
// It holds q heads [rank * H/size, ...) with their k/v heads (ShardPlan, model/shard_plan.h),
// the gate/up rows and down columns [rank * I/size, ...) of the MLP, and the o_proj columns of
// its heads; embedding, norms and lm_head are replicated. After o_proj and after down_proj the
// ranks all-reduce (sum) the hidden state, so every rank ends a layer with the same x and the
// same logits. All `size` ranks must run Forward with the same inputs at the same time, each
// on its own thread and its own AttentionBackend (of attention_shape(): the local heads).
struct TensorParallelOptions {
  int rank = 0;
  int size = 1;
  // Not owned; must outlive the Model. Required when size > 1; its rank, size and device must be
  // this rank's.
  parallel::Communicator* communicator = nullptr;
};

// How a GGUF file's Q8_0 / Q4_0 / Q4_1 weights are held (model/gguf_model.h).
enum class GgufWeights : int {
  // In their blocks where the kernels multiply them (the CPU, without tensor parallelism: the
  // quantised GEMV of kernels/matmul.h, x rounded to int8 per block as llama.cpp rounds it);
  // dequantised to bf16 elsewhere (CUDA, tensor-parallel ranks).
  kKeep = 0,
  // Dequantised to bf16 at load everywhere (the exact products of bf16 weights; 1.7-3.2x the
  // memory and the bytes read per decoded token).
  kBf16 = 1,
};
std::string_view GgufWeightsName(GgufWeights w);  // "keep", "bf16"
// GgufWeightsName's inverse; INVALID_ARGUMENT naming the accepted names otherwise.
StatusOr<GgufWeights> ParseGgufWeights(std::string_view name);

struct ModelLoadOptions {
  kernels::Device device;  // where weights live and ops run (auto: a CUDA device when present)
  TensorParallelOptions tensor_parallel;
  GgufWeights gguf_weights = GgufWeights::kKeep;
};

class Model final : public LanguageModel {
 public:
  // Loads DIR/config.json and the safetensors weights (model.safetensors or sharded via
  // model.safetensors.index.json), and DIR/tokenizer.json if present, and uploads the weights to
  // options.device. `dir` may also be a GGUF file (FILE.gguf) or a directory without config.json
  // holding one: config, weights (dequantised at load, model/gguf_model.h) and tokenizer then come
  // from the file. Errors name the file and the problem: missing tensors, wrong shapes,
  // unsupported architecture or dtype; FAILED_PRECONDITION / INVALID_ARGUMENT for a device that
  // is unavailable or does not exist; RESOURCE_EXHAUSTED when the weights do not fit;
  // INVALID_ARGUMENT for tensor_parallel options that do not fit the model (ShardPlan) or a
  // communicator of another rank, size or device. A rank copies only its slices of the weights
  // (on the CPU the column-parallel ones are views of the mapped checkpoint, the row-parallel
  // ones copies of their columns).
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& dir, const ModelLoadOptions& options = {});
  ~Model();

  // The whole model's config (a tensor-parallel rank too; its share is shard()).
  const ModelConfig& config() const override { return config_; }
  // The shape of this rank's attention: its local q and kv heads (all heads when size is 1).
  AttentionShape attention_shape() const;
  const ShardPlan& shard() const { return shard_; }
  // nullptr when the directory has no tokenizer.json (the model then serves token ids only).
  const tokenizer::Tokenizer* tokenizer() const override { return tokenizer_.get(); }
  const std::string& dir() const { return dir_; }
  // The resolved device (never auto).
  kernels::Device device() const override { return device_; }
  // Bytes of weights held in device memory (on the CPU only the copied row-parallel slices of a
  // tensor-parallel rank; otherwise the CPU reads the mapped checkpoint).
  int64_t device_weight_bytes() const { return device_weight_bytes_; }

  // Bytes of weights read to decode one token (all layers + final norm + lm_head; the embedding
  // row read is negligible and not counted); this rank's share under tensor parallelism.
  int64_t decode_weight_bytes() const;

  // One forward step over `inputs` (each sequence at most once; each must exist in `backend`,
  // whose shape matches attention_shape() and whose device is this model's). Token positions
  // continue from backend.SequenceLength(seq_id). Leaves logits [rows, vocab_size] (rows per
  // `mode`) in device memory at logits() and commits the tokens to the backend. On error the
  // backend is unchanged. OUT_OF_RANGE for a token id outside [0, vocab_size) or a position past
  // max_position; INVALID_ARGUMENT for a backend of another shape or device. Under tensor
  // parallelism every rank returns an error when any rank fails before the layers run (inputs,
  // backend), and the group stays usable; a failure inside the layers aborts the communicator
  // group (parallel::Communicator::Abort) so that no rank waits forever.
  Status Forward(std::span<const SequenceInput> inputs, AttentionBackend& backend, LogitsMode mode) override;
  // Forward, then the logits copied to host memory (tools, tests and benchmarks that read them).
  Status Forward(std::span<const SequenceInput> inputs, AttentionBackend& backend, LogitsMode mode,
                 std::vector<float>* logits);
  // The last Forward's logits, [logits_rows(), vocab_size] in device memory; valid until the
  // next Forward.
  const float* logits() const override { return logits_.as<const float>(); }
  int logits_rows() const { return logits_rows_; }

  // Seconds this rank spent in collectives (all-reduce calls, including the wait for the other
  // ranks) since Load; 0 without tensor parallelism. On CUDA a collective is queued on the stream,
  // so this counts the queueing only.
  double collective_seconds() const { return collective_seconds_; }
  // Wall seconds this rank spent in Forward (its whole step, collectives included) since Load.
  double forward_seconds() const { return forward_seconds_; }
  // True once a failure inside the layers made this rank abort its communicator group (the group
  // is unusable from then on: parallel::Communicator::Abort).
  bool aborted_group() const { return aborted_group_; }

 private:
  Model() = default;
  Status BindWeights();
  // Embedding and all decoder layers over the step rows in ids_/positions_; result in x_.
  Status RunLayers(AttentionBackend& backend, int total);

  // A checkpoint tensor uploaded to the device (the buffer kept in weights_).
  Status Bind(const std::string& name, const std::vector<int64_t>& shape, WeightRef* out);
  // Rows [row0, row0 + rows) of a tensor of `shape` (dim 0 split; 1-D biases too): a contiguous
  // range of the stored tensor.
  Status BindRows(const std::string& name, const std::vector<int64_t>& shape, int64_t row0, int64_t rows,
                  WeightRef* out);
  // Columns [col0, col0 + cols) of a [rows, cols_total] tensor, copied row by row.
  Status BindCols(const std::string& name, const std::vector<int64_t>& shape, int64_t col0, int64_t cols,
                  WeightRef* out);
  // In-place all-reduce (sum) of `count` floats across the tensor-parallel ranks.
  Status AllReduce(float* x, size_t count);
  // Under tensor parallelism: OK on every rank only if `local` is OK on every rank.
  Status AgreeAcrossRanks(const Status& local);
  // Device scratch of `count` floats.
  Status Scratch(kernels::DeviceBuffer* buf, size_t count);

  std::string dir_;
  kernels::Device device_;
  ModelConfig config_;
  ShardPlan shard_;
  parallel::Communicator* comm_ = nullptr;  // set when shard_.size > 1
  double collective_seconds_ = 0;
  double forward_seconds_ = 0;
  bool aborted_group_ = false;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::vector<kernels::DeviceBuffer> weights_;
  int64_t device_weight_bytes_ = 0;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  WeightRef embed_, final_norm_, lm_head_;
  std::vector<LayerWeights> layers_;
  kernels::DeviceBuffer inv_freq_;  // [head_dim / 2]

  // Forward scratch (device memory) and the step's host-side ids.
  kernels::DeviceBuffer x_, h_, q_, k_, v_, attn_, gate_, up_, sel_, logits_;
  kernels::DeviceBuffer ids_dev_, positions_dev_, last_rows_dev_, agree_dev_;
  int logits_rows_ = 0;
  std::vector<int> positions_;
  std::vector<int32_t> ids_, last_rows_;
};

}  // namespace icecache::model
