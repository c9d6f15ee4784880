#include "model/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "model/gguf_model.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::model {
namespace {

constexpr kernels::Backend kCpu = kernels::Backend::kCpu;

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Status Bind(const Checkpoint& ckpt, const std::string& name, const std::vector<int64_t>& shape, WeightRef* out) {
  ICE_ASSIGN_OR_RETURN(TensorView v, ckpt.GetWithShape(name, shape));
  out->data = v.data;
  out->dtype = v.info->dtype;
  out->bytes = v.info->end - v.info->begin;
  return Status::Ok();
}

Status Linear(const float* x, int m, const WeightRef& w, const WeightRef* bias, int n, int k, float* y,
              bool accumulate = false) {
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
  return kernels::Matmul(p, kCpu);
}

Status Norm(const float* x, int rows, int dim, const WeightRef& w, float eps, float* y) {
  kernels::RmsNormParams p;
  p.x = x;
  p.weight = w.data;
  p.weight_dtype = w.dtype;
  p.y = y;
  p.rows = rows;
  p.dim = dim;
  p.eps = eps;
  return kernels::RmsNorm(p, kCpu);
}

}  // namespace

Model::~Model() = default;

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  std::string gguf_path;
  ICE_ASSIGN_OR_RETURN(bool is_gguf, ResolveGgufPath(dir, &gguf_path));
  if (is_gguf) {
    ICE_ASSIGN_OR_RETURN(GgufModelParts parts, LoadGgufModel(gguf_path));
    m->config_ = std::move(parts.config);
    m->checkpoint_ = std::move(parts.checkpoint);
    m->tokenizer_ = std::move(parts.tokenizer);
    ICE_RETURN_IF_ERROR(m->BindWeights());
    m->inv_freq_ = kernels::ComputeRopeInvFreq(m->config_.rope);
    return m;
  }
  ICE_ASSIGN_OR_RETURN(m->config_, LoadModelConfig(dir + "/config.json"));
  ICE_ASSIGN_OR_RETURN(m->checkpoint_, Checkpoint::Open(dir));
  ICE_RETURN_IF_ERROR(m->BindWeights());
  m->inv_freq_ = kernels::ComputeRopeInvFreq(m->config_.rope);
  const std::string tok_path = dir + "/tokenizer.json";
  if (FileExists(tok_path)) {
#if ICECACHE_HAVE_TOKENIZER
    ICE_ASSIGN_OR_RETURN(m->tokenizer_, tokenizer::Tokenizer::Load(tok_path));
    if (m->tokenizer_->vocab_size() > m->config_.vocab_size) {
      return InvalidArgumentError(tok_path + ": tokenizer has " + std::to_string(m->tokenizer_->vocab_size()) +
                                  " ids but config.json vocab_size is " + std::to_string(m->config_.vocab_size));
    }
#endif
  }
  return m;
}

Status Model::BindWeights() {
  const ModelConfig& c = config_;
  const Checkpoint& ck = *checkpoint_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  const int64_t QD = c.num_heads * D, KD = c.num_kv_heads * D;
  ICE_RETURN_IF_ERROR(Bind(ck, "model.embed_tokens.weight", {V, H}, &embed_));
  ICE_RETURN_IF_ERROR(Bind(ck, "model.norm.weight", {H}, &final_norm_));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    ICE_RETURN_IF_ERROR(Bind(ck, "lm_head.weight", {V, H}, &lm_head_));
  }
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& w = layers_[l];
    ICE_RETURN_IF_ERROR(Bind(ck, p + "input_layernorm.weight", {H}, &w.input_norm));
    ICE_RETURN_IF_ERROR(Bind(ck, p + "post_attention_layernorm.weight", {H}, &w.post_attention_norm));
    ICE_RETURN_IF_ERROR(Bind(ck, p + "self_attn.q_proj.weight", {QD, H}, &w.q_proj));
    ICE_RETURN_IF_ERROR(Bind(ck, p + "self_attn.k_proj.weight", {KD, H}, &w.k_proj));
    ICE_RETURN_IF_ERROR(Bind(ck, p + "self_attn.v_proj.weight", {KD, H}, &w.v_proj));
    ICE_RETURN_IF_ERROR(Bind(ck, p + "self_attn.o_proj.weight", {H, QD}, &w.o_proj));
    if (c.attention_bias) {
      ICE_RETURN_IF_ERROR(Bind(ck, p + "self_attn.q_proj.bias", {QD}, &w.q_bias));
      ICE_RETURN_IF_ERROR(Bind(ck, p + "self_attn.k_proj.bias", {KD}, &w.k_bias));
      ICE_RETURN_IF_ERROR(Bind(ck, p + "self_attn.v_proj.bias", {KD}, &w.v_bias));
      if (c.arch != Architecture::kQwen2) {  // Llama/Qwen3 attention_bias also covers o_proj
        ICE_RETURN_IF_ERROR(Bind(ck, p + "self_attn.o_proj.bias", {H}, &w.o_bias));
      }
    }
    if (c.qk_norm) {
      ICE_RETURN_IF_ERROR(Bind(ck, p + "self_attn.q_norm.weight", {D}, &w.q_norm));
      ICE_RETURN_IF_ERROR(Bind(ck, p + "self_attn.k_norm.weight", {D}, &w.k_norm));
    }
    ICE_RETURN_IF_ERROR(Bind(ck, p + "mlp.gate_proj.weight", {I, H}, &w.gate_proj));
    ICE_RETURN_IF_ERROR(Bind(ck, p + "mlp.up_proj.weight", {I, H}, &w.up_proj));
    ICE_RETURN_IF_ERROR(Bind(ck, p + "mlp.down_proj.weight", {H, I}, &w.down_proj));
  }
  return Status::Ok();
}

AttentionShape Model::attention_shape() const {
  AttentionShape s;
  s.num_layers = config_.num_layers;
  s.num_q_heads = config_.num_heads;
  s.num_kv_heads = config_.num_kv_heads;
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
  const ModelConfig& c = config_;
  if (inputs.empty()) return InvalidArgumentError("Forward: no input sequences");
  const AttentionShape want = attention_shape();
  const AttentionShape& have = backend.shape();
  if (have.num_layers != want.num_layers || have.num_q_heads != want.num_q_heads ||
      have.num_kv_heads != want.num_kv_heads || have.head_dim != want.head_dim) {
    return InvalidArgumentError("Forward: attention backend shape does not match the model");
  }
  int total = 0;
  ids_.clear();
  positions_.clear();
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
  }
  ICE_RETURN_IF_ERROR(backend.BeginStep(segments));
  Status st = RunLayers(backend, total);
  backend.EndStep(st.ok());
  ICE_RETURN_IF_ERROR(st);

  // Final norm and lm_head on the rows that need logits.
  const int H = c.hidden_size;
  int rows = total;
  const float* src = x_.data();
  if (mode == LogitsMode::kLastToken) {
    rows = static_cast<int>(inputs.size());
    sel_.resize(static_cast<size_t>(rows) * H);
    int end = 0;
    for (int r = 0; r < rows; ++r) {
      end += static_cast<int>(inputs[r].tokens.size());
      std::copy_n(x_.data() + static_cast<size_t>(end - 1) * H, H, sel_.data() + static_cast<size_t>(r) * H);
    }
    src = sel_.data();
  }
  h_.resize(static_cast<size_t>(rows) * H);
  ICE_RETURN_IF_ERROR(Norm(src, rows, H, final_norm_, c.rms_norm_eps, h_.data()));
  logits->resize(static_cast<size_t>(rows) * c.vocab_size);
  return Linear(h_.data(), rows, lm_head_, nullptr, c.vocab_size, H, logits->data());
}

Status Model::RunLayers(AttentionBackend& backend, int T) {
  const ModelConfig& c = config_;
  const int H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int QD = c.num_heads * D, KD = c.num_kv_heads * D;
  const size_t t = static_cast<size_t>(T);
  x_.resize(t * H);
  h_.resize(t * H);
  q_.resize(t * QD);
  k_.resize(t * KD);
  v_.resize(t * KD);
  attn_.resize(t * QD);
  gate_.resize(t * I);
  up_.resize(t * I);

  kernels::EmbeddingParams ep;
  ep.ids = ids_.data();
  ep.table = embed_.data;
  ep.table_dtype = embed_.dtype;
  ep.out = x_.data();
  ep.n = T;
  ep.vocab = c.vocab_size;
  ep.dim = H;
  ICE_RETURN_IF_ERROR(kernels::Embedding(ep, kCpu));

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = layers_[l];
    ICE_RETURN_IF_ERROR(Norm(x_.data(), T, H, w.input_norm, c.rms_norm_eps, h_.data()));
    ICE_RETURN_IF_ERROR(Linear(h_.data(), T, w.q_proj, &w.q_bias, QD, H, q_.data()));
    ICE_RETURN_IF_ERROR(Linear(h_.data(), T, w.k_proj, &w.k_bias, KD, H, k_.data()));
    ICE_RETURN_IF_ERROR(Linear(h_.data(), T, w.v_proj, &w.v_bias, KD, H, v_.data()));
    if (c.qk_norm) {
      ICE_RETURN_IF_ERROR(Norm(q_.data(), T * c.num_heads, D, w.q_norm, c.rms_norm_eps, q_.data()));
      ICE_RETURN_IF_ERROR(Norm(k_.data(), T * c.num_kv_heads, D, w.k_norm, c.rms_norm_eps, k_.data()));
    }
    kernels::RopeParams rp;
    rp.positions = positions_.data();
    rp.inv_freq = inv_freq_.data();
    rp.tokens = T;
    rp.head_dim = D;
    rp.rotary_dim = D;
    rp.x = q_.data();
    rp.heads = c.num_heads;
    ICE_RETURN_IF_ERROR(kernels::ApplyRope(rp, kCpu));
    rp.x = k_.data();
    rp.heads = c.num_kv_heads;
    ICE_RETURN_IF_ERROR(kernels::ApplyRope(rp, kCpu));
    ICE_RETURN_IF_ERROR(backend.Attend(l, q_.data(), k_.data(), v_.data(), attn_.data()));
    ICE_RETURN_IF_ERROR(Linear(attn_.data(), T, w.o_proj, &w.o_bias, H, QD, x_.data(), /*accumulate=*/true));

    ICE_RETURN_IF_ERROR(Norm(x_.data(), T, H, w.post_attention_norm, c.rms_norm_eps, h_.data()));
    ICE_RETURN_IF_ERROR(Linear(h_.data(), T, w.gate_proj, nullptr, I, H, gate_.data()));
    ICE_RETURN_IF_ERROR(Linear(h_.data(), T, w.up_proj, nullptr, I, H, up_.data()));
    kernels::SwiGluParams sp;
    sp.gate = gate_.data();
    sp.up = up_.data();
    sp.out = gate_.data();
    sp.n = static_cast<long>(t) * I;
    ICE_RETURN_IF_ERROR(kernels::SwiGlu(sp, kCpu));
    ICE_RETURN_IF_ERROR(Linear(gate_.data(), T, w.down_proj, nullptr, H, I, x_.data(), /*accumulate=*/true));
  }
  return Status::Ok();
}

}  // namespace icecache::model
