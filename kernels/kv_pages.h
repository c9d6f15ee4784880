// Moving K/V rows between step activations and KV pages (layout of kernels/attention.h), and the
// merge of one extra key/value into a paged attention result. These are the device-side halves of
// the KV caches: with Backend::kCuda every pointer is device memory, with Backend::kCpu host
// memory, and the same calls run on both.
//
// A slot id names one token slot of one page: slot_id = page_id * page_size + slot, with
// 0 <= slot < page_size. Slot ids are int64 so pools of more than 2^31 slots work.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace icecache::kernels {

// Tokens per KV page (cache.page_size) wherever a caller does not choose: the one default of the
// config, the engines, the caches and the CLI.
inline constexpr int kDefaultPageSize = 16;

// Writes row r, head g of k and v (converted to kv_dtype, round to nearest even) into the slot
// slot_ids[r * num_heads + g]: K into the page's K block, V into its V block. A negative slot id
// skips that row and head. Slot ids of one call must be distinct.
struct StoreKvParams {
  const float* k = nullptr;         // [rows, num_heads, head_dim]
  const float* v = nullptr;         // [rows, num_heads, head_dim]
  void* pages = nullptr;            // page pool base, elements of kv_dtype
  DType kv_dtype = DType::kF32;
  const int64_t* slot_ids = nullptr;  // [rows * num_heads]
  int rows = 0;
  int num_heads = 0;
  int head_dim = 0;
  int page_size = 0;
};
Status StoreKv(const StoreKvParams& p, Backend backend = Backend::kCpu);

// The inverse: k[r, g, :] and v[r, g, :] (fp32) from slot slot_ids[r * num_heads + g]
// (every slot id >= 0).
struct GatherKvParams {
  const void* pages = nullptr;        // page pool base, elements of kv_dtype
  DType kv_dtype = DType::kF32;
  const int64_t* slot_ids = nullptr;  // [rows * num_heads]
  float* k = nullptr;                 // [rows, num_heads, head_dim]
  float* v = nullptr;                 // [rows, num_heads, head_dim]
  int rows = 0;
  int num_heads = 0;
  int head_dim = 0;
  int page_size = 0;
};
Status GatherKv(const GatherKvParams& p, Backend backend = Backend::kCpu);

// Adds one key/value (the step's own token, not yet in any page) to a paged attention result:
// for sequence b and query head h (kv head g = h / (num_q_heads / num_kv_heads)), with
// s = scale * q[b,h]·k_new[b,g] and L = lse[b,h] (the log-sum-exp of the paged scores, -inf when
// no slot was attended),
//   out[b,h] = (exp(L - m) * out[b,h] + exp(s - m) * v_new[b,g]) / (exp(L - m) + exp(s - m)),
//   m = max(L, s); out[b,h] = v_new[b,g] when L = -inf or NaN.
// This is softmax over (paged slots ∪ {new token}), exactly as if the token had been in a page.
struct MergeTokenParams {
  const float* q = nullptr;      // [batch, num_q_heads, head_dim]
  const float* k_new = nullptr;  // [batch, num_kv_heads, head_dim]
  const float* v_new = nullptr;  // [batch, num_kv_heads, head_dim]
  const float* lse = nullptr;    // [batch, num_q_heads]
  float* out = nullptr;          // [batch, num_q_heads, head_dim], updated in place
  int batch = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.f;
};
Status MergeToken(const MergeTokenParams& p, Backend backend = Backend::kCpu);

// Merges a second partial attention result into a first, in place. Row i (one query head of one
// sequence) holds two softmax results over disjoint sets of keys: (out[i], lse[i]) and (out2[i],
// lse2[i]), each lse the natural log-sum-exp of its set's (scaled) scores, -inf for an empty set.
// With m = max(lse, lse2), a = exp(lse - m), b = exp(lse2 - m):
//   out[i] = (a * out[i] + b * out2[i]) / (a + b),  lse[i] = m + log(a + b),
// softmax over the union, as if one attention had read both sets. A row whose lse2 is -inf (or
// NaN) is left as it is; a row whose lse is -inf (or NaN) takes (out2[i], lse2[i]).
struct MergeStatesParams {
  float* out = nullptr;         // [rows, head_dim], updated in place
  float* lse = nullptr;         // [rows], updated in place
  const float* out2 = nullptr;  // [rows, head_dim]
  const float* lse2 = nullptr;  // [rows]
  int rows = 0;
  int head_dim = 0;
};
Status MergeStates(const MergeStatesParams& p, Backend backend = Backend::kCpu);

}  // namespace icecache::kernels
