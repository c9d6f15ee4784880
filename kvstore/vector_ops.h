// Small vector kernels used by the IceCache store: dot products of an fp32 query against rows
// stored as f32/f16/bf16 (the page element types of kernels/dtype.h), and row conversions.
// All functions are pure and thread-safe. AVX2/FMA/F16C paths are used when the compiler targets
// them (ICECACHE_NATIVE), with portable scalar code otherwise; both give the same results up to
// fp32 summation order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace icecache::kvstore {

using kernels::DType;

// sum_i a[i] * b[i] over n fp32 values.
float DotF32(const float* a, const float* b, int n);

// out[r] = q · rows[r] for r in [0, count); rows are contiguous [count, dim] elements of `dtype`.
void ScoreRows(DType dtype, const void* rows, int count, int dim, const float* q, float* out);

// Scores `count` rows against `nq` queries at once (one pass over the rows).
// qs: [nq, dim] fp32; out: [nq, count] (row-major by query).
void ScoreRowsMulti(DType dtype, const void* rows, int count, int dim, const float* qs, int nq,
                    float* out);

// Converts n values between fp32 and `dtype` (round to nearest even; f16 overflows to inf).
void RowToF32(DType dtype, const void* src, float* dst, int n);
void RowFromF32(DType dtype, const float* src, void* dst, int n);
// RowFromF32 with non-temporal stores (no read of dst's cache lines first, none left in cache)
// where dst is 64-byte aligned and the row a whole number of 64-byte lines (bf16 and fp32 on
// AVX-512); otherwise plain RowFromF32. The same values. Call StoreFence() before another
// thread may read what was written.
void StreamRowFromF32(DType dtype, const float* src, void* dst, int n);
void StoreFence();

// The k-th largest of v[0, n) (1 <= k <= n; no NaN), by bisection over an order-preserving
// integer image of the floats (32 branch-free counting passes instead of a branchy selection).
// scratch: [n] working memory.
float KthLargest(const float* v, int n, int k, int32_t* scratch);

// Batched arg-max of augmented inner products, the parent search of a DCI-tree level:
// best[i] = argmax_r ( x_i . row_r + x_extra[i] * row_extra[r] ), ties to the lowest r.
// x: [nx, x_stride] fp32 (first dim values used); rows_t: the rows transposed, [dim, ld] with
// ld a multiple of 32 >= nr; row_extra: [ld], entries >= nr must be -inf. nr >= 1. Only the
// ceil(nr / 32) blocks of 32 columns that hold rows are read (the rest may be insertion headroom).
void ArgmaxAugDot(const float* x, size_t x_stride, const float* x_extra, int nx, const float* rows_t, int ld,
                  const float* row_extra, int nr, int dim, int32_t* best);

// ArgmaxAugDot with the dot products on bf16-rounded inputs (exact bf16 products, fp32 sums; the
// extra term in fp32): twice the multiply-adds per instruction where AVX512_BF16 exists, so a
// parent search twice as fast whose choice differs from the fp32 one only between candidates
// within ~1e-3 relative of each other.
// x: [nx, pairs] bf16 pairs (element 2j in the low half of word j; an odd dim padded with 0);
// rows_t: [pairs, ld] the rows' pairs transposed, ld a multiple of 32 >= nr; row_extra as above.
void ArgmaxAugDotBf16(const uint32_t* x, const float* x_extra, int nx, const uint32_t* rows_t, int ld,
                      const float* row_extra, int nr, int pairs, int32_t* best);

// Symmetric int8 quantisation of one row for ArgmaxAugDotI8: q[j] = round(v[j] / s) in [-127, 127]
// with s = max_j |v[j]| / 127, returned (0 for an all-zero row, whose q is then all 0).
// v: [n] fp32; q: [n].
float QuantizeRowI8(const float* v, int n, int8_t* q);

// ArgmaxAugDot on int8-quantised inputs (QuantizeRowI8 per key and per row; exact int32 sums,
// AVX512_VNNI vpdpbusd: four multiply-adds per lane and instruction):
// best[i] = argmax_r ( row_scale[r] * (xq_i . rq_r) + x_extra[i] * row_extra[r] ), ties to the
// lowest r. A key's own scale s_i does not move its arg-max, so the caller passes its extra
// divided by s_i. The choice differs from the fp32 one only between candidates whose scores are
// within the quantisation error (~1 % of |x| |row| / sqrt(dim) for Gaussian-like rows).
// x: [nx, quads] words of four bytes, byte b of word j = xq_i[4j + b] + 128 (u8; dims padded to a
//   multiple of 4 with byte 128, i.e. value 0);
// rows_t: [quads, ld] words of four s8 entries (row r's entries 4j..4j+3 in column r, pad 0),
//   ld a multiple of 32 >= nr; row_sum: [ld] sum of row r's int8 entries; row_scale: [ld];
//   row_extra: [ld], entries >= nr must be -inf (and their row_sum / row_scale finite). nr >= 1.
void ArgmaxAugDotI8(const uint32_t* x, const float* x_extra, int nx, const uint32_t* rows_t, int ld,
                    const int32_t* row_sum, const float* row_scale, const float* row_extra, int nr, int quads,
                    int32_t* best);

}  // namespace icecache::kvstore
