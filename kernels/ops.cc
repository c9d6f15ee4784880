// Public op entry points: argument checks shared by every backend, then dispatch through the
// backend's op table.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/op_table.h"

namespace icecache::kernels {

namespace {

Status Invalid(const char* op, const std::string& what) {
  return InvalidArgumentError(std::string(op) + ": " + what);
}

bool ValidDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// A weight tensor's element type with rows of `k` values: plain, or block-quantised with whole
// blocks per row on the CPU.
Status CheckWeightDType(const char* op, DType t, int k, Backend backend) {
  if (ValidDType(t)) return Status::Ok();
  if (!IsBlockQuantized(t)) return Invalid(op, "unknown weight dtype");
  if (k % kQuantBlockValues != 0) {
    return Invalid(op, std::string(DTypeName(t)) + " weights need rows of whole blocks of " +
                           std::to_string(kQuantBlockValues) + " values, got " + std::to_string(k));
  }
  if (backend != Backend::kCpu) {
    return UnimplementedError(std::string(op) + ": " + std::string(DTypeName(t)) +
                              " (block-quantised) weights run on the CPU only; load the model with dequantised "
                              "weights for this device");
  }
  return Status::Ok();
}

// Matmul's checks, errors prefixed with `op`.
Status CheckMatmul(const char* op, const MatmulParams& p, Backend backend) {
  if (p.x == nullptr || p.w == nullptr || p.y == nullptr) return Invalid(op, "null x, w or y");
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) {
    return Invalid(op, "sizes must be positive, got m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) +
                           " k=" + std::to_string(p.k));
  }
  if (!ValidDType(p.bias_dtype)) return Invalid(op, "unknown bias dtype");
  ICE_RETURN_IF_ERROR(CheckWeightDType(op, p.w_dtype, p.k, backend));
  return Status::Ok();
}

}  // namespace

Status Matmul(const MatmulParams& p, Backend backend) {
  ICE_RETURN_IF_ERROR(CheckMatmul("Matmul", p, backend));
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->matmul(p);
}

Status MatmulGroup(const MatmulParams* products, int count, Backend backend) {
  if (products == nullptr || count < 1) return Invalid("MatmulGroup", "needs at least one product");
  for (int i = 0; i < count; ++i) {
    const std::string op = "MatmulGroup product " + std::to_string(i);
    ICE_RETURN_IF_ERROR(CheckMatmul(op.c_str(), products[i], backend));
  }
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->matmul_group(products, count);
}

Status RmsNorm(const RmsNormParams& p, Backend backend) {
  if (p.x == nullptr || p.weight == nullptr || p.y == nullptr) {
    return Invalid("RmsNorm", "null x, weight or y");
  }
  if (p.rows < 0 || p.dim <= 0) return Invalid("RmsNorm", "rows must be >= 0 and dim > 0");
  if (!ValidDType(p.weight_dtype)) return Invalid("RmsNorm", "unknown dtype");
  if (p.rows == 0) return Status::Ok();
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->rms_norm(p);
}

Status ApplyRope(const RopeParams& p, Backend backend) {
  if (p.x == nullptr || p.positions == nullptr || p.inv_freq == nullptr) {
    return Invalid("ApplyRope", "null x, positions or inv_freq");
  }
  if (p.tokens < 0 || p.heads <= 0 || p.head_dim <= 0) {
    return Invalid("ApplyRope", "tokens must be >= 0, heads and head_dim > 0");
  }
  if (p.rotary_dim <= 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim) {
    return Invalid("ApplyRope", "rotary_dim must be even and in (0, head_dim], got " +
                                    std::to_string(p.rotary_dim));
  }
  if (p.tokens == 0) return Status::Ok();
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->apply_rope(p);
}

Status SwiGlu(const SwiGluParams& p, Backend backend) {
  if (p.gate == nullptr || p.up == nullptr || p.out == nullptr) return Invalid("SwiGlu", "null pointer");
  if (p.n < 0) return Invalid("SwiGlu", "n must be >= 0");
  if (p.n == 0) return Status::Ok();
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->swiglu(p);
}

Status Add(const AddParams& p, Backend backend) {
  if (p.y == nullptr || p.x == nullptr) return Invalid("Add", "null pointer");
  if (p.n < 0) return Invalid("Add", "n must be >= 0");
  if (p.n == 0) return Status::Ok();
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->add(p);
}

Status Embedding(const EmbeddingParams& p, Backend backend) {
  if (p.ids == nullptr || p.table == nullptr || p.out == nullptr) {
    return Invalid("Embedding", "null ids, table or out");
  }
  if (p.n < 0 || p.vocab <= 0 || p.dim <= 0) return Invalid("Embedding", "n >= 0, vocab and dim > 0");
  ICE_RETURN_IF_ERROR(CheckWeightDType("Embedding", p.table_dtype, p.dim, backend));
  if (p.n == 0) return Status::Ok();
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->embedding(p);
}

Status PrefillAttention(const PrefillAttentionParams& p, Backend backend) {
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.out == nullptr) {
    return Invalid("PrefillAttention", "null q, k, v or out");
  }
  if (p.q_len < 0 || p.kv_len < p.q_len) {
    return Invalid("PrefillAttention", "need 0 <= q_len <= kv_len, got q_len=" +
                                           std::to_string(p.q_len) + " kv_len=" + std::to_string(p.kv_len));
  }
  if (p.num_kv_heads <= 0 || p.num_q_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) {
    return Invalid("PrefillAttention", "num_q_heads must be a positive multiple of num_kv_heads");
  }
  if (p.head_dim <= 0) return Invalid("PrefillAttention", "head_dim must be > 0");
  if (p.q_len == 0) return Status::Ok();
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->prefill_attention(p);
}

Status PagedDecodeAttention(const PagedDecodeAttentionParams& p, Backend backend) {
  if (p.q == nullptr || p.out == nullptr || p.page_indptr == nullptr) {
    return Invalid("PagedDecodeAttention", "null q, out or page_indptr");
  }
  if (p.batch < 0) return Invalid("PagedDecodeAttention", "batch must be >= 0");
  if (p.num_kv_heads <= 0 || p.num_q_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) {
    return Invalid("PagedDecodeAttention", "num_q_heads must be a positive multiple of num_kv_heads");
  }
  if (p.head_dim <= 0 || p.page_size <= 0) {
    return Invalid("PagedDecodeAttention", "head_dim and page_size must be > 0");
  }
  if (!ValidDType(p.kv_dtype)) return Invalid("PagedDecodeAttention", "unknown kv dtype");
  if (p.batch == 0) return Status::Ok();
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  if (t->backend == Backend::kCpu) {
    // Host-resident index arrays can be checked here; the CUDA kernels trust them.
    const int lists = p.batch * p.num_kv_heads;
    if (p.page_indptr[0] != 0) return Invalid("PagedDecodeAttention", "page_indptr[0] must be 0");
    for (int i = 0; i < lists; ++i) {
      if (p.page_indptr[i + 1] < p.page_indptr[i]) {
        return Invalid("PagedDecodeAttention", "page_indptr must be non-decreasing");
      }
    }
    const int total = p.page_indptr[lists];
    if (total > 0 && (p.pages == nullptr || p.page_ids == nullptr || p.page_valid == nullptr)) {
      return Invalid("PagedDecodeAttention", "null pages, page_ids or page_valid with pages listed");
    }
    for (int i = 0; i < total; ++i) {
      if (p.page_ids[i] < 0) return Invalid("PagedDecodeAttention", "negative page id");
      if (p.page_valid[i] < 0 || p.page_valid[i] > p.page_size) {
        return Invalid("PagedDecodeAttention", "page_valid[" + std::to_string(i) + "]=" +
                                                   std::to_string(p.page_valid[i]) +
                                                   " outside [0, page_size]");
      }
    }
  }
  return t->paged_decode_attention(p);
}

namespace {

Status CheckKvRows(const char* op, int rows, int heads, int head_dim, int page_size, DType dtype) {
  if (rows < 0 || heads <= 0 || head_dim <= 0 || page_size <= 0) {
    return Invalid(op, "rows must be >= 0; num_heads, head_dim and page_size > 0");
  }
  if (!ValidDType(dtype)) return Invalid(op, "unknown kv dtype");
  return Status::Ok();
}

}  // namespace

Status StoreKv(const StoreKvParams& p, Backend backend) {
  ICE_RETURN_IF_ERROR(CheckKvRows("StoreKv", p.rows, p.num_heads, p.head_dim, p.page_size, p.kv_dtype));
  if (p.rows == 0) return Status::Ok();
  if (p.k == nullptr || p.v == nullptr || p.pages == nullptr || p.slot_ids == nullptr) {
    return Invalid("StoreKv", "null k, v, pages or slot_ids");
  }
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->store_kv(p);
}

Status GatherKv(const GatherKvParams& p, Backend backend) {
  ICE_RETURN_IF_ERROR(CheckKvRows("GatherKv", p.rows, p.num_heads, p.head_dim, p.page_size, p.kv_dtype));
  if (p.rows == 0) return Status::Ok();
  if (p.k == nullptr || p.v == nullptr || p.pages == nullptr || p.slot_ids == nullptr) {
    return Invalid("GatherKv", "null k, v, pages or slot_ids");
  }
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  if (t->host_memory) {
    const size_t n = static_cast<size_t>(p.rows) * p.num_heads;
    for (size_t i = 0; i < n; ++i) {
      if (p.slot_ids[i] < 0) return Invalid("GatherKv", "negative slot id at " + std::to_string(i));
    }
  }
  return t->gather_kv(p);
}

Status MergeToken(const MergeTokenParams& p, Backend backend) {
  if (p.batch < 0) return Invalid("MergeToken", "batch must be >= 0");
  if (p.num_kv_heads <= 0 || p.num_q_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) {
    return Invalid("MergeToken", "num_q_heads must be a positive multiple of num_kv_heads");
  }
  if (p.head_dim <= 0) return Invalid("MergeToken", "head_dim must be > 0");
  if (p.batch == 0) return Status::Ok();
  if (p.q == nullptr || p.k_new == nullptr || p.v_new == nullptr || p.lse == nullptr || p.out == nullptr) {
    return Invalid("MergeToken", "null q, k_new, v_new, lse or out");
  }
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->merge_token(p);
}

Status MergeStates(const MergeStatesParams& p, Backend backend) {
  if (p.rows < 0) return Invalid("MergeStates", "rows must be >= 0");
  if (p.head_dim <= 0) return Invalid("MergeStates", "head_dim must be > 0");
  if (p.rows == 0) return Status::Ok();
  if (p.out == nullptr || p.lse == nullptr || p.out2 == nullptr || p.lse2 == nullptr) {
    return Invalid("MergeStates", "null out, lse, out2 or lse2");
  }
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->merge_states(p);
}

Status RepetitionPenalty(const RepetitionPenaltyParams& p, Backend backend) {
  if (p.vocab <= 0 || p.count < 0) return Invalid("RepetitionPenalty", "vocab > 0 and count >= 0 required");
  if (!(p.penalty > 0.f) || !std::isfinite(p.penalty)) {
    return Invalid("RepetitionPenalty", "penalty must be a finite number > 0");
  }
  if (p.count == 0) return Status::Ok();
  if (p.logits == nullptr || p.ids == nullptr) return Invalid("RepetitionPenalty", "null logits or ids");
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  if (t->host_memory) {
    for (int i = 0; i < p.count; ++i) {
      if (p.ids[i] < 0 || p.ids[i] >= p.vocab) {
        return Invalid("RepetitionPenalty", "id " + std::to_string(p.ids[i]) + " outside [0, vocab)");
      }
    }
  }
  return t->repetition_penalty(p);
}

Status CountPenalty(const CountPenaltyParams& p, Backend backend) {
  if (p.vocab <= 0 || p.count < 0) return Invalid("CountPenalty", "vocab > 0 and count >= 0 required");
  if (!std::isfinite(p.frequency) || !std::isfinite(p.presence)) {
    return Invalid("CountPenalty", "frequency and presence must be finite numbers");
  }
  if (p.count == 0) return Status::Ok();
  if (p.logits == nullptr || p.ids == nullptr || p.counts == nullptr) {
    return Invalid("CountPenalty", "null logits, ids or counts");
  }
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  if (t->host_memory) {
    for (int i = 0; i < p.count; ++i) {
      if (p.ids[i] < 0 || p.ids[i] >= p.vocab) {
        return Invalid("CountPenalty", "id " + std::to_string(p.ids[i]) + " outside [0, vocab)");
      }
      if (p.counts[i] < 1) return Invalid("CountPenalty", "counts must be >= 1");
    }
  }
  return t->count_penalty(p);
}

StatusOr<TokenLogprobs> ComputeTokenLogprobs(const TokenLogprobsParams& p, Backend backend) {
  if (p.logits == nullptr) return Invalid("ComputeTokenLogprobs", "null logits");
  if (p.vocab <= 0) return Invalid("ComputeTokenLogprobs", "vocab must be > 0");
  if (p.token < 0 || p.token >= p.vocab) {
    return Invalid("ComputeTokenLogprobs", "token " + std::to_string(p.token) + " outside [0, vocab)");
  }
  if (p.top < 0 || p.top > std::min(p.vocab, kMaxTopLogprobs)) {
    return Invalid("ComputeTokenLogprobs", "top must be in [0, min(vocab, " + std::to_string(kMaxTopLogprobs) +
                                               ")], got " + std::to_string(p.top));
  }
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  float lse = 0.f, token_logit = 0.f;
  ICE_RETURN_IF_ERROR(t->log_sum_exp(p.logits, p.vocab, &lse));
  ICE_RETURN_IF_ERROR(t->copy_to_host(&token_logit, p.logits + p.token, sizeof(float)));
  TokenLogprobs out;
  if (std::isnan(token_logit)) token_logit = -std::numeric_limits<float>::infinity();
  out.logprob = token_logit - lse;
  if (p.top > 0) {
    std::vector<float> top_logits(p.top);
    out.top_ids.resize(p.top);
    ICE_RETURN_IF_ERROR(t->top_logits(p.logits, p.vocab, p.top, top_logits.data(), out.top_ids.data()));
    out.top_logprobs.resize(p.top);
    for (int i = 0; i < p.top; ++i) {
      const float l = std::isnan(top_logits[i]) ? -std::numeric_limits<float>::infinity() : top_logits[i];
      out.top_logprobs[i] = l - lse;
    }
  }
  return out;
}

Status Argmax(const ArgmaxParams& p, Backend backend) {
  if (p.logits == nullptr || p.out == nullptr) return Invalid("Argmax", "null logits or out");
  if (p.rows < 0 || p.vocab <= 0) return Invalid("Argmax", "rows >= 0 and vocab > 0 required");
  if (p.rows == 0) return Status::Ok();
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  return t->argmax(p);
}

namespace {

// The first `keep` of the descending (logits, ids) as candidates, with probabilities
// exp(logit / T - mx) renormalised over them, after dropping trailing zero-probability ones.
SamplingCandidates Kept(const std::vector<float>& logits, const std::vector<int32_t>& ids, int keep, double inv_t,
                        double mx) {
  std::vector<double> e(keep);
  for (int i = 0; i < keep; ++i) e[i] = std::exp(logits[i] * inv_t - mx);  // -inf logits give 0
  while (keep > 1 && e[keep - 1] == 0.0) --keep;
  double kept_sum = 0;
  for (int i = 0; i < keep; ++i) kept_sum += e[i];
  SamplingCandidates c;
  c.ids.assign(ids.begin(), ids.begin() + keep);
  c.probs.resize(keep);
  for (int i = 0; i < keep; ++i) c.probs[i] = static_cast<float>(e[i] / kept_sum);
  return c;
}

}  // namespace

StatusOr<SamplingCandidates> TopKTopPCandidates(const TopKTopPParams& p, Backend backend) {
  if (p.logits == nullptr) return Invalid("TopKTopPCandidates", "null logits");
  if (p.vocab <= 0) return Invalid("TopKTopPCandidates", "vocab must be > 0");
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) {
    return Invalid("TopKTopPCandidates", "top_p must be in (0, 1], got " + std::to_string(p.top_p));
  }
  if (std::isnan(p.temperature)) return Invalid("TopKTopPCandidates", "temperature is NaN");
  ICE_ASSIGN_OR_RETURN(const OpTable* t, GetOpTable(backend));
  const bool greedy = p.temperature <= 0.f;
  SamplingCandidates c;
  if (greedy) {
    float logit = 0.f;
    int32_t id = 0;
    ICE_RETURN_IF_ERROR(t->top_logits(p.logits, p.vocab, 1, &logit, &id));
    c.ids = {id};
    c.probs = {1.f};
    return c;
  }
  const double inv_t = 1.0 / p.temperature;
  const bool every_id = p.top_k <= 0 || p.top_k >= p.vocab;
  if (every_id) {
    // No top_k cut: the softmax needs every logit once; only the nucleus needs an order, and only
    // of its own (usually small) prefix.
    std::vector<float> row(p.vocab);
    ICE_RETURN_IF_ERROR(t->copy_to_host(row.data(), p.logits, row.size() * sizeof(float)));
    float mxf = -std::numeric_limits<float>::infinity();
    for (float x : row) mxf = std::max(mxf, x);  // NaN never wins a max
    const double mx = static_cast<double>(mxf) * inv_t;
    double z = 0;
    for (float x : row) z += std::isnan(x) ? 0.0 : std::exp(x * inv_t - mx);  // -inf logits give 0
    if (p.top_p >= 1.f) {
      // Every token, in id order (nothing is cut, so no order is needed).
      c.ids.resize(p.vocab);
      c.probs.resize(p.vocab);
      for (int32_t i = 0; i < p.vocab; ++i) {
        c.ids[i] = i;
        c.probs[i] = std::isnan(row[i]) ? 0.f : static_cast<float>(std::exp(row[i] * inv_t - mx) / z);
      }
      return c;
    }
    // Nucleus: the smallest prefix by descending probability whose mass reaches top_p, found in
    // the top 1024, 8192, ... until it fits (the whole vocabulary at worst).
    for (int count = std::min(p.vocab, 1024);; count = std::min(p.vocab, count * 8)) {
      std::vector<float> logits(count);
      std::vector<int32_t> ids(count);
      ICE_RETURN_IF_ERROR(t->top_logits(p.logits, p.vocab, count, logits.data(), ids.data()));
      double before = 0;
      int keep = -1;
      for (int i = 0; i < count; ++i) {
        if (i > 0 && before >= static_cast<double>(p.top_p)) {
          keep = i;
          break;
        }
        before += std::exp(logits[i] * inv_t - mx) / z;
      }
      if (keep < 0 && count < p.vocab) continue;  // the nucleus is longer than this prefix
      if (keep < 0) keep = count;
      return Kept(logits, ids, keep, inv_t, mx);
    }
  }
  // top_k: softmax of logits/temperature over the top-k set (HF top-k masks the rest to -inf),
  // then the nucleus within it.
  const int count = std::min(p.top_k, p.vocab);
  std::vector<float> logits(count);
  std::vector<int32_t> ids(count);
  ICE_RETURN_IF_ERROR(t->top_logits(p.logits, p.vocab, count, logits.data(), ids.data()));
  const double mx = static_cast<double>(logits[0]) * inv_t;
  std::vector<double> e(count);
  double sum = 0;
  for (int i = 0; i < count; ++i) {
    e[i] = std::exp(logits[i] * inv_t - mx);  // -inf logits give 0
    sum += e[i];
  }
  int keep = count;
  if (p.top_p < 1.f) {
    double before = 0;
    for (int i = 0; i < count; ++i) {
      if (i > 0 && before >= static_cast<double>(p.top_p)) {
        keep = i;
        break;
      }
      before += e[i] / sum;
    }
  }
  return Kept(logits, ids, keep, inv_t, mx);
}

}  // namespace icecache::kernels
