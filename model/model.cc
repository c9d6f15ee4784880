#include "model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "model/gguf_model.h"
#include "model/model_info.h"
#include "model/tokenizer/tokenizer.h"
#include "parallel/communicator.h"

namespace icecache::model {
namespace {

kernels::MatmulParams LinearParams(kernels::Backend be, const float* x, int m, const WeightRef& w, const WeightRef* bias,
                                   int n, int k, float* y, bool accumulate = false) {
  kernels::MatmulParams p;
  p.x = x;
  p.w = w.data;
  p.w_dtype = w.dtype;
  if (bias != nullptr && bias->data != nullptr) {
    p.bias = bias->data;
    p.bias_dtype = bias->dtype;
  }
  p.y = y;
  p.m = m;
  p.n = n;
  p.k = k;
  p.accumulate = accumulate;
  p.bf16_activations = be == kernels::Backend::kCpu && kernels::UseBf16Activations();
  if (kernels::IsBlockQuantized(w.dtype)) p.quant_activations = kernels::BlockActivations();
  return p;
}

Status Linear(kernels::Backend be, const float* x, int m, const WeightRef& w, const WeightRef* bias, int n, int k,
              float* y, bool accumulate = false) {
  return kernels::Matmul(LinearParams(be, x, m, w, bias, n, k, y, accumulate), be);
}

Status Norm(kernels::Backend be, const float* x, int rows, int dim, const WeightRef& w, float eps, float* y) {
  kernels::RmsNormParams p;
  p.x = x;
  p.weight = w.data;
  p.weight_dtype = w.dtype;
  p.y = y;
  p.rows = rows;
  p.dim = dim;
  p.eps = eps;
  return kernels::RmsNorm(p, be);
}

}  // namespace

std::string_view GgufWeightsName(GgufWeights w) { return w == GgufWeights::kBf16 ? "bf16" : "keep"; }

StatusOr<GgufWeights> ParseGgufWeights(std::string_view name) {
  for (GgufWeights w : {GgufWeights::kKeep, GgufWeights::kBf16}) {
    if (name == GgufWeightsName(w)) return w;
  }
  return InvalidArgumentError("GGUF weights must be 'keep' (quantised blocks kept where the kernels take them) or "
                              "'bf16' (dequantised at load), got '" + std::string(name) + "'");
}

Model::~Model() = default;

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, const ModelLoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->device_ = kernels::ResolveDevice(options.device);
  ICE_RETURN_IF_ERROR(kernels::UseDevice(m->device_));
  std::string gguf_path;
  ICE_ASSIGN_OR_RETURN(bool is_gguf, ResolveGgufPath(dir, &gguf_path));
  if (is_gguf) {
    GgufLoadOptions go;  // a rank dequantises only its slices
    go.tp_rank = options.tensor_parallel.rank;
    go.tp_size = options.tensor_parallel.size;
    go.keep_blocks = options.gguf_weights == GgufWeights::kKeep && m->device_.backend == kernels::Backend::kCpu;
    ICE_ASSIGN_OR_RETURN(GgufModelParts parts, LoadGgufModel(gguf_path, go));
    m->config_ = std::move(parts.config);
    m->checkpoint_ = std::move(parts.checkpoint);
    m->tokenizer_ = std::move(parts.tokenizer);
  } else {
    ICE_ASSIGN_OR_RETURN(ModelInfo info, LoadModelInfo(dir));  // config.json, tokenizer.json if present
    m->config_ = std::move(info.config);
    m->tokenizer_ = std::move(info.tokenizer);
    ICE_ASSIGN_OR_RETURN(m->checkpoint_, Checkpoint::Open(dir));
  }
  const TensorParallelOptions& tp = options.tensor_parallel;
  ICE_ASSIGN_OR_RETURN(m->shard_, PlanShard(m->config_, tp.rank, tp.size));
  if (tp.size > 1) {
    if (tp.communicator == nullptr) {
      return InvalidArgumentError("tensor_parallel.size " + std::to_string(tp.size) + " needs a communicator");
    }
    const parallel::Communicator& comm = *tp.communicator;
    if (comm.rank() != tp.rank || comm.size() != tp.size || !(comm.device() == m->device_)) {
      return InvalidArgumentError("tensor_parallel: the communicator is rank " + std::to_string(comm.rank()) + " of " +
                                  std::to_string(comm.size()) + " on " + kernels::DeviceName(comm.device()) +
                                  ", the model rank " + std::to_string(tp.rank) + " of " + std::to_string(tp.size) +
                                  " on " + kernels::DeviceName(m->device_));
    }
    m->comm_ = tp.communicator;
  }
  ICE_RETURN_IF_ERROR(m->BindWeights());
  const std::vector<float> inv_freq = kernels::ComputeRopeInvFreq(m->config_.rope);
  ICE_RETURN_IF_ERROR(m->Scratch(&m->inv_freq_, inv_freq.size()));
  ICE_RETURN_IF_ERROR(m->inv_freq_.CopyFromHost(inv_freq.data(), inv_freq.size() * sizeof(float)));
  return m;
}

Status Model::Bind(const std::string& name, const std::vector<int64_t>& shape, WeightRef* out) {
  ICE_ASSIGN_OR_RETURN(TensorView v, checkpoint_->GetWithShape(name, shape));
  const size_t bytes = v.info->end - v.info->begin;
  ICE_ASSIGN_OR_RETURN(kernels::DeviceBuffer buf, kernels::DeviceBuffer::Upload(device_.backend, v.data, bytes));
  if (buf.data() != v.data) device_weight_bytes_ += static_cast<int64_t>(bytes);
  out->data = buf.data();
  out->dtype = v.info->dtype;
  out->bytes = bytes;
  weights_.push_back(std::move(buf));
  return Status::Ok();
}

Status Model::BindRows(const std::string& name, const std::vector<int64_t>& shape, int64_t row0, int64_t rows,
                       WeightRef* out) {
  if (row0 == 0 && rows == shape[0]) return Bind(name, shape, out);
  ICE_ASSIGN_OR_RETURN(TensorView v, checkpoint_->GetWithShape(name, shape));
  const size_t row_bytes = (v.info->end - v.info->begin) / static_cast<size_t>(shape[0]);
  const auto* data = static_cast<const unsigned char*>(v.data) + static_cast<size_t>(row0) * row_bytes;
  const size_t bytes = static_cast<size_t>(rows) * row_bytes;
  ICE_ASSIGN_OR_RETURN(kernels::DeviceBuffer buf, kernels::DeviceBuffer::Upload(device_.backend, data, bytes));
  if (buf.data() != data) device_weight_bytes_ += static_cast<int64_t>(bytes);
  out->data = buf.data();
  out->dtype = v.info->dtype;
  out->bytes = bytes;
  weights_.push_back(std::move(buf));
  return Status::Ok();
}

Status Model::BindCols(const std::string& name, const std::vector<int64_t>& shape, int64_t col0, int64_t cols,
                       WeightRef* out) {
  if (col0 == 0 && cols == shape[1]) return Bind(name, shape, out);
  ICE_ASSIGN_OR_RETURN(TensorView v, checkpoint_->GetWithShape(name, shape));
  if (kernels::IsBlockQuantized(v.info->dtype)) {
    return InvalidArgumentError(*v.file + ": tensor '" + name + "' is " + std::string(kernels::DTypeName(v.info->dtype)) +
                                "; its columns cannot be sliced (load it dequantised)");
  }
  const size_t es = kernels::DTypeSize(v.info->dtype);
  const size_t rows = static_cast<size_t>(shape[0]), total = static_cast<size_t>(shape[1]);
  const size_t part = static_cast<size_t>(cols) * es;
  std::vector<unsigned char> host(rows * part);
  const auto* src = static_cast<const unsigned char*>(v.data);
  for (size_t r = 0; r < rows; ++r) std::memcpy(host.data() + r * part, src + (r * total + col0) * es, part);
  ICE_ASSIGN_OR_RETURN(kernels::DeviceBuffer buf, kernels::DeviceBuffer::Allocate(device_.backend, host.size()));
  ICE_RETURN_IF_ERROR(buf.CopyFromHost(host.data(), host.size()));
  device_weight_bytes_ += static_cast<int64_t>(host.size());
  out->data = buf.data();
  out->dtype = v.info->dtype;
  out->bytes = host.size();
  weights_.push_back(std::move(buf));
  return Status::Ok();
}

Status Model::AllReduce(float* x, size_t count) {
  if (comm_ == nullptr) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  Status st = comm_->AllReduceSum(x, count, kernels::DType::kF32);
  collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

Status Model::AgreeAcrossRanks(const Status& local) {
  if (comm_ == nullptr) return local;
  // Each rank adds 1 when it failed; the count is read back on the host.
  const float failed = local.ok() ? 0.f : 1.f;
  ICE_RETURN_IF_ERROR(Scratch(&agree_dev_, 1));
  ICE_RETURN_IF_ERROR(agree_dev_.CopyFromHost(&failed, sizeof(float)));
  ICE_RETURN_IF_ERROR(AllReduce(agree_dev_.as<float>(), 1));
  float total = 0;
  ICE_RETURN_IF_ERROR(agree_dev_.CopyToHost(&total, sizeof(float)));
  if (!local.ok()) return local;
  if (total > 0) {
    return AbortedError(std::to_string(static_cast<int>(total)) + " other tensor-parallel rank(s) failed this step");
  }
  return Status::Ok();
}

Status Model::Scratch(kernels::DeviceBuffer* buf, size_t count) {
  return kernels::DeviceBuffer::Reserve(device_.backend, count * sizeof(float), buf);
}

Status Model::BindWeights() {
  const ModelConfig& c = config_;
  const ShardPlan& sp = shard_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  const int64_t QD = c.num_heads * D, KD = c.num_kv_heads * D;
  // This rank's rows of q (and k/v) projections and biases, columns of o_proj; MLP likewise.
  const int64_t q0 = sp.q_head0 * D, qn = sp.q_heads * D, k0 = sp.kv_head0 * D, kn = sp.kv_heads * D;
  const int64_t i0 = sp.inter0, in = sp.inter;
  ICE_RETURN_IF_ERROR(Bind("model.embed_tokens.weight", {V, H}, &embed_));
  ICE_RETURN_IF_ERROR(Bind("model.norm.weight", {H}, &final_norm_));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    ICE_RETURN_IF_ERROR(Bind("lm_head.weight", {V, H}, &lm_head_));
  }
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& w = layers_[l];
    ICE_RETURN_IF_ERROR(Bind(p + "input_layernorm.weight", {H}, &w.input_norm));
    ICE_RETURN_IF_ERROR(Bind(p + "post_attention_layernorm.weight", {H}, &w.post_attention_norm));
    ICE_RETURN_IF_ERROR(BindRows(p + "self_attn.q_proj.weight", {QD, H}, q0, qn, &w.q_proj));
    ICE_RETURN_IF_ERROR(BindRows(p + "self_attn.k_proj.weight", {KD, H}, k0, kn, &w.k_proj));
    ICE_RETURN_IF_ERROR(BindRows(p + "self_attn.v_proj.weight", {KD, H}, k0, kn, &w.v_proj));
    ICE_RETURN_IF_ERROR(BindCols(p + "self_attn.o_proj.weight", {H, QD}, q0, qn, &w.o_proj));
    if (c.attention_bias) {
      ICE_RETURN_IF_ERROR(BindRows(p + "self_attn.q_proj.bias", {QD}, q0, qn, &w.q_bias));
      ICE_RETURN_IF_ERROR(BindRows(p + "self_attn.k_proj.bias", {KD}, k0, kn, &w.k_bias));
      ICE_RETURN_IF_ERROR(BindRows(p + "self_attn.v_proj.bias", {KD}, k0, kn, &w.v_bias));
      // Llama/Qwen3 attention_bias also covers o_proj; its bias is added once, by rank 0.
      if (c.arch != Architecture::kQwen2 && sp.rank == 0) {
        ICE_RETURN_IF_ERROR(Bind(p + "self_attn.o_proj.bias", {H}, &w.o_bias));
      }
    }
    if (c.qk_norm) {  // one [head_dim] weight shared by all heads: replicated
      ICE_RETURN_IF_ERROR(Bind(p + "self_attn.q_norm.weight", {D}, &w.q_norm));
      ICE_RETURN_IF_ERROR(Bind(p + "self_attn.k_norm.weight", {D}, &w.k_norm));
    }
    ICE_RETURN_IF_ERROR(BindRows(p + "mlp.gate_proj.weight", {I, H}, i0, in, &w.gate_proj));
    ICE_RETURN_IF_ERROR(BindRows(p + "mlp.up_proj.weight", {I, H}, i0, in, &w.up_proj));
    ICE_RETURN_IF_ERROR(BindCols(p + "mlp.down_proj.weight", {H, I}, i0, in, &w.down_proj));
  }
  return Status::Ok();
}

AttentionShape Model::attention_shape() const {
  AttentionShape s;
  s.num_layers = config_.num_layers;
  s.num_q_heads = shard_.q_heads;
  s.num_kv_heads = shard_.kv_heads;
  s.head_dim = config_.head_dim;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(config_.head_dim)));
  return s;
}

int64_t Model::decode_weight_bytes() const {
  int64_t total = static_cast<int64_t>(final_norm_.bytes + lm_head_.bytes);
  for (const LayerWeights& w : layers_) {
    for (const WeightRef* r : {&w.input_norm, &w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.q_bias, &w.k_bias,
                               &w.v_bias, &w.o_bias, &w.q_norm, &w.k_norm, &w.post_attention_norm, &w.gate_proj, &w.up_proj,
                               &w.down_proj}) {
      total += static_cast<int64_t>(r->bytes);
    }
  }
  return total;
}

Status Model::Forward(std::span<const SequenceInput> inputs, AttentionBackend& backend, LogitsMode mode,
                      std::vector<float>* logits) {
  ICE_RETURN_IF_ERROR(Forward(inputs, backend, mode));
  logits->resize(static_cast<size_t>(logits_rows_) * config_.vocab_size);
  return logits_.CopyToHost(logits->data(), logits->size() * sizeof(float));
}

Status Model::Forward(std::span<const SequenceInput> inputs, AttentionBackend& backend, LogitsMode mode) {
  struct Timed {
    double* total;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~Timed() { *total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  } timed{&forward_seconds_};
  const ModelConfig& c = config_;
  int total = 0;
  bool began = false;
  // Everything before the layers; under tensor parallelism the ranks then agree on the outcome,
  // so that no rank enters a collective that another will not.
  Status prep = [&]() -> Status {
    if (inputs.empty()) return InvalidArgumentError("Forward: no input sequences");
    const AttentionShape want = attention_shape();
    const AttentionShape& have = backend.shape();
    if (have.num_layers != want.num_layers || have.num_q_heads != want.num_q_heads ||
        have.num_kv_heads != want.num_kv_heads || have.head_dim != want.head_dim) {
      return InvalidArgumentError("Forward: attention backend shape does not match the model" +
                                  std::string(shard_.size > 1 ? " (a tensor-parallel rank's local heads)" : ""));
    }
    if (!(backend.device() == device_)) {
      return InvalidArgumentError("Forward: the attention backend is on " + kernels::DeviceName(backend.device()) +
                                  ", the model on " + kernels::DeviceName(device_));
    }
    ICE_RETURN_IF_ERROR(kernels::UseDevice(device_));
    ids_.clear();
    positions_.clear();
    last_rows_.clear();
    std::vector<StepSegment> segments;
    segments.reserve(inputs.size());
    for (const SequenceInput& in : inputs) {
      if (in.tokens.empty()) return InvalidArgumentError("Forward: sequence " + std::to_string(in.seq_id) + " has no tokens");
      ICE_ASSIGN_OR_RETURN(int start, backend.SequenceLength(in.seq_id));
      if (start + static_cast<int64_t>(in.tokens.size()) > c.max_position) {
        return OutOfRangeError("sequence " + std::to_string(in.seq_id) + " would reach position " +
                               std::to_string(start + in.tokens.size() - 1) + ", past max_position_embeddings " +
                               std::to_string(c.max_position));
      }
      for (size_t i = 0; i < in.tokens.size(); ++i) {
        const int32_t id = in.tokens[i];
        if (id < 0 || id >= c.vocab_size) {
          return OutOfRangeError("token id " + std::to_string(id) + " (input position " + std::to_string(i) +
                                 ") is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
        }
        ids_.push_back(id);
        positions_.push_back(start + static_cast<int>(i));
      }
      segments.push_back({in.seq_id, static_cast<int>(in.tokens.size())});
      total += static_cast<int>(in.tokens.size());
      last_rows_.push_back(total - 1);
    }
    const size_t n = static_cast<size_t>(total);
    ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(device_.backend, n * sizeof(int32_t), &ids_dev_));
    ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(device_.backend, n * sizeof(int), &positions_dev_));
    ICE_RETURN_IF_ERROR(ids_dev_.CopyFromHost(ids_.data(), n * sizeof(int32_t)));
    ICE_RETURN_IF_ERROR(positions_dev_.CopyFromHost(positions_.data(), n * sizeof(int)));
    ICE_RETURN_IF_ERROR(backend.BeginStep(segments));
    began = true;
    return Status::Ok();
  }();
  prep = AgreeAcrossRanks(prep);
  if (!prep.ok()) {
    if (began) backend.EndStep(false);
    return prep;
  }
  Status st = RunLayers(backend, total);
  backend.EndStep(st.ok());
  if (!st.ok() && comm_ != nullptr) {
    comm_->Abort();  // the other ranks may wait in a collective
    aborted_group_ = true;
  }
  ICE_RETURN_IF_ERROR(st);

  // Final norm and lm_head on the rows that need logits.
  const kernels::Backend be = device_.backend;
  const int H = c.hidden_size;
  int rows = total;
  const float* src = x_.as<float>();
  if (mode == LogitsMode::kLastToken && rows != static_cast<int>(inputs.size())) {
    // Each sequence's last row, gathered on the device (the embedding lookup over x's rows).
    rows = static_cast<int>(inputs.size());
    ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(be, rows * sizeof(int32_t), &last_rows_dev_));
    ICE_RETURN_IF_ERROR(last_rows_dev_.CopyFromHost(last_rows_.data(), rows * sizeof(int32_t)));
    ICE_RETURN_IF_ERROR(Scratch(&sel_, static_cast<size_t>(rows) * H));
    kernels::EmbeddingParams gp;
    gp.ids = last_rows_dev_.as<int32_t>();
    gp.table = x_.data();
    gp.table_dtype = kernels::DType::kF32;
    gp.out = sel_.as<float>();
    gp.n = rows;
    gp.vocab = total;
    gp.dim = H;
    ICE_RETURN_IF_ERROR(kernels::Embedding(gp, be));
    src = sel_.as<float>();
  }
  ICE_RETURN_IF_ERROR(Scratch(&h_, static_cast<size_t>(rows) * H));
  ICE_RETURN_IF_ERROR(Norm(be, src, rows, H, final_norm_, c.rms_norm_eps, h_.as<float>()));
  ICE_RETURN_IF_ERROR(Scratch(&logits_, static_cast<size_t>(rows) * c.vocab_size));
  logits_rows_ = rows;
  return Linear(be, h_.as<float>(), rows, lm_head_, nullptr, c.vocab_size, H, logits_.as<float>());
}

Status Model::RunLayers(AttentionBackend& backend, int T) {
  const ModelConfig& c = config_;
  const kernels::Backend be = device_.backend;
  // This rank's share (everything when shard_.size is 1).
  const int H = c.hidden_size, I = shard_.inter, D = c.head_dim;
  const int QH = shard_.q_heads, KH = shard_.kv_heads;
  const int QD = QH * D, KD = KH * D;
  const bool lead = shard_.rank == 0;  // rank 0 adds the residual (and o_proj's bias) once
  const size_t t = static_cast<size_t>(T);
  ICE_RETURN_IF_ERROR(Scratch(&x_, t * H));
  ICE_RETURN_IF_ERROR(Scratch(&h_, t * H));
  ICE_RETURN_IF_ERROR(Scratch(&q_, t * QD));
  ICE_RETURN_IF_ERROR(Scratch(&k_, t * KD));
  ICE_RETURN_IF_ERROR(Scratch(&v_, t * KD));
  ICE_RETURN_IF_ERROR(Scratch(&attn_, t * QD));
  ICE_RETURN_IF_ERROR(Scratch(&gate_, t * I));
  ICE_RETURN_IF_ERROR(Scratch(&up_, t * I));
  float* x = x_.as<float>();
  float* h = h_.as<float>();
  float* q = q_.as<float>();
  float* k = k_.as<float>();
  float* v = v_.as<float>();
  float* attn = attn_.as<float>();
  float* gate = gate_.as<float>();
  float* up = up_.as<float>();

  kernels::EmbeddingParams ep;
  ep.ids = ids_dev_.as<int32_t>();
  ep.table = embed_.data;
  ep.table_dtype = embed_.dtype;
  ep.out = x;
  ep.n = T;
  ep.vocab = c.vocab_size;
  ep.dim = H;
  ICE_RETURN_IF_ERROR(kernels::Embedding(ep, be));

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = layers_[l];
    ICE_RETURN_IF_ERROR(Norm(be, x, T, H, w.input_norm, c.rms_norm_eps, h));
    // q, k and v of the same input in one call (on the CPU one start of the thread team at decode).
    const kernels::MatmulParams qkv[3] = {LinearParams(be, h, T, w.q_proj, &w.q_bias, QD, H, q),
                                          LinearParams(be, h, T, w.k_proj, &w.k_bias, KD, H, k),
                                          LinearParams(be, h, T, w.v_proj, &w.v_bias, KD, H, v)};
    ICE_RETURN_IF_ERROR(kernels::MatmulGroup(qkv, 3, be));
    if (c.qk_norm) {
      ICE_RETURN_IF_ERROR(Norm(be, q, T * QH, D, w.q_norm, c.rms_norm_eps, q));
      ICE_RETURN_IF_ERROR(Norm(be, k, T * KH, D, w.k_norm, c.rms_norm_eps, k));
    }
    kernels::RopeParams rp;
    rp.positions = positions_dev_.as<int>();
    rp.inv_freq = inv_freq_.as<float>();
    rp.tokens = T;
    rp.head_dim = D;
    rp.rotary_dim = D;
    rp.x = q;
    rp.heads = QH;
    ICE_RETURN_IF_ERROR(kernels::ApplyRope(rp, be));
    rp.x = k;
    rp.heads = KH;
    ICE_RETURN_IF_ERROR(kernels::ApplyRope(rp, be));
    ICE_RETURN_IF_ERROR(backend.Attend(l, q, k, v, attn));
    // Row-parallel o_proj: rank 0 adds its partial sum to the residual, the others write theirs
    // over x; the all-reduce then leaves residual + the full projection on every rank.
    ICE_RETURN_IF_ERROR(Linear(be, attn, T, w.o_proj, &w.o_bias, H, QD, x, /*accumulate=*/lead));
    ICE_RETURN_IF_ERROR(AllReduce(x, t * H));

    ICE_RETURN_IF_ERROR(Norm(be, x, T, H, w.post_attention_norm, c.rms_norm_eps, h));
    const kernels::MatmulParams gate_up[2] = {LinearParams(be, h, T, w.gate_proj, nullptr, I, H, gate),
                                              LinearParams(be, h, T, w.up_proj, nullptr, I, H, up)};
    ICE_RETURN_IF_ERROR(kernels::MatmulGroup(gate_up, 2, be));
    kernels::SwiGluParams sp;
    sp.gate = gate;
    sp.up = up;
    sp.out = gate;
    sp.n = static_cast<long>(t) * I;
    ICE_RETURN_IF_ERROR(kernels::SwiGlu(sp, be));
    ICE_RETURN_IF_ERROR(Linear(be, gate, T, w.down_proj, nullptr, H, I, x, /*accumulate=*/lead));
    ICE_RETURN_IF_ERROR(AllReduce(x, t * H));
  }
  return Status::Ok();
}

}  // namespace icecache::model
