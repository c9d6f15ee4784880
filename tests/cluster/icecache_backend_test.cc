// The decode worker's IceCache attention backend against a naive attention over all tokens.
#include "decode_worker/icecache_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

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

  // Builds a sequence of n random tokens (keys/values per layer kept in k_/v_) and imports it.
  void Import(IceCacheBackend& b, model::SequenceId id, int n, int dense_layers, int budget) {
    std::mt19937 rng(static_cast<uint32_t>(id * 31 + n));
    k_.assign(kLayers, {});
    v_.assign(kLayers, {});
    std::vector<const float*> kp, vp;
    for (int l = 0; l < kLayers; ++l) {
      k_[l] = Random(static_cast<size_t>(n) * kKvHeads * kHeadDim, rng);
      v_[l] = Random(static_cast<size_t>(n) * kKvHeads * kHeadDim, rng);
      kp.push_back(k_[l].data());
      vp.push_back(v_[l].data());
    }
    kvstore::SequenceCacheOptions o;
    o.num_layers = kLayers;
    o.num_kv_heads = kKvHeads;
    o.dense_layers = dense_layers;
    o.sink_pages = 1;
    o.window_pages = 2;
    auto cache = kvstore::SequenceCache::Create(o, pool_.get());
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    ASSERT_TRUE((*cache)->Build(kp.data(), vp.data(), n).ok());
    Status s = b.Import(id, std::move(*cache), budget);
    ASSERT_TRUE(s.ok()) << s.ToString();
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
  IceCacheBackend b(Shape(), pool_.get());
  Import(b, 1, 37, /*dense_layers=*/kLayers, /*budget=*/0);
  std::mt19937 rng(1);
  for (int step = 0; step < 10; ++step) {
    EXPECT_LT(StepAndCompare(b, 1, rng), 1e-4f) << "step " << step;  // fp32 accumulation order
  }
  EXPECT_EQ(*b.SequenceLength(1), 47);
  EXPECT_EQ(b.Stats(1)->pages_fetched, 0);
}

TEST_F(BackendTest, BudgetCoveringEveryPageIsExactAcrossWindowEvictions) {
  IceCacheBackend b(Shape(), pool_.get());
  Import(b, 2, 150, /*dense_layers=*/1, /*budget=*/1000);
  std::mt19937 rng(2);
  // 20 steps of page size 4 move several window pages into the trees.
  for (int step = 0; step < 20; ++step) EXPECT_LT(StepAndCompare(b, 2, rng), 1e-4f) << "step " << step;
  EXPECT_GT(b.Stats(2)->pages_fetched, 0);
}

TEST_F(BackendTest, SmallBudgetAttendsAtMostBudgetPages) {
  IceCacheBackend b(Shape(), pool_.get());
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

TEST_F(BackendTest, RejectsBadUse) {
  IceCacheBackend b(Shape(), pool_.get());
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
  EXPECT_EQ(b.Import(6, std::move(*cache), /*budget=*/3).code(), StatusCode::kInvalidArgument);
}

TEST_F(BackendTest, RemovingSequencesFreesEveryPage) {
  {
    IceCacheBackend b(Shape(), pool_.get());
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

}  // namespace
}  // namespace icecache::decode
