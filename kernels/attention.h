// Attention ops: dense causal prefill attention and paged (sparse) decode attention.
//
// KV page layout (shared with kvstore::PagePool): a page holds page_size token slots of ONE
// (layer, kv-head): its K block [page_size, head_dim] followed by its V block
// [page_size, head_dim], elements of kv_dtype. Page p starts at element p * 2 * page_size *
// head_dim of the pool base pointer. The valid slots of a page are its first `valid` slots.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace icecache::kernels {

// Dense causal attention for a prompt chunk of q_len tokens that follows kv_len - q_len earlier
// tokens: query i (0-based within the chunk) attends key j iff j <= i + (kv_len - q_len).
// GQA: query head h uses kv head h / (num_q_heads / num_kv_heads). Online softmax, fp32.
struct PrefillAttentionParams {
  const float* q = nullptr;  // [q_len, num_q_heads, head_dim]
  const float* k = nullptr;  // [kv_len, num_kv_heads, head_dim]
  const float* v = nullptr;  // [kv_len, num_kv_heads, head_dim]
  float* out = nullptr;      // [q_len, num_q_heads, head_dim]
  int q_len = 0;
  int kv_len = 0;            // >= q_len
  int num_q_heads = 0;       // multiple of num_kv_heads
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.f;         // usually 1/sqrt(head_dim)
  // Allows bf16 products: q·scale, K, V and the softmax probabilities rounded to bf16 (round to
  // nearest even) for Q·Kᵀ and P·V, fp32 accumulation and an fp32 softmax (FlashAttention's bf16
  // numerics; the KV pages are bf16 by default anyway). Only the CPU's AMX form takes it (avx512
  // target, kernels::AmxActive(), head_dim a multiple of 32 up to 256); every other case computes
  // in fp32 whatever it says. The model sets it for bf16 KV caches where MatmulPrecision resolves
  // to bf16 (kernels::UseBf16Attention, kernels/matmul.h).
  bool bf16 = false;
};
Status PrefillAttention(const PrefillAttentionParams& p, Backend backend = Backend::kCpu);

// One decode step for a batch of sequences over selected pages. For sequence b and kv head g,
// the pages are page_ids[page_indptr[b*num_kv_heads+g] .. page_indptr[b*num_kv_heads+g+1]),
// shared by the query heads g*group .. (g+1)*group-1. Softmax (scale) over all valid slots of the
// selected pages, renormalised over that set; empty slots are masked. A (b, g) with no valid slot
// yields zeros.
struct PagedDecodeAttentionParams {
  const float* q = nullptr;            // [batch, num_q_heads, head_dim]
  const void* pages = nullptr;         // page pool base (layout above), elements of kv_dtype
  DType kv_dtype = DType::kF32;
  const int32_t* page_indptr = nullptr;  // [batch * num_kv_heads + 1], page_indptr[0] == 0
  const int32_t* page_ids = nullptr;     // [page_indptr[batch * num_kv_heads]]
  const int32_t* page_valid = nullptr;   // [same], valid slots of each listed page, 0..page_size
  float* out = nullptr;                // [batch, num_q_heads, head_dim]
  float* lse = nullptr;                // optional [batch, num_q_heads] natural log-sum-exp of scores
  int batch = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  float scale = 0.f;
};
Status PagedDecodeAttention(const PagedDecodeAttentionParams& p, Backend backend = Backend::kCpu);

}  // namespace icecache::kernels
