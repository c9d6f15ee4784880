// The vector ops of the store: each call goes to the active SIMD target's kernel
// (kernels/cpu/vector_ops_cpu.cc and int8_ops_cpu.cc, compiled once per target;
// kernels/simd_target.h).
#include "kvstore/vector_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/dispatch.h"

namespace icecache::kvstore {

static_assert(kI8ExtraQuads == 1, "kernels/cpu/int8_ops_cpu.cc assumes one extra quad");

float DotF32(const float* a, const float* b, int n) { ICE_SIMD_DISPATCH(DotF32, a, b, n); }

void SelfAndCrossDotF32(const float* a, const float* b, int n, float* aa, float* ab) {
  ICE_SIMD_DISPATCH(SelfAndCrossDotF32, a, b, n, aa, ab);
}

void ScoreRows(DType dtype, const void* rows, int count, int dim, const float* q, float* out) {
  ICE_SIMD_DISPATCH(ScoreRows, dtype, rows, count, dim, q, out);
}

void ScoreRowsMulti(DType dtype, const void* rows, int count, int dim, const float* qs, int nq, float* out) {
  ICE_SIMD_DISPATCH(ScoreRowsMulti, dtype, rows, count, dim, qs, nq, out);
}

float ExpShiftSum(float* x, int n, float m) { ICE_SIMD_DISPATCH(ExpShiftSum, x, n, m); }

void AddWeightedRows(DType dtype, const void* rows, int count, int dim, const float* w, int nq, float* out) {
  ICE_SIMD_DISPATCH(AddWeightedRows, dtype, rows, count, dim, w, nq, out);
}

void RowToF32(DType dtype, const void* src, float* dst, int n) { ICE_SIMD_DISPATCH(RowToF32, dtype, src, dst, n); }

void RowFromF32(DType dtype, const float* src, void* dst, int n) { ICE_SIMD_DISPATCH(RowFromF32, dtype, src, dst, n); }

void StreamRowFromF32(DType dtype, const float* src, void* dst, int n) {
  ICE_SIMD_DISPATCH(StreamRowFromF32, dtype, src, dst, n);
}

void StoreFence() { ICE_SIMD_DISPATCH(StoreFence); }

void ArgmaxAugDot(const float* x, size_t x_stride, const float* x_extra, int nx, const float* rows_t, int ld,
                  const float* row_extra, int nr, int dim, int32_t* best) {
  ICE_SIMD_DISPATCH(ArgmaxAugDot, x, x_stride, x_extra, nx, rows_t, ld, row_extra, nr, dim, best);
}

void ArgmaxAugDotBf16(const uint32_t* x, const float* x_extra, int nx, const uint32_t* rows_t, int ld,
                      const float* row_extra, int nr, int pairs, int32_t* best) {
  ICE_SIMD_DISPATCH(ArgmaxAugDotBf16, x, x_extra, nx, rows_t, ld, row_extra, nr, pairs, best);
}

float QuantizeRowsI8(const float* rows, int nr, int dim, const float* extra, int ld, uint32_t* rows_t) {
  ICE_SIMD_DISPATCH(QuantizeRowsI8, rows, nr, dim, extra, ld, rows_t);
}

int32_t QuantizeKeyI8(const float* key, int dim, float extra, uint32_t* dst, float* scale, int key_max) {
  ICE_SIMD_DISPATCH(QuantizeKeyI8, key, dim, extra, dst, scale, key_max);
}

void ArgmaxDotI8(const uint32_t* x, const int32_t* x_sum, int nx, const uint32_t* rows_t, int ld, int nr, int quads,
                 int32_t* best) {
  ICE_SIMD_DISPATCH(ArgmaxDotI8, x, x_sum, nx, rows_t, ld, nr, quads, best);
}

void ScoreRowsI8(const RowBlocksI8& rows, const uint32_t* qw, int qstride, const int32_t* q_sum, const float* q_scale,
                 int nq, float* out) {
  ICE_SIMD_DISPATCH(ScoreRowsI8, rows.words.data(), rows.scale.data(), rows.quads, rows.rows, qw, qstride, q_sum,
                    q_scale, nq, out);
}

void RowBlocksI8::Reset(int d) {
  dim = d;
  quads = (d + 3) / 4;
  rows = 0;
  words.clear();
  scale.clear();
  max_scale = max_l1 = 0.f;
}

void RowBlocksI8::Append(const float* v) {
  if (rows % 32 == 0) words.resize(words.size() + static_cast<size_t>(quads) * 32, 0x80808080u);
  uint32_t* blk = words.data() + static_cast<size_t>(rows / 32) * quads * 32 + rows % 32;
  const float mx = [&]() -> float { ICE_SIMD_DISPATCH(QuantizeRowI8, v, dim, blk, size_t{32}); }();
  float l1 = 0.f;
  for (int j = 0; j < dim; ++j) l1 += std::fabs(v[j]);
  scale.push_back(mx / 127.f);
  max_scale = std::max(max_scale, mx / 127.f);
  max_l1 = std::max(max_l1, l1);
  ++rows;
}

float KthLargest(const float* v, int n, int k, int32_t* scratch) {
  // Signed-int image preserving float order: negative floats have their magnitude bits flipped.
  for (int i = 0; i < n; ++i) {
    int32_t b;
    std::memcpy(&b, v + i, 4);
    scratch[i] = b ^ ((b >> 31) & 0x7fffffff);
  }
  int64_t lo = INT32_MIN, hi = INT32_MAX;  // invariant: count(>= lo) >= k
  while (lo < hi) {
    const int32_t mid = static_cast<int32_t>(lo + (hi - lo + 1) / 2);
    int cnt = 0;
    for (int i = 0; i < n; ++i) cnt += scratch[i] >= mid;
    if (cnt >= k) lo = mid; else hi = mid - 1;
  }
  const int32_t key = static_cast<int32_t>(lo);
  const int32_t b = key ^ ((key >> 31) & 0x7fffffff);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

}  // namespace icecache::kvstore
