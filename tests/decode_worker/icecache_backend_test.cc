// The decode worker's IceCache attention backend against a naive attention over all tokens.
#include "decode_worker/icecache_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "kernels/device_buffer.h"
#include "kvstore/retriever.h"

namespace icecache::decode {
namespace {

constexpr int kLayers = 3, kQHeads = 4, kKvHeads = 2, kHeadDim = 8, kPage = 4;

model::AttentionShape Shape() {
  model::AttentionShape s;
  s.num_layers = kLayers;
  s.num_q_heads = kQHeads;
  s.num_kv_heads = kKvHeads;
  s.head_dim = kHeadDim;
  s.scale = 1.f / std::sqrt(static_cast<float>(kHeadDim));
  return s;
}

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// out[h] = softmax(scale q_h . K_g) V_g over every token, g = h / group.
std::vector<float> NaiveAttention(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, int n) {
  std::vector<float> out(kQHeads * kHeadDim, 0.f);
  const float scale = Shape().scale;
  for (int h = 0; h < kQHeads; ++h) {
    int g = h / (kQHeads / kKvHeads);
    std::vector<double> s(n);
    double m = -1e30;
    for (int t = 0; t < n; ++t) {
      double dot = 0;
      for (int d = 0; d < kHeadDim; ++d) dot += q[h * kHeadDim + d] * k[(t * kKvHeads + g) * kHeadDim + d];
      s[t] = dot * scale;
      m = std::max(m, s[t]);
    }
    double z = 0;
    for (int t = 0; t < n; ++t) z += (s[t] = std::exp(s[t] - m));
    for (int t = 0; t < n; ++t) {
      for (int d = 0; d < kHeadDim; ++d) out[h * kHeadDim + d] += s[t] / z * v[(t * kKvHeads + g) * kHeadDim + d];
    }
  }
  return out;
}

class BackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kvstore::PagePoolOptions po;
    po.page_size = kPage;
    po.head_dim = kHeadDim;
    po.dtype = kernels::DType::kF32;
    po.num_pages = 4096;
    auto pool = kvstore::PagePool::Create(po);
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
  }

  // The backend on the CPU; device_cache_pages > 0 routes attention through the device page cache.
  std::unique_ptr<IceCacheBackend> NewBackend(int device_cache_pages = 0) {
    IceCacheBackendOptions o;
    o.device = kernels::Device{kernels::Backend::kCpu, 0};
    o.device_cache_pages = device_cache_pages;
    auto b = IceCacheBackend::Create(Shape(), pool_.get(), o);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return std::move(*b);
  }

  // Builds a sequence of n random tokens (keys/values per layer kept in k_/v_) and imports it.
  // A sequence of n tokens with keys and values k[l], v[l] ([n, kv heads, head_dim]), built in
  // pool_ (1 sink + 2 window pages, the layout `mode` selects from).
  std::unique_ptr<kvstore::SequenceCache> BuildCache(const std::vector<std::vector<float>>& k,
                                                     const std::vector<std::vector<float>>& v, int n, int dense_layers,
                                                     kvstore::RetrievalMode mode = kvstore::RetrievalMode::kSparse) {
    std::vector<const float*> kp, vp;
    for (int l = 0; l < kLayers; ++l) {
      kp.push_back(k[l].data());
      vp.push_back(v[l].data());
    }
    kvstore::SequenceCacheOptions o;
    o.num_layers = kLayers;
    o.num_kv_heads = kKvHeads;
    o.dense_layers = dense_layers;
    o.sink_pages = 1;
    o.window_pages = 2;
    o.layout = kvstore::LayoutFor(mode);
    auto cache = kvstore::SequenceCache::Create(o, pool_.get());
    EXPECT_TRUE(cache.ok()) << cache.status().ToString();
    if (!cache.ok()) return nullptr;
    Status st = (*cache)->Build(kp.data(), vp.data(), n);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return st.ok() ? std::move(*cache) : nullptr;
  }

  // n random tokens per layer: [n, kv heads, head_dim] keys and values.
  static void RandomKv(int n, std::mt19937& rng, std::vector<std::vector<float>>* k, std::vector<std::vector<float>>* v) {
    k->assign(kLayers, {});
    v->assign(kLayers, {});
    for (int l = 0; l < kLayers; ++l) {
      (*k)[l] = Random(static_cast<size_t>(n) * kKvHeads * kHeadDim, rng);
      (*v)[l] = Random(static_cast<size_t>(n) * kKvHeads * kHeadDim, rng);
    }
  }

  // Builds a sequence of n random tokens (keys/values per layer kept in k_/v_) and imports it.
  void Import(IceCacheBackend& b, model::SequenceId id, int n, int dense_layers, int budget,
              kvstore::RetrievalMode mode = kvstore::RetrievalMode::kSparse) {
    std::mt19937 rng(static_cast<uint32_t>(id * 31 + n));
    RandomKv(n, rng, &k_, &v_);
    auto cache = BuildCache(k_, v_, n, dense_layers, mode);
    ASSERT_TRUE(cache != nullptr);
    Status s = b.Import(id, std::move(cache), budget, mode);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // Imports a sequence with the given keys and values (k[l], v[l]: [n, kv heads, head_dim]).
  void ImportKeys(IceCacheBackend& b, model::SequenceId id, const std::vector<std::vector<float>>& k,
                  const std::vector<std::vector<float>>& v, int n, int dense_layers, int budget) {
    auto cache = BuildCache(k, v, n, dense_layers);
    ASSERT_TRUE(cache != nullptr);
    ASSERT_TRUE(b.Import(id, std::move(cache), budget).ok());
  }

  // One decode step of one sequence; returns the max |out - naive| over all layers.
  float StepAndCompare(IceCacheBackend& b, model::SequenceId id, std::mt19937& rng) {
    model::StepSegment seg{id, 1};
    EXPECT_TRUE(b.BeginStep(std::span(&seg, 1)).ok());
    float worst = 0.f;
    const int n = *b.SequenceLength(id);
    for (int l = 0; l < kLayers; ++l) {
      auto q = Random(kQHeads * kHeadDim, rng);
      auto kn = Random(kKvHeads * kHeadDim, rng);
      auto vn = Random(kKvHeads * kHeadDim, rng);
      std::vector<float> out(kQHeads * kHeadDim);
      Status s = b.Attend(l, q.data(), kn.data(), vn.data(), out.data());
      EXPECT_TRUE(s.ok()) << s.ToString();
      k_[l].insert(k_[l].end(), kn.begin(), kn.end());
      v_[l].insert(v_[l].end(), vn.begin(), vn.end());
      auto ref = NaiveAttention(q, k_[l], v_[l], n + 1);
      for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - ref[i]));
    }
    b.EndStep(true);
    return worst;
  }

  std::unique_ptr<kvstore::PagePool> pool_;
  std::vector<std::vector<float>> k_, v_;
};

TEST_F(BackendTest, FullAttentionMatchesNaive) {
  auto owned = NewBackend();
  IceCacheBackend& b = *owned;
  Import(b, 1, 37, /*dense_layers=*/kLayers, /*budget=*/0);
  std::mt19937 rng(1);
  for (int step = 0; step < 10; ++step) {
    EXPECT_LT(StepAndCompare(b, 1, rng), 1e-4f) << "step " << step;  // fp32 accumulation order
  }
  EXPECT_EQ(*b.SequenceLength(1), 47);
  EXPECT_EQ(b.Stats(1)->pages_fetched, 0);
}

TEST_F(BackendTest, BudgetCoveringEveryPageIsExactAcrossWindowEvictions) {
  auto owned = NewBackend();
  IceCacheBackend& b = *owned;
  Import(b, 2, 150, /*dense_layers=*/1, /*budget=*/1000);
  std::mt19937 rng(2);
  // 20 steps of page size 4 move several window pages into the trees.
  for (int step = 0; step < 20; ++step) EXPECT_LT(StepAndCompare(b, 2, rng), 1e-4f) << "step " << step;
  EXPECT_GT(b.Stats(2)->pages_fetched, 0);
}

TEST_F(BackendTest, SmallBudgetAttendsAtMostBudgetPages) {
  auto owned = NewBackend();
  IceCacheBackend& b = *owned;
  Import(b, 3, 200, /*dense_layers=*/1, /*budget=*/6);
  std::mt19937 rng(3);
  const int steps = 8;
  for (int step = 0; step < steps; ++step) {
    float err = StepAndCompare(b, 3, rng);
    EXPECT_TRUE(std::isfinite(err));
  }
  // 2 sparse layers x 2 kv heads per step, at most 6 pages each.
  EXPECT_LE(b.Stats(3)->pages_fetched, steps * 2 * kKvHeads * 6);
  EXPECT_GE(b.Stats(3)->pages_fetched, steps * 2 * kKvHeads * 4);
  EXPECT_GT(b.Stats(3)->retrieval_seconds, 0.0);
}

// The rest estimate (kvstore::RetrievalPolicy::estimate_rest, on by default) merged into the
// paged result: each step's output is softmax over the selected pages' tokens, one pseudo-token per
// tree leaf left out (its mean key with weight log n, its mean value) and the step's own token,
// computed here in fp64 from a copy of the sequence (SequenceCache::Clone) that receives the same
// tokens, so its selection is the backend's, across window pushes into the trees. Without the
// estimate the same selection gives attention over the selected tokens alone.
TEST_F(BackendTest, RestEstimateMergesTheLeftOutLeavesIntoTheAttention) {
  const int n = 200, budget = 6;
  std::mt19937 rng(21);
  std::vector<std::vector<float>> k, v;
  RandomKv(n, rng, &k, &v);
  std::unique_ptr<kvstore::SequenceCache> cache = BuildCache(k, v, n, /*dense_layers=*/1);
  ASSERT_TRUE(cache != nullptr);
  auto mirror = cache->Clone();
  ASSERT_TRUE(mirror.ok()) << mirror.status().ToString();
  auto backend = NewBackend();
  // The serving policy, but every leaf estimated on its own (the cell form is checked against its
  // rule in tests/kvstore/rest_estimate_test.cc).
  kvstore::RetrievalPolicy policy;
  policy.budget_pages = budget;
  policy.rest_cells = 0;
  ASSERT_TRUE(backend->Import(1, std::move(cache), policy).ok());
  policy.scale = Shape().scale;
  const kvstore::Retriever retriever(policy);
  const kvstore::PagePool& pool = *pool_;
  const int group = kQHeads / kKvHeads;
  float worst = 0.f, worst_unmerged = 0.f;
  for (int step = 0; step < 12; ++step) {  // pages of 4: three window pushes into the trees
    model::StepSegment seg{1, 1};
    ASSERT_TRUE(backend->BeginStep(std::span(&seg, 1)).ok());
    std::vector<std::vector<float>> kn(kLayers), vn(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      auto q = Random(kQHeads * kHeadDim, rng);
      for (float& x : q) x *= 2.f;
      kn[l] = Random(kKvHeads * kHeadDim, rng);
      vn[l] = Random(kKvHeads * kHeadDim, rng);
      std::vector<float> out(kQHeads * kHeadDim);
      Status st = backend->Attend(l, q.data(), kn[l].data(), vn[l].data(), out.data());
      ASSERT_TRUE(st.ok()) << st.ToString();
      kvstore::PageSelection sel;
      ASSERT_TRUE(retriever.Select({mirror->get()}, l, q.data(), kQHeads, &sel).ok());
      EXPECT_EQ(sel.has_rest, l > 0);
      for (int h = 0; h < kQHeads; ++h) {
        const int g = h / group;
        const float* qh = &q[h * kHeadDim];
        // (score, value row) of every key the reference attends to.
        std::vector<double> x;
        std::vector<std::vector<double>> val;
        auto add = [&](const float* key, const float* value, double weight_log) {
          double dot = 0;
          for (int e = 0; e < kHeadDim; ++e) dot += double(qh[e]) * key[e];
          x.push_back(dot * Shape().scale + weight_log);
          val.emplace_back(value, value + kHeadDim);
        };
        std::set<int32_t> taken;
        for (int32_t e = sel.page_indptr[g]; e < sel.page_indptr[g + 1]; ++e) {
          if (sel.tree_leaf[e] >= 0) taken.insert(sel.tree_leaf[e]);
          for (int t = 0; t < sel.page_valid[e]; ++t) {
            add(static_cast<const float*>(pool.KRow(sel.page_ids[e], t)),
                static_cast<const float*>(pool.VRow(sel.page_ids[e], t)), 0.0);
          }
        }
        add(&kn[l][g * kHeadDim], &vn[l][g * kHeadDim], 0.0);  // the step's own token
        const size_t exact = x.size();
        const kvstore::DciTree* tree = (*mirror)->tree(l, g);
        for (int32_t leaf = 0; tree != nullptr && leaf < tree->num_leaves(); ++leaf) {
          const int cnt = tree->leaf_valid(leaf);
          if (taken.count(leaf) || cnt == 0) continue;
          std::vector<float> km(kHeadDim, 0.f), vm(kHeadDim, 0.f);
          for (int e = 0; e < kHeadDim; ++e) {
            double ks = 0, vs = 0;
            for (int t = 0; t < cnt; ++t) {
              ks += static_cast<const float*>(pool.KRow(tree->leaf_page(leaf), t))[e];
              vs += static_cast<const float*>(pool.VRow(tree->leaf_page(leaf), t))[e];
            }
            km[e] = static_cast<float>(ks / cnt);
            vm[e] = static_cast<float>(vs / cnt);
          }
          add(km.data(), vm.data(), std::log(double(cnt)));
        }
        auto softmax_out = [&](size_t count) {
          const double m = *std::max_element(x.begin(), x.begin() + count);
          double z = 0;
          std::vector<double> acc(kHeadDim, 0.0);
          for (size_t i = 0; i < count; ++i) {
            const double w = std::exp(x[i] - m);
            z += w;
            for (int e = 0; e < kHeadDim; ++e) acc[e] += w * val[i][e];
          }
          for (double& a : acc) a /= z;
          return acc;
        };
        const auto want = softmax_out(x.size());
        const auto unmerged = softmax_out(exact);
        for (int e = 0; e < kHeadDim; ++e) {
          worst = std::max(worst, static_cast<float>(std::abs(out[h * kHeadDim + e] - want[e])));
          if (l > 0) worst_unmerged = std::max(worst_unmerged, static_cast<float>(std::abs(out[h * kHeadDim + e] - unmerged[e])));
        }
      }
    }
    backend->EndStep(true);
    std::vector<const float*> kps, vps;
    for (int l = 0; l < kLayers; ++l) {
      kps.push_back(kn[l].data());
      vps.push_back(vn[l].data());
    }
    ASSERT_TRUE((*mirror)->Append(kps.data(), vps.data()).ok());
  }
  EXPECT_LT(worst, 2e-5f);
  EXPECT_GT(worst_unmerged, 1e-3f) << "the estimate changed nothing: the test would not see it missing";
}

// Quest (token-order layout): a budget covering every page is exact as the window slides pages
// into the middle list; a small budget attends to at most the budget.
TEST_F(BackendTest, QuestModeIsExactWithFullBudgetAndBoundedWithSmallOne) {
  auto owned = NewBackend();
  IceCacheBackend& b = *owned;
  Import(b, 9, 150, /*dense_layers=*/1, /*budget=*/1000, kvstore::RetrievalMode::kQuest);
  std::mt19937 rng(9);
  for (int step = 0; step < 20; ++step) EXPECT_LT(StepAndCompare(b, 9, rng), 1e-4f) << "step " << step;
  Import(b, 10, 200, /*dense_layers=*/1, /*budget=*/6, kvstore::RetrievalMode::kQuest);
  for (int step = 0; step < 8; ++step) EXPECT_TRUE(std::isfinite(StepAndCompare(b, 10, rng)));
  EXPECT_LE(b.Stats(10)->pages_fetched, 8 * 2 * kKvHeads * 6);
  EXPECT_GE(b.Stats(10)->pages_fetched, 8 * 2 * kKvHeads * 6 - 2 * kKvHeads);  // all 6 every step
}

TEST_F(BackendTest, ModeThatDoesNotMatchTheLayoutIsRefused) {
  auto owned = NewBackend();
  kvstore::SequenceCacheOptions o;
  o.num_layers = kLayers;
  o.num_kv_heads = kKvHeads;
  o.dense_layers = 1;
  o.sink_pages = 1;
  o.window_pages = 2;
  for (auto layout : {kvstore::SparseLayout::kDciTree, kvstore::SparseLayout::kTokenOrder}) {
    o.layout = layout;
    auto cache = kvstore::SequenceCache::Create(o, pool_.get());
    ASSERT_TRUE(cache.ok());
    const auto wrong = layout == kvstore::SparseLayout::kDciTree ? kvstore::RetrievalMode::kQuest
                                                                 : kvstore::RetrievalMode::kSparse;
    Status s = owned->Import(20, std::move(*cache), 8, wrong);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("token-order"), std::string::npos) << s.message();
  }
  EXPECT_EQ(pool_->used_pages(), 0);
}

TEST_F(BackendTest, RejectsBadUse) {
  auto owned = NewBackend();
  IceCacheBackend& b = *owned;
  Import(b, 4, 10, 1, 8);
  model::StepSegment two{4, 2};
  EXPECT_EQ(b.BeginStep(std::span(&two, 1)).code(), StatusCode::kInvalidArgument);
  model::StepSegment unknown{99, 1};
  EXPECT_EQ(b.BeginStep(std::span(&unknown, 1)).code(), StatusCode::kNotFound);
  EXPECT_EQ(b.AddSequence(5).code(), StatusCode::kFailedPrecondition);
  kvstore::SequenceCacheOptions o;
  o.num_layers = kLayers;
  o.num_kv_heads = kKvHeads;
  o.dense_layers = 1;
  o.sink_pages = 1;
  o.window_pages = 2;
  auto cache = kvstore::SequenceCache::Create(o, pool_.get());
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(b.Import(6, std::move(*cache), /*budget=*/2).code(), StatusCode::kInvalidArgument);
}

TEST_F(BackendTest, RemovingSequencesFreesEveryPage) {
  {
    auto owned = NewBackend();
  IceCacheBackend& b = *owned;
    Import(b, 7, 90, 1, 8);
    std::mt19937 rng(7);
    for (int i = 0; i < 9; ++i) StepAndCompare(b, 7, rng);
    EXPECT_GT(pool_->used_pages(), 0);
    ASSERT_TRUE(b.RemoveSequence(7).ok());
    EXPECT_EQ(pool_->used_pages(), 0);
    Import(b, 8, 30, 1, 8);
  }
  EXPECT_EQ(pool_->used_pages(), 0);  // the destructor frees what is left
}

// The device page cache (the GPU path's residency cache, here with the CPU's memory) must not
// change a single output: a cache of a few slots evicts every step, across window pushes into
// the trees, and still gives bit-identical attention to reading the pool in place.
TEST_F(BackendTest, DevicePageCacheGivesTheSameOutputsAsReadingThePool) {
  auto direct = NewBackend();
  // A step needs ~2 x 50 pages in layer 0 (dense) and 2 x 6 in each sparse layer, ~124 in all:
  // 120 slots force evictions in every step.
  auto cached = NewBackend(/*device_cache_pages=*/120);
  ASSERT_TRUE(direct && cached);
  Import(*direct, 1, 200, /*dense_layers=*/1, /*budget=*/6);
  const auto k_ref = k_, v_ref = v_;
  ImportKeys(*cached, 2, k_ref, v_ref, 200, /*dense_layers=*/1, /*budget=*/6);  // the same keys
  std::mt19937 rng(5);
  for (int step = 0; step < 24; ++step) {  // page size 4: six window pushes into the trees
    model::StepSegment s1{1, 1}, s2{2, 1};
    ASSERT_TRUE(direct->BeginStep(std::span(&s1, 1)).ok());
    ASSERT_TRUE(cached->BeginStep(std::span(&s2, 1)).ok());
    for (int l = 0; l < kLayers; ++l) {
      auto q = Random(kQHeads * kHeadDim, rng);
      auto kn = Random(kKvHeads * kHeadDim, rng);
      auto vn = Random(kKvHeads * kHeadDim, rng);
      std::vector<float> a(kQHeads * kHeadDim), b(kQHeads * kHeadDim);
      ASSERT_TRUE(direct->Attend(l, q.data(), kn.data(), vn.data(), a.data()).ok());
      Status st = cached->Attend(l, q.data(), kn.data(), vn.data(), b.data());
      ASSERT_TRUE(st.ok()) << st.ToString();
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "step " << step << " layer " << l << " i " << i;
    }
    direct->EndStep(true);
    cached->EndStep(true);
  }
  const DevicePageCacheStats st = cached->device_cache_stats();
  EXPECT_GT(st.misses, 124 + 24 * 4);  // the first step's copies, then at least 4 evictions a step
  EXPECT_GT(st.hits, 0);           // pages selected again in the next step stay
  EXPECT_EQ(st.h2d_bytes, st.misses * static_cast<int64_t>(pool_->page_bytes()));
  EXPECT_EQ(st.slots, 120);
  EXPECT_EQ(direct->device_cache_stats().misses, 0);
}

// The token a resident page receives is written into its device copy (StoreKv), so a cache
// large enough for every selected page copies nothing in steps that open no page and push no
// window page into the trees; outputs stay those of reading the pool.
TEST_F(BackendTest, DevicePageCacheKeepsTheGrowingPageResident) {
  auto direct = NewBackend();
  auto cached = NewBackend(/*device_cache_pages=*/4096);
  ASSERT_TRUE(direct && cached);
  // A budget covering every page, so each step selects the same pages (new leaves selected by a
  // changing query would be copied, rightly); 201 tokens: the next token lands mid-page.
  Import(*direct, 1, 201, /*dense_layers=*/1, /*budget=*/1000);
  const auto k_ref = k_, v_ref = v_;
  ImportKeys(*cached, 2, k_ref, v_ref, 201, /*dense_layers=*/1, /*budget=*/1000);
  std::mt19937 rng(9);
  int quiet_steps = 0, push_steps = 0;
  int64_t first_step = 0;
  for (int step = 0; step < 16; ++step) {
    const int64_t pos = 201 + step;  // the position this step's token takes
    const int64_t misses_before = cached->device_cache_stats().misses;
    model::StepSegment s1{1, 1}, s2{2, 1};
    ASSERT_TRUE(direct->BeginStep(std::span(&s1, 1)).ok());
    ASSERT_TRUE(cached->BeginStep(std::span(&s2, 1)).ok());
    for (int l = 0; l < kLayers; ++l) {
      auto q = Random(kQHeads * kHeadDim, rng);
      auto kn = Random(kKvHeads * kHeadDim, rng);
      auto vn = Random(kKvHeads * kHeadDim, rng);
      std::vector<float> a(kQHeads * kHeadDim), b(kQHeads * kHeadDim);
      ASSERT_TRUE(direct->Attend(l, q.data(), kn.data(), vn.data(), a.data()).ok());
      ASSERT_TRUE(cached->Attend(l, q.data(), kn.data(), vn.data(), b.data()).ok());
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "step " << step << " layer " << l << " i " << i;
    }
    direct->EndStep(true);
    cached->EndStep(true);
    // Step s reads the pages as left by step s-1: quiet when neither step s-1's token opened a
    // page nor step s's selection follows a window push (both happen at page boundaries).
    const int64_t copied = cached->device_cache_stats().misses - misses_before;
    if (step == 0) first_step = copied;
    if (step > 0 && (pos - 1) % kPage != 0 && pos % kPage != 0) {
      EXPECT_EQ(copied, 0) << "step " << step;
      ++quiet_steps;
    }
    // After a window push only the tree leaves it wrote (and the new page) are copied again,
    // not every tree page (SequenceCache::pages_changed).
    if (step > 0 && pos % kPage == 1) {
      EXPECT_LT(copied, first_step / 3) << "step " << step;
      ++push_steps;
    }
  }
  EXPECT_GE(quiet_steps, 6);
  EXPECT_GE(push_steps, 3);
}

TEST_F(BackendTest, DevicePageCacheTooSmallForOneSequenceIsResourceExhausted) {
  auto b = NewBackend(/*device_cache_pages=*/10);
  Import(*b, 1, 200, /*dense_layers=*/1, /*budget=*/6);
  model::StepSegment seg{1, 1};
  ASSERT_TRUE(b->BeginStep(std::span(&seg, 1)).ok());
  std::mt19937 rng(1);
  auto q = Random(kQHeads * kHeadDim, rng);
  auto kn = Random(kKvHeads * kHeadDim, rng);
  std::vector<float> out(kQHeads * kHeadDim);
  Status st = b->Attend(0, q.data(), kn.data(), kn.data(), out.data());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("device_cache_pages"), std::string::npos) << st.message();
  b->EndStep(false);
}

// The GPU path: pages gathered into device memory, attention and the token merge on the device,
// against the CPU backend reading the pool in place (within fp32 summation-order tolerance).
TEST_F(BackendTest, CudaMatchesCpu) {
  if (!kernels::CudaAvailable()) GTEST_SKIP() << "no CUDA device: GPU decode backend case skipped";
  auto cpu = NewBackend();
  IceCacheBackendOptions o;
  o.device = kernels::Device{kernels::Backend::kCuda, 0};
  o.device_cache_pages = 120;  // evictions every step, as in the CPU cache test above
  auto gpu = IceCacheBackend::Create(Shape(), pool_.get(), o);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  Import(*cpu, 1, 200, /*dense_layers=*/1, /*budget=*/6);
  ImportKeys(**gpu, 2, k_, v_, 200, /*dense_layers=*/1, /*budget=*/6);  // the same keys
  std::mt19937 rng(9);
  auto upload = [](const std::vector<float>& h) {
    auto b = kernels::DeviceBuffer::Allocate(kernels::Backend::kCuda, h.size() * sizeof(float));
    EXPECT_TRUE(b.ok());
    EXPECT_TRUE(b->CopyFromHost(h.data(), h.size() * sizeof(float)).ok());
    return std::move(*b);
  };
  for (int step = 0; step < 24; ++step) {  // six window pushes into the trees
    model::StepSegment s1{1, 1}, s2{2, 1};
    ASSERT_TRUE(cpu->BeginStep(std::span(&s1, 1)).ok());
    ASSERT_TRUE((*gpu)->BeginStep(std::span(&s2, 1)).ok());
    for (int l = 0; l < kLayers; ++l) {
      auto q = Random(kQHeads * kHeadDim, rng);
      auto kn = Random(kKvHeads * kHeadDim, rng);
      auto vn = Random(kKvHeads * kHeadDim, rng);
      std::vector<float> want(q.size()), got(q.size());
      ASSERT_TRUE(cpu->Attend(l, q.data(), kn.data(), vn.data(), want.data()).ok());
      auto dq = upload(q), dk = upload(kn), dv = upload(vn), dout = upload(got);
      Status st = (*gpu)->Attend(l, dq.as<float>(), dk.as<float>(), dv.as<float>(), dout.as<float>());
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_TRUE(dout.CopyToHost(got.data(), got.size() * sizeof(float)).ok());
      // The same pages are selected (the selection runs on the host from the same q); attention
      // sums differ only in order.
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f) << "step " << step << " layer " << l;
    }
    cpu->EndStep(true);
    (*gpu)->EndStep(true);
  }
  EXPECT_GT((*gpu)->device_cache_stats().misses, 0);
}

TEST_F(BackendTest, CudaWithoutDevicePageCacheIsRefused) {
  IceCacheBackendOptions o;
  o.device = kernels::Device{kernels::Backend::kCuda, 0};
  auto b = IceCacheBackend::Create(Shape(), pool_.get(), o);
  EXPECT_FALSE(b.ok());  // INVALID_ARGUMENT with a GPU, FAILED_PRECONDITION without one
}

}  // namespace
}  // namespace icecache::decode
