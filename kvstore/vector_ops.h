// Small vector kernels used by the IceCache store: dot products of an fp32 query against rows
// stored as f32/f16/bf16 (the page element types of kernels/dtype.h), and row conversions.
// All functions are pure and thread-safe. Each call runs the kernel of the active SIMD target
// (kernels/simd_target.h: AVX-512, AVX2 or scalar on x86-64, NEON or scalar on aarch64, chosen at
// run time; the kernels are in kernels/cpu/{vector_ops,int8_ops}_cpu.cc). Targets give the same
// results up to fp32 summation order; the int8 kernels (QuantizeKeyI8, ArgmaxDotI8, ScoreRowsI8,
// ...) give identical results on all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace icecache::kvstore {

using kernels::DType;

// sum_i a[i] * b[i] over n fp32 values.
float DotF32(const float* a, const float* b, int n);
// *aa = DotF32(a, a, n) and *ab = DotF32(b, a, n), bit for bit, in one pass over a.
void SelfAndCrossDotF32(const float* a, const float* b, int n, float* aa, float* ab);

// out[r] = q · rows[r] for r in [0, count); rows are contiguous [count, dim] elements of `dtype`.
void ScoreRows(DType dtype, const void* rows, int count, int dim, const float* q, float* out);

// Scores `count` rows against `nq` queries at once. qs: [nq, dim] fp32; out: [nq, count]
// (row-major by query). For nq 2, 3, 4 and 8 on avx512 (dim % 16 == 0) and avx2 (dim % 8 == 0)
// one pass over the rows, each row chunk converted once for all queries (other nq > 1: passes of
// 3 queries, the last of 2 or 4); per query the same floats as ScoreRows (the same sums in the
// same order) on every target.
void ScoreRowsMulti(DType dtype, const void* rows, int count, int dim, const float* qs, int nq,
                    float* out);

// x[i] = exp(x[i] - m) for i < n (every x[i] <= m); returns the sum of the new values. The
// attention kernels' exp polynomial (about 1 ulp) on the SIMD targets; arguments below -87
// (-inf included) give exactly 0.
float ExpShiftSum(float* x, int n, float m);

// out[j, :] += sum_i w[j * count + i] * rows[i, :] for j < nq: the transpose of ScoreRowsMulti.
// On the SIMD targets (dim a multiple of the vector width) out is held in registers a tile of
// columns at a time for up to four heads, so each row chunk is converted once per four heads
// and out read and written once; per (head, column) the sum runs over i in order, one fma per
// nonzero weight (a zero weight adds nothing; rows must be finite). rows: [count, dim] elements of `dtype`; w: [nq, count]; out: [nq, dim].
void AddWeightedRows(DType dtype, const void* rows, int count, int dim, const float* w, int nq, float* out);

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

// The int8 parent search (DciParams::int8_parent_search). Rows (8-bit) and keys (6-bit,
// kI8ParentKeyMax) are quantised so that a key's scores against all rows of a level compare as
// exact int32 dot products: the rows share one scale, a key's own scale does not move its
// arg-max, and the augmented coordinate of the MIPS transform rides in kI8ExtraQuads extra
// quad. A row or key of dim values is I8Quads(dim) words of four bytes: the values in order
// (byte b of word j is value 4j + b), padded with 0 to a multiple of 4, then the extra quad.
inline constexpr int kI8ExtraQuads = 1;
inline int I8Quads(int dim) { return (dim + 3) / 4 + kI8ExtraQuads; }
// Largest I8Quads the kernel takes (|dot| * 128 must fit in an int32): dims up to 1020.
inline constexpr int kI8MaxQuads = 256;

// Quantises nr rows (rows: [nr, dim] fp32; extra: [nr] their augmented coordinates, >= 0) into
// columns 0..nr-1 of rows_t ([I8Quads(dim), ld] words, ld >= nr) with one scale
// S = max over rows of max(max_j |row[j]|, extra / 4) / 127, returned (0 if all are 0): value
// bytes round(v / S) + 128 (u8); the extra quad holds e = round(extra / S) <= 508 split into
// four bytes of at most 127 each (+ 128). Other columns are not written.
float QuantizeRowsI8(const float* rows, int nr, int dim, const float* extra, int ld, uint32_t* rows_t);

// Quantises one key as its augmented vector [key, extra] with one scale
// s = max(max_j |key[j]|, extra) / key_max (a key's scale does not move its arg-max): value bytes
// round(key[j] / s) as s8 (within +-key_max), and t = round(extra / s) <= key_max in every byte of
// the extra quad, so that its dot with a row carries t * e ~ extra * row extra / (s S). Returns
// the sum of its bytes (as s8). dst: [I8Quads(dim)]. key_max in [1, 127]: 127 for a query's
// upper-level scoring (ScoreRowsI8), kI8ParentKeyMax for the parent search (ArgmaxDotI8).
// scale: if not null, receives s.
int32_t QuantizeKeyI8(const float* key, int dim, float extra, uint32_t* dst, float* scale = nullptr, int key_max = 127);

// The parent search's keys are 6-bit: bytes within +-31, so that AVX2 without VNNI can add two
// quads' u8 x s8 pairs (vpmaddubsw) in int16 and widen them once, 1.5-1.6x faster than widening
// 8-bit bytes to int16 first (docs/kernels.md). What it costs (32k synthetic keys, d 64, against
// 655 rows; `icecache-bench retrieval --profile-parent-search`): the row of largest fp32 dot for
// 97.0 % of keys instead of 98.9 % with 8-bit keys, the dot given up 2.5e-4 of the best's margin
// over the mean row; the trees keep as much attention mass on SmolLM2's real keys and on the
// synthetic families (docs/BENCHMARKS.md, "DCI build on AVX2").
inline constexpr int kI8ParentKeyMax = 31;

// best[i] = argmax_r sum over bytes of x_i's (s8) times (rows_t's byte - 128), ties to the lowest
// r: exact int32 arithmetic (AVX512_VNNI vpdpbusd on avx512; on avx2 AVX-VNNI vpdpbusd where the
// CPU has it, else vpmaddubsw pairs of two quads added in int16 and widened by vpmaddwd; vmull_s8
// + vpadalq_s16 or sdot on neon; else the same integers in scalar code). x: [nx, quads]
// (QuantizeKeyI8 with key_max = kI8ParentKeyMax: REQUIRES every key byte within
// +-kI8ParentKeyMax); x_sum: [nx] their byte sums; rows_t: [quads, ld] (QuantizeRowsI8), ld a
// multiple of 32 >= nr, nr >= 1, quads <= kI8MaxQuads. Only the ceil(nr / 32) blocks of 32
// columns that hold rows are read (the rest may be insertion headroom); columns nr.. of the last
// block are ignored whatever they hold.
void ArgmaxDotI8(const uint32_t* x, const int32_t* x_sum, int nx, const uint32_t* rows_t, int ld, int nr, int quads,
                 int32_t* best);

// Int8 copies of a tree's upper-level keys for a query's first pass (ScoreRowsI8): rows appended
// one at a time, each quantised with its own scale (max |v| / 127; 0 for a zero row) as bytes
// round(v / scale) + 128 (u8, dims padded with value 0) in blocks of 32 rows laid out
// [quads][32] (block after block, so appending never moves a row).
struct RowBlocksI8 {
  int dim = 0, quads = 0, rows = 0;
  std::vector<uint32_t> words;  // [ceil(rows / 32), quads, 32]
  std::vector<float> scale;     // [rows]
  float max_scale = 0.f;        // over rows
  float max_l1 = 0.f;           // largest sum_j |v_j| of a row (of the values quantised)
  void Reset(int dim);
  void Append(const float* v);  // [dim]
  // Bound on |q . v - ScoreRowsI8's score| for any row, for a query of sum_j |q_j| = q_l1
  // quantised with scale q_scale: q_l1 S / 2 + l1 s / 2 + dim s S / 4 over the rows' S and l1.
  float ErrorBound(float q_l1, float q_scale) const {
    return 0.5f * q_l1 * max_scale + 0.5f * max_l1 * q_scale + 0.25f * static_cast<float>(dim) * q_scale * max_scale;
  }
};

// out[h * rows.rows + r] = q_scale[h] * rows.scale[r] * (exact int32 dot of query h's s8 bytes
// with row r's bytes - 128): every row against nq queries, each quantised by QuantizeKeyI8 with
// extra = 0 (words with stride qstride >= rows.quads, unused when nq == 1; only the first
// rows.quads words are read; q_sum and q_scale: its return value and scale).
void ScoreRowsI8(const RowBlocksI8& rows, const uint32_t* qw, int qstride, const int32_t* q_sum, const float* q_scale,
                 int nq, float* out);

}  // namespace icecache::kvstore
