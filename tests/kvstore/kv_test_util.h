// Helpers shared by the kvstore tests: pools, per-layer K/V, naive attention.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/status.h"
#include "kernels/simd_target.h"
#include "kvstore/dci_tree.h"
#include "kvstore/page_pool.h"
#include "kvstore/sequence_cache.h"
#include "kvstore/vector_ops.h"

namespace icecache::kvstore::testing {

// fn() once per form of the int8 kernels (ArgmaxDotI8, ScoreRowsI8) on the active target: the
// vpmaddwd form, and on the avx2 target of a CPU with AVX-VNNI the vpdpbusd form too
// (kernels::SetAvxVnniActive), each named in the trace. Restores the setting.
template <typename Fn>
void ForEachInt8Form(Fn&& fn) {
  const bool saved = kernels::AvxVnniActive();
  const bool both = kernels::AvxVnniSupported() && kernels::ActiveSimdTarget() == kernels::SimdTarget::kAvx2;
  for (bool vnni : {false, true}) {
    if (vnni && !both) break;
    SCOPED_TRACE(vnni ? "int8 form: AVX-VNNI" : "int8 form: the target's own");
    ASSERT_TRUE(kernels::SetAvxVnniActive(vnni).ok());
    fn();
  }
  ASSERT_TRUE(kernels::SetAvxVnniActive(saved).ok());
}

inline std::unique_ptr<PagePool> MakePool(int dim, int64_t pages, kernels::DType dt = kernels::DType::kF32, int ps = 16) {
  PagePoolOptions o;
  o.page_size = ps;
  o.head_dim = dim;
  o.dtype = dt;
  o.num_pages = pages;
  return PagePool::Create(o).value();
}

// `tree` as another worker receives it: its pages' bytes copied into new pages of `dst` (same
// geometry) and its wire form deserialized over them. INTERNAL when the form is not read to its
// end or leaves pages unused. The new pages are not freed on an error (a test's pool dies with it).
inline StatusOr<std::unique_ptr<DciTree>> ShipTree(const DciTree& tree, PagePool* dst) {
  WireWriter w;
  tree.Serialize(&w);
  const std::vector<int32_t> src_pages = tree.AllPages();
  std::vector<int32_t> pages;
  ICE_RETURN_IF_ERROR(dst->AllocateMany(static_cast<int64_t>(src_pages.size()), &pages));
  const PagePool* src = tree.pool();
  for (size_t i = 0; i < pages.size(); ++i) std::memcpy(dst->PageK(pages[i]), src->PageK(src_pages[i]), src->page_bytes());
  WireReader r(w.buffer().data(), w.buffer().size());
  size_t used = 0;
  ICE_ASSIGN_OR_RETURN(auto copy, DciTree::Deserialize(&r, dst, pages.data(), pages.size(), &used));
  if (!r.done() || used != pages.size()) return InternalError("ShipTree: the wire form was not read whole");
  return copy;
}

// K/V of a model: [layers][n, nkv, dim].
struct ModelKv {
  int layers = 0, nkv = 0, dim = 0;
  int64_t n = 0;
  std::vector<std::vector<float>> k, v;
  std::vector<const float*> kp, vp;
  const float* K(int l, int64_t t, int h) const { return k[l].data() + (t * nkv + h) * dim; }
  const float* V(int l, int64_t t, int h) const { return v[l].data() + (t * nkv + h) * dim; }
};

inline ModelKv RandomKv(int layers, int nkv, int dim, int64_t n, uint64_t seed) {
  ModelKv m{layers, nkv, dim, n, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  for (int l = 0; l < layers; ++l) {
    m.k.emplace_back(n * nkv * dim);
    m.v.emplace_back(n * nkv * dim);
    for (auto& x : m.k.back()) x = g(rng);
    for (auto& x : m.v.back()) x = g(rng);
  }
  for (int l = 0; l < layers; ++l) {
    m.kp.push_back(m.k[l].data());
    m.vp.push_back(m.v[l].data());
  }
  return m;
}

inline std::vector<float> Rounded(const PagePool& pool, const float* x, int dim) {
  std::vector<uint8_t> tmp(dim * 4);
  std::vector<float> out(dim);
  RowFromF32(pool.dtype(), x, tmp.data(), dim);
  RowToF32(pool.dtype(), tmp.data(), out.data(), dim);
  return out;
}

inline std::vector<float> ReadRow(const PagePool& pool, const void* row, int dim) {
  std::vector<float> out(dim);
  RowToF32(pool.dtype(), row, out.data(), dim);
  return out;
}

// Softmax attention of q over the valid slots of `pages`, read from the pool (a naive paged
// decode attention, independent of kernels/).
inline std::vector<double> PagedAttention(const PagePool& pool, const int32_t* ids, const int32_t* valid, int count,
                                          const float* q, float scale) {
  const int dim = pool.head_dim();
  std::vector<double> scores, out(dim, 0.0);
  std::vector<std::vector<float>> vals;
  for (int i = 0; i < count; ++i)
    for (int s = 0; s < valid[i]; ++s) {
      auto k = ReadRow(pool, pool.KRow(ids[i], s), dim);
      double d = 0;
      for (int j = 0; j < dim; ++j) d += double(k[j]) * q[j];
      scores.push_back(d * scale);
      vals.push_back(ReadRow(pool, pool.VRow(ids[i], s), dim));
    }
  double mx = -1e300, z = 0;
  for (double s : scores) mx = std::max(mx, s);
  for (size_t i = 0; i < scores.size(); ++i) {
    const double w = std::exp(scores[i] - mx);
    z += w;
    for (int j = 0; j < dim; ++j) out[j] += w * vals[i][j];
  }
  for (auto& o : out) o /= z;
  return out;
}

// Dense softmax attention over raw fp32 keys/values (rounded to the pool's dtype first).
inline std::vector<double> DenseAttention(const PagePool& pool, const ModelKv& m, int layer, int head, const float* q,
                                          float scale) {
  const int dim = m.dim;
  std::vector<double> scores(m.n), out(dim, 0.0);
  double mx = -1e300, z = 0;
  for (int64_t t = 0; t < m.n; ++t) {
    auto k = Rounded(pool, m.K(layer, t, head), dim);
    double d = 0;
    for (int j = 0; j < dim; ++j) d += double(k[j]) * q[j];
    scores[t] = d * scale;
    mx = std::max(mx, scores[t]);
  }
  for (int64_t t = 0; t < m.n; ++t) {
    const double w = std::exp(scores[t] - mx);
    z += w;
    auto v = Rounded(pool, m.V(layer, t, head), dim);
    for (int j = 0; j < dim; ++j) out[j] += w * v[j];
  }
  for (auto& o : out) o /= z;
  return out;
}

}  // namespace icecache::kvstore::testing
