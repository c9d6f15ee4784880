// CPU versions of kernels/kv_pages.h and the repetition penalty.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_ops.h"

namespace icecache::kernels::cpu {

namespace {

// Byte offsets of a slot's K and V rows from the pool base.
struct SlotRows {
  size_t k, v;
};

SlotRows RowsOf(int64_t slot_id, int page_size, int head_dim, size_t esz) {
  const int64_t page = slot_id / page_size;
  const int64_t slot = slot_id % page_size;
  const size_t page_bytes = static_cast<size_t>(2) * page_size * head_dim * esz;
  const size_t k = static_cast<size_t>(page) * page_bytes + static_cast<size_t>(slot) * head_dim * esz;
  return {k, k + static_cast<size_t>(page_size) * head_dim * esz};
}

}  // namespace

Status StoreKv(const StoreKvParams& p) {
  const size_t esz = DTypeSize(p.kv_dtype);
  const size_t n = static_cast<size_t>(p.rows) * p.num_heads;
  auto* base = static_cast<uint8_t*>(p.pages);
  for (size_t i = 0; i < n; ++i) {
    if (p.slot_ids[i] < 0) continue;
    const SlotRows r = RowsOf(p.slot_ids[i], p.page_size, p.head_dim, esz);
    ConvertFromF32(p.kv_dtype, p.k + i * p.head_dim, base + r.k, p.head_dim);
    ConvertFromF32(p.kv_dtype, p.v + i * p.head_dim, base + r.v, p.head_dim);
  }
  return Status::Ok();
}

Status GatherKv(const GatherKvParams& p) {
  const size_t esz = DTypeSize(p.kv_dtype);
  const int64_t n = static_cast<int64_t>(p.rows) * p.num_heads;
  const auto* base = static_cast<const uint8_t*>(p.pages);
  auto row = [&](int64_t i) {
    const SlotRows r = RowsOf(p.slot_ids[i], p.page_size, p.head_dim, esz);
    ConvertToF32(p.kv_dtype, base + r.k, p.k + i * p.head_dim, p.head_dim);
    ConvertToF32(p.kv_dtype, base + r.v, p.v + i * p.head_dim, p.head_dim);
  };
  // Long gathers (a prefill continuing a long sequence) convert megabytes: spread them. Short
  // ones stay outside any parallel construct (libgomp reshapes its team even for `if (false)`).
  if (n >= 4096) {
#pragma omp parallel for schedule(static) num_threads(CpuThreads())
    for (int64_t i = 0; i < n; ++i) row(i);
  } else {
    for (int64_t i = 0; i < n; ++i) row(i);
  }
  return Status::Ok();
}

Status MergeToken(const MergeTokenParams& p) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_q_heads; ++h) {
      const int g = h / group;
      const float* q = p.q + (static_cast<size_t>(b) * p.num_q_heads + h) * hd;
      const float* kn = p.k_new + (static_cast<size_t>(b) * p.num_kv_heads + g) * hd;
      const float* vn = p.v_new + (static_cast<size_t>(b) * p.num_kv_heads + g) * hd;
      float* o = p.out + (static_cast<size_t>(b) * p.num_q_heads + h) * hd;
      const float lse = p.lse[static_cast<size_t>(b) * p.num_q_heads + h];
      if (!std::isfinite(lse)) {  // nothing attended in the pages
        std::memcpy(o, vn, hd * sizeof(float));
        continue;
      }
      float dot = 0.f;
      for (int d = 0; d < hd; ++d) dot += q[d] * kn[d];
      const float s = dot * p.scale;
      const float m = std::max(lse, s);
      const float w_old = std::exp(lse - m);
      const float w_new = std::exp(s - m);
      const float inv = 1.f / (w_old + w_new);
      for (int d = 0; d < hd; ++d) o[d] = (o[d] * w_old + vn[d] * w_new) * inv;
    }
  }
  return Status::Ok();
}

Status MergeStates(const MergeStatesParams& p) {
  const int hd = p.head_dim;
  for (int i = 0; i < p.rows; ++i) {
    const float l2 = p.lse2[i];
    if (!std::isfinite(l2)) continue;  // nothing in the second set
    float* o = p.out + static_cast<size_t>(i) * hd;
    const float* o2 = p.out2 + static_cast<size_t>(i) * hd;
    const float l1 = p.lse[i];
    if (!std::isfinite(l1)) {  // nothing in the first set
      std::memcpy(o, o2, hd * sizeof(float));
      p.lse[i] = l2;
      continue;
    }
    const float m = std::max(l1, l2);
    const float a = std::exp(l1 - m), b = std::exp(l2 - m);
    const float inv = 1.f / (a + b);
    for (int d = 0; d < hd; ++d) o[d] = (o[d] * a + o2[d] * b) * inv;
    p.lse[i] = m + std::log(a + b);
  }
  return Status::Ok();
}

Status RepetitionPenalty(const RepetitionPenaltyParams& p) {
  for (int i = 0; i < p.count; ++i) {
    float& l = p.logits[p.ids[i]];
    l = l > 0.f ? l / p.penalty : l * p.penalty;
  }
  return Status::Ok();
}

}  // namespace icecache::kernels::cpu
