// The rest estimate (DciTree::EstimateRest, RetrievalPolicy::estimate_rest): the attention of the
// tree leaves a selection leaves out, estimated from their mean keys and values. What it promises:
// its vector kernels match naive loops on every SIMD target; the estimate equals the formula
// evaluated from the leaves' pages (fp64, means rounded to the pool dtype as stored); the means
// follow insertions and are recomputed from the pages after shipping; the retriever fills
// PageSelection::rest_* for sparse units only, from exactly the leaves it did not select.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "kvstore/dci_tree.h"
#include "kvstore/retriever.h"
#include "kvstore/sequence_cache.h"
#include "kvstore/vector_ops.h"
#include "tests/kvstore/kv_test_util.h"

namespace icecache::kvstore {
namespace {

using testing::MakePool;

TEST(RestEstimateTest, ExpShiftSumMatchesStdExp) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-30.f, 0.f);
  const float m = 2.f;
  for (int n : {1, 7, 16, 37, 200}) {
    std::vector<float> x(n);
    for (float& v : x) v = u(rng) + m;
    x[n / 2] = -std::numeric_limits<float>::infinity();
    if (n > 2) x[n - 1] = m - 90.f;  // below the cut at -87: exactly 0
    std::vector<float> got = x;
    const float sum = ExpShiftSum(got.data(), n, m);
    double want_sum = 0;
    for (int i = 0; i < n; ++i) {
      const double w = double(x[i]) - m >= -87.0 ? std::exp(double(x[i]) - m) : 0.0;
      want_sum += w;
      EXPECT_NEAR(got[i], w, 4e-7 * w) << "n " << n << " i " << i;  // the polynomial's ~1 ulp; zeros exact
    }
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum) << n;
  }
}

TEST(RestEstimateTest, AddWeightedRowsMatchesNaive) {
  std::mt19937 rng(8);
  std::normal_distribution<float> g;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    // dim 5: the per-head loop; 64, 96, 128: the register tiles, whole and with a ragged rest of
    // columns; nq 1-5 and 8: every head count of a tile, and heads in two groups of four.
    for (int dim : {5, 64, 96, 128}) {
      for (int nq : {1, 2, 3, 4, 5, 8}) {
        const int count = 21;
        std::vector<float> x(static_cast<size_t>(count) * dim), w(static_cast<size_t>(nq) * count);
        for (float& v : x) v = g(rng);
        for (float& v : w) v = std::fabs(g(rng));
        w[3] = 0.f;  // a zero weight (a selected leaf) adds nothing
        for (int j = 0; j < nq; ++j) w[j * count + 7] = 0.f;  // a row no head weighs
        std::vector<uint8_t> rows(x.size() * kernels::DTypeSize(dt));
        RowFromF32(dt, x.data(), rows.data(), static_cast<int>(x.size()));
        std::vector<float> back(x.size());
        RowToF32(dt, rows.data(), back.data(), static_cast<int>(x.size()));
        std::vector<float> out(static_cast<size_t>(nq) * dim, 0.5f);
        AddWeightedRows(dt, rows.data(), count, dim, w.data(), nq, out.data());
        for (int j = 0; j < nq; ++j) {
          for (int e = 0; e < dim; ++e) {
            double want = 0.5;
            for (int r = 0; r < count; ++r) want += double(w[j * count + r]) * back[r * dim + e];
            EXPECT_NEAR(out[j * dim + e], want, 1e-4 * (1 + std::fabs(want)) * std::sqrt(count))
                << "dtype " << static_cast<int>(dt) << " dim " << dim << " nq " << nq;
          }
        }
      }
    }
  }
}

// The estimate from the tree's pages, in fp64: every leaf not skipped stands for its tokens as
// one key (their mean, rounded to the pool dtype as the tree stores it) of weight n_l.
void Reference(const DciTree& t, const float* qs, int nq, float scale, int payload, const std::set<int32_t>& skip,
               std::vector<double>* out, std::vector<double>* lse) {
  const PagePool& pool = *t.pool();
  const int d = pool.head_dim();
  out->assign(static_cast<size_t>(nq) * d, 0.0);
  lse->assign(nq, -std::numeric_limits<double>::infinity());
  std::vector<std::vector<float>> km, vm;
  std::vector<int> count;
  for (int32_t l = 0; l < t.num_leaves(); ++l) {
    const int v = t.leaf_valid(l);
    if (skip.count(l) || v == 0) continue;
    std::vector<double> ks(d, 0.0), vs(d, 0.0);
    for (int s = 0; s < v; ++s) {
      const auto k = testing::ReadRow(pool, pool.KRow(t.leaf_page(l, payload), s), d);
      const auto vv = testing::ReadRow(pool, pool.VRow(t.leaf_page(l, payload), s), d);
      for (int e = 0; e < d; ++e) {
        ks[e] += k[e];
        vs[e] += vv[e];
      }
    }
    std::vector<float> kf(d), vf(d);
    for (int e = 0; e < d; ++e) {
      kf[e] = static_cast<float>(ks[e] / v);
      vf[e] = static_cast<float>(vs[e] / v);
    }
    km.push_back(testing::Rounded(pool, kf.data(), d));
    vm.push_back(testing::Rounded(pool, vf.data(), d));
    count.push_back(v);
  }
  for (int j = 0; j < nq; ++j) {
    if (km.empty()) continue;
    std::vector<double> x(km.size());
    double m = -1e300;
    for (size_t i = 0; i < km.size(); ++i) {
      double dot = 0;
      for (int e = 0; e < d; ++e) dot += double(qs[j * d + e]) * km[i][e];
      x[i] = scale * dot + std::log(double(count[i]));
      m = std::max(m, x[i]);
    }
    double z = 0;
    for (double& xi : x) z += (xi = std::exp(xi - m));
    for (size_t i = 0; i < km.size(); ++i)
      for (int e = 0; e < d; ++e) (*out)[j * d + e] += x[i] / z * vm[i][e];
    (*lse)[j] = m + std::log(z);
  }
}

void ExpectEstimate(const DciTree& t, const std::vector<float>& qs, int nq, const std::set<int32_t>& skip,
                    const char* what) {
  SCOPED_TRACE(what);
  const int d = t.pool()->head_dim();
  const float scale = 1.f / std::sqrt(float(d));
  std::vector<double> want_out, want_lse;
  Reference(t, qs.data(), nq, scale, 0, skip, &want_out, &want_lse);
  const std::vector<int32_t> skip_list(skip.begin(), skip.end());
  std::vector<float> out(static_cast<size_t>(nq) * d, 99.f), lse(nq, 99.f);
  t.EstimateRest(qs.data(), nq, scale, 0, skip_list.data(), static_cast<int>(skip_list.size()), 0, out.data(), lse.data());
  for (int j = 0; j < nq; ++j) {
    if (std::isinf(want_lse[j])) {
      EXPECT_TRUE(std::isinf(lse[j]) && lse[j] < 0) << lse[j];
      for (int e = 0; e < d; ++e) EXPECT_EQ(out[j * d + e], 0.f);
      continue;
    }
    EXPECT_NEAR(lse[j], want_lse[j], 1e-4 * (1 + std::fabs(want_lse[j]))) << "head " << j;
    for (int e = 0; e < d; ++e) EXPECT_NEAR(out[j * d + e], want_out[j * d + e], 2e-4) << "head " << j << " e " << e;
  }
}

class RestEstimateOnDtype : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(PoolDtypes, RestEstimateOnDtype, ::testing::Values(DType::kF32, DType::kBF16));

TEST_P(RestEstimateOnDtype, EqualsTheFormulaFromThePagesThroughInsertionsAndShipping) {
  const int d = 64, nq = 3, n0 = 1500, more = 304;  // 19 page-sized blocks
  auto pool = MakePool(d, 4096, GetParam());
  const testing::ModelKv kv = testing::RandomKv(1, 1, d, n0 + more, 5);
  auto tree = DciTree::Build(DciParams::Flat(), pool.get(), 1,
                             TokenBlock{0, n0, kv.kp.data(), kv.vp.data(), static_cast<size_t>(d)});
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  DciTree& t = **tree;
  std::mt19937 rng(9);
  std::normal_distribution<float> g;
  std::vector<float> qs(static_cast<size_t>(nq) * d);
  for (float& x : qs) x = 2.f * g(rng);
  std::set<int32_t> skip = {0, 3, 4, t.num_leaves() - 1};
  ExpectEstimate(t, qs, nq, {}, "built, nothing skipped");
  ExpectEstimate(t, qs, nq, skip, "built, four leaves skipped");
  // Insertions in page-sized blocks, as a window push makes them (leaves grow, new leaves open).
  for (int at = n0; at < n0 + more; at += 16) {
    const float* kp = kv.K(0, at, 0);
    const float* vp = kv.V(0, at, 0);
    ASSERT_TRUE(t.Insert(TokenBlock{at, 16, &kp, &vp, static_cast<size_t>(d)}).ok());
  }
  ExpectEstimate(t, qs, nq, skip, "after insertions");
  // Another worker's copy: the means come back from the shipped pages, bit for bit.
  auto dst = MakePool(d, 4096, GetParam());
  auto copy = testing::ShipTree(t, dst.get());
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  ExpectEstimate(**copy, qs, nq, skip, "shipped");
  const std::vector<int32_t> sl(skip.begin(), skip.end());
  std::vector<float> a(nq * d), b(nq * d), la(nq), lb(nq);
  t.EstimateRest(qs.data(), nq, 0.125f, 0, sl.data(), static_cast<int>(sl.size()), 0, a.data(), la.data());
  (*copy)->EstimateRest(qs.data(), nq, 0.125f, 0, sl.data(), static_cast<int>(sl.size()), 0, b.data(), lb.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
  // Every leaf skipped (or out-of-range ids ignored): nothing is estimated.
  std::set<int32_t> all;
  for (int32_t l = 0; l < t.num_leaves(); ++l) all.insert(l);
  all.insert(t.num_leaves() + 5);
  ExpectEstimate(t, qs, nq, all, "every leaf skipped");
}

// The cell-bounded form (expand_cells > 0): the best cells by their mean key count leaf by leaf,
// every other cell as one group of its tokens (mean key and value weighted by token count); every
// cell holding a skipped leaf is expanded. Checked against the same rule evaluated here from the
// pages (f32 pool: the stored means are the exact means), before and after insertions; with at
// least as many cells as the tree has, it is the all-leaves form bit for bit.
TEST(RestEstimateTest, CellBoundedFormFollowsItsRuleAndCoversEveryToken) {
  const int d = 32, nq = 2, n0 = 3000, more = 320;
  auto pool = MakePool(d, 8192, DType::kF32);
  const testing::ModelKv kv = testing::RandomKv(1, 1, d, n0 + more, 17);
  auto tree = DciTree::Build(DciParams::Flat(), pool.get(), 1,
                             TokenBlock{0, n0, kv.kp.data(), kv.vp.data(), static_cast<size_t>(d)});
  ASSERT_TRUE(tree.ok());
  DciTree& t = **tree;
  std::mt19937 rng(19);
  std::normal_distribution<float> g;
  std::vector<float> qs(static_cast<size_t>(nq) * d);
  for (float& x : qs) x = 2.f * g(rng);
  const float scale = 1.f / std::sqrt(float(d));
  auto check = [&](int expand, const std::vector<int32_t>& skip, const char* what) {
    SCOPED_TRACE(what);
    ASSERT_GT(t.num_cells(), expand);
    // Leaf and cell means from the pages.
    const int32_t n = t.num_leaves(), nc = t.num_cells();
    std::vector<std::vector<double>> lk(n, std::vector<double>(d, 0.0)), lv = lk;
    for (int32_t l = 0; l < n; ++l) {
      for (int s2 = 0; s2 < t.leaf_valid(l); ++s2) {
        const float* kr = static_cast<const float*>(pool->KRow(t.leaf_page(l), s2));
        const float* vr = static_cast<const float*>(pool->VRow(t.leaf_page(l), s2));
        for (int e = 0; e < d; ++e) {
          lk[l][e] += kr[e];
          lv[l][e] += vr[e];
        }
      }
    }
    std::vector<std::vector<double>> ck(nc, std::vector<double>(d, 0.0)), cv = ck;
    std::vector<int> cc(nc, 0);
    for (int32_t l = 0; l < n; ++l) {
      cc[t.leaf_cell(l)] += t.leaf_valid(l);
      for (int e = 0; e < d; ++e) {
        ck[t.leaf_cell(l)][e] += lk[l][e];
        cv[t.leaf_cell(l)][e] += lv[l][e];
      }
    }
    auto score = [&](int j, const std::vector<double>& sum, int cnt) {
      double dot = 0;
      for (int e = 0; e < d; ++e) dot += double(qs[j * d + e]) * sum[e] / cnt;
      return scale * dot + std::log(double(cnt));
    };
    std::vector<std::pair<double, int32_t>> rank;
    for (int32_t c = 0; c < nc; ++c) {
      if (cc[c] == 0) continue;
      double b = -1e300;
      for (int j = 0; j < nq; ++j) b = std::max(b, score(j, ck[c], cc[c]));
      rank.push_back({-b, c});
    }
    std::sort(rank.begin(), rank.end());
    std::set<int32_t> open;
    for (int i = 0; i < expand && i < static_cast<int>(rank.size()); ++i) open.insert(rank[i].second);
    const std::set<int32_t> skipped(skip.begin(), skip.end());
    for (int32_t l : skip) open.insert(t.leaf_cell(l));
    std::vector<float> out(nq * d), lse(nq);
    t.EstimateRest(qs.data(), nq, scale, 0, skip.data(), static_cast<int>(skip.size()), expand, out.data(), lse.data());
    for (int j = 0; j < nq; ++j) {
      std::vector<double> x;
      std::vector<const std::vector<double>*> vs;
      std::vector<int> cnt;
      for (int32_t l = 0; l < n; ++l) {
        if (!open.count(t.leaf_cell(l)) || skipped.count(l) || t.leaf_valid(l) == 0) continue;
        x.push_back(score(j, lk[l], t.leaf_valid(l)));
        vs.push_back(&lv[l]);
        cnt.push_back(t.leaf_valid(l));
      }
      for (int32_t c = 0; c < nc; ++c) {
        if (open.count(c) || cc[c] == 0) continue;
        x.push_back(score(j, ck[c], cc[c]));
        vs.push_back(&cv[c]);
        cnt.push_back(cc[c]);
      }
      const double m = *std::max_element(x.begin(), x.end());
      double z = 0;
      std::vector<double> acc(d, 0.0);
      for (size_t i = 0; i < x.size(); ++i) {
        const double w = std::exp(x[i] - m);
        z += w;
        for (int e = 0; e < d; ++e) acc[e] += w * (*vs[i])[e] / cnt[i];
      }
      EXPECT_NEAR(lse[j], m + std::log(z), 1e-4 * (1 + std::fabs(m)));
      for (int e = 0; e < d; ++e) EXPECT_NEAR(out[j * d + e], acc[e] / z, 1e-4) << "head " << j << " e " << e;
    }
  };
  const std::vector<int32_t> skip = {1, 7, t.num_leaves() / 2};
  check(4, skip, "4 cells expanded");
  check(1, {}, "1 cell expanded, nothing skipped");
  for (int at = n0; at < n0 + more; at += 16) {
    const float* kp = kv.K(0, at, 0);
    const float* vp = kv.V(0, at, 0);
    ASSERT_TRUE(t.Insert(TokenBlock{at, 16, &kp, &vp, static_cast<size_t>(d)}).ok());
  }
  check(4, skip, "after insertions");
  // As many cells as there are (or more): the all-leaves form, bit for bit.
  std::vector<float> a(nq * d), b(nq * d), la(nq), lb(nq);
  t.EstimateRest(qs.data(), nq, scale, 0, skip.data(), 3, 0, a.data(), la.data());
  t.EstimateRest(qs.data(), nq, scale, 0, skip.data(), 3, t.num_cells(), b.data(), lb.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
}

// A sequence of random K/V (seed) built as served: the first layer dense, Flat() trees.
std::unique_ptr<SequenceCache> BuiltCache(PagePool* pool, int layers, int nkv, int d, int n, uint64_t seed) {
  SequenceCacheOptions o;
  o.num_layers = layers;
  o.num_kv_heads = nkv;
  o.dense_layers = 1;
  o.dci = DciParams::Flat();
  auto cache = SequenceCache::Create(o, pool).value();
  const testing::ModelKv kv = testing::RandomKv(layers, nkv, d, n, seed);
  EXPECT_TRUE(cache->Build(kv.kp.data(), kv.vp.data(), n).ok());
  return cache;
}

// Through the retriever: sparse units carry the estimate over exactly the leaves they did not
// select, dense layers and a budget that takes every leaf carry none, and the policy turns it off.
TEST(RestEstimateTest, RetrieverEstimatesTheLeavesItLeavesOut) {
  const int layers = 3, nkv = 2, d = 32, nq = 4, n = 700;
  auto pool = MakePool(d, 4096, DType::kBF16);
  auto cache = BuiltCache(pool.get(), layers, nkv, d, n, 3);
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::mt19937 rng(4);
  std::normal_distribution<float> g;
  std::vector<float> q(static_cast<size_t>(nq) * d);
  for (float& x : q) x = g(rng);
  const int group = nq / nkv;
  RetrievalPolicy policy;
  policy.budget_pages = 8;
  ASSERT_TRUE(policy.estimate_rest);  // the serving default
  Retriever r(policy);
  PageSelection sel;
  ASSERT_TRUE(r.Select({cache.get()}, 0, q.data(), nq, &sel).ok());
  EXPECT_FALSE(sel.has_rest) << "a dense layer has nothing left out";
  EXPECT_TRUE(sel.rest_lse.empty());
  for (int layer = 1; layer < layers; ++layer) {
    ASSERT_TRUE(r.Select({cache.get()}, layer, q.data(), nq, &sel).ok());
    ASSERT_TRUE(sel.has_rest);
    ASSERT_EQ(sel.rest_out.size(), static_cast<size_t>(nq) * d);
    for (int g2 = 0; g2 < nkv; ++g2) {
      std::vector<int32_t> taken;
      for (int32_t e = sel.page_indptr[g2]; e < sel.page_indptr[g2 + 1]; ++e)
        if (sel.tree_leaf[e] >= 0) taken.push_back(sel.tree_leaf[e]);
      EXPECT_EQ(taken.size(), 4u);  // 8 pages - 2 sink - 2 window
      const DciTree* t = cache->tree(layer, g2);
      std::vector<float> out(static_cast<size_t>(group) * d), lse(group);
      t->EstimateRest(q.data() + g2 * group * d, group, 1.f / std::sqrt(float(d)), 0, taken.data(),
                      static_cast<int>(taken.size()), policy.rest_cells, out.data(), lse.data());
      for (int j = 0; j < group; ++j) {
        EXPECT_EQ(sel.rest_lse[g2 * group + j], lse[j]);
        for (int e = 0; e < d; ++e) EXPECT_EQ(sel.rest_out[(g2 * group + j) * d + e], out[j * d + e]);
      }
    }
  }
  // A budget that holds every leaf leaves nothing out; the policy can turn the estimate off.
  RetrievalPolicy all = policy;
  all.budget_pages = 1000;
  ASSERT_TRUE(Retriever(all).Select({cache.get()}, 1, q.data(), nq, &sel).ok());
  EXPECT_FALSE(sel.has_rest);
  RetrievalPolicy off = policy;
  off.estimate_rest = false;
  ASSERT_TRUE(Retriever(off).Select({cache.get()}, 1, q.data(), nq, &sel).ok());
  EXPECT_FALSE(sel.has_rest);
  EXPECT_TRUE(sel.rest_out.empty());
  // A sparse layer without a query is refused (by the selection itself).
  EXPECT_EQ(r.Select({cache.get()}, 1, nullptr, nq, &sel).code(), StatusCode::kInvalidArgument);
}

// A batch whose trees hold at least kParallelSelectTokens tokens selects its units on the OpenMP
// threads; each sequence alone stays below the threshold and selects serially. Both give the same
// pages, leaves and estimates, bit for bit.
TEST(RestEstimateTest, ParallelBatchSelectionEqualsEachSequenceAlone) {
  const int layers = 2, nkv = 3, d = 32, nq = 6, n = 5600;  // 3 x 5600 per sequence < 32768 <= both
  ASSERT_LT(nkv * n, kParallelSelectTokens);
  ASSERT_GE(2 * nkv * n, kParallelSelectTokens);
  auto pool = MakePool(d, 16384, DType::kBF16);
  std::vector<std::unique_ptr<SequenceCache>> caches;
  for (int b = 0; b < 2; ++b) caches.push_back(BuiltCache(pool.get(), layers, nkv, d, n, 10 + b));
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  std::vector<float> q(static_cast<size_t>(2) * nq * d);
  for (float& x : q) x = g(rng);
  RetrievalPolicy policy;
  policy.budget_pages = 8;
  Retriever r(policy);
  PageSelection both, alone;
  ASSERT_TRUE(r.Select({caches[0].get(), caches[1].get()}, 1, q.data(), nq, &both).ok());
  ASSERT_TRUE(both.has_rest);
  for (int b = 0; b < 2; ++b) {
    ASSERT_TRUE(r.Select({caches[b].get()}, 1, q.data() + static_cast<size_t>(b) * nq * d, nq, &alone).ok());
    ASSERT_TRUE(alone.has_rest);
    const int32_t first = both.page_indptr[b * nkv], last = both.page_indptr[(b + 1) * nkv];
    ASSERT_EQ(last - first, alone.page_indptr[nkv]);
    for (int32_t e = first; e < last; ++e) {
      EXPECT_EQ(both.page_ids[e], alone.page_ids[e - first]);
      EXPECT_EQ(both.page_valid[e], alone.page_valid[e - first]);
      EXPECT_EQ(both.tree_leaf[e], alone.tree_leaf[e - first]);
    }
    for (int j = 0; j < nq; ++j) {
      EXPECT_EQ(both.rest_lse[b * nq + j], alone.rest_lse[j]);
      for (int e = 0; e < d; ++e) EXPECT_EQ(both.rest_out[(static_cast<size_t>(b) * nq + j) * d + e], alone.rest_out[j * d + e]);
    }
  }
}

}  // namespace
}  // namespace icecache::kvstore
