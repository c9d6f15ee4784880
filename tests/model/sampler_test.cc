#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include <gtest/gtest.h>

namespace icecache::model {
namespace {

std::vector<float> RandomLogits(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Host logits: the CPU device.
constexpr kernels::Device kHost{kernels::Backend::kCpu, 0};

int Argmax(const std::vector<float>& v) { return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin()); }

TEST(Sampler, GreedyIsArgmaxAndTopK1IsGreedy) {
  for (uint64_t s = 0; s < 20; ++s) {
    auto logits = RandomLogits(1000, s);
    SamplingParams greedy;
    Sampler g(greedy, kHost);
    EXPECT_EQ(*g.Sample(logits, {}), Argmax(logits));
    SamplingParams k1;
    k1.temperature = 1.5f;
    k1.top_k = 1;
    k1.seed = s;
    Sampler k(k1, kHost);
    EXPECT_EQ(*k.Sample(logits, {}), Argmax(logits));
  }
}

TEST(Sampler, SeededRunsAreReproducibleAndSeedsDiffer) {
  auto logits = RandomLogits(500, 3);
  SamplingParams p;
  p.temperature = 1.f;
  p.top_p = 0.95f;
  p.seed = 1234;
  auto draw = [&](SamplingParams params) {
    Sampler s(params, kHost);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(*s.Sample(logits, {}));
    return out;
  };
  EXPECT_EQ(draw(p), draw(p));
  SamplingParams q = p;
  q.seed = 1235;
  EXPECT_NE(draw(p), draw(q));
}

// A sequence continued elsewhere (migration) skips the draws its earlier tokens used: the
// continuation equals the uninterrupted run's tail; without the skip it does not.
TEST(Sampler, SkipDrawsContinuesTheSameRandomStream) {
  auto logits = RandomLogits(500, 9);
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 77;
  Sampler whole(p, kHost);
  std::vector<int32_t> all;
  for (int i = 0; i < 80; ++i) all.push_back(*whole.Sample(logits, {}));
  Sampler resumed(p, kHost);
  resumed.SkipDraws(30);
  Sampler fresh(p, kHost);
  std::vector<int32_t> tail, unskipped;
  for (int i = 0; i < 50; ++i) {
    tail.push_back(*resumed.Sample(logits, {}));
    unskipped.push_back(*fresh.Sample(logits, {}));
  }
  EXPECT_EQ(tail, std::vector<int32_t>(all.begin() + 30, all.end()));
  EXPECT_NE(unskipped, tail);
}

// Empirical frequencies of temperature/top-k/top-p sampling against the exact distribution.
TEST(Sampler, DistributionMatchesTopKTopP) {
  std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 4;
  p.top_p = 0.9f;
  p.seed = 9;
  // Exact: softmax(logits/0.7) over the top 4, then the smallest prefix with mass >= 0.9.
  std::vector<double> w;
  for (int i = 0; i < 4; ++i) w.push_back(std::exp(logits[i] / 0.7));
  double z = w[0] + w[1] + w[2] + w[3];
  std::vector<double> prob;
  double cum = 0;
  for (double x : w) {
    prob.push_back(x / z);
    cum += x / z;
    if (cum >= 0.9) break;
  }
  double kept = 0;
  for (double x : prob) kept += x;
  Sampler s(p, kHost);
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[*s.Sample(logits, {})];
  for (auto& [id, c] : counts) ASSERT_LT(id, static_cast<int>(prob.size())) << "token outside top-k/top-p kept";
  for (size_t i = 0; i < prob.size(); ++i) {
    const double expect = prob[i] / kept;
    // 5 standard deviations of a binomial proportion at n = 40000.
    EXPECT_NEAR(counts[static_cast<int>(i)] / static_cast<double>(n), expect, 5 * std::sqrt(expect * (1 - expect) / n));
  }
}

TEST(Sampler, RepetitionPenalty) {
  std::vector<float> logits = {3.0f, 2.9f, -1.0f, -1.05f};
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  Sampler s(p, kHost);
  std::vector<int32_t> ctx = {0};
  EXPECT_EQ(*s.Sample(logits, ctx), 1);  // 3.0 / 1.5 = 2.0 < 2.9
  std::vector<float> neg = {-1.0f, -1.2f};
  std::vector<int32_t> ctx2 = {0};
  EXPECT_EQ(*s.Sample(neg, ctx2), 1);  // -1.0 * 1.5 = -1.5 < -1.2
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountGeneratedTokensOnly) {
  const std::vector<float> logits = {3.0f, 2.5f, 1.0f};
  const std::vector<int32_t> ctx = {0, 0};  // token 0 twice
  SamplingParams f;
  f.frequency_penalty = 0.3f;  // 3.0 - 2 * 0.3 = 2.4 < 2.5
  Sampler sf(f, kHost);
  EXPECT_EQ(*sf.Sample(logits, ctx, 2), 1);
  EXPECT_EQ(*sf.Sample(logits, ctx, 1), 0);  // one generated occurrence: 2.7
  EXPECT_EQ(*sf.Sample(logits, ctx, 0), 0);  // prompt tokens are not counted
  SamplingParams pr;
  pr.presence_penalty = 0.6f;  // once, whatever the count: 2.4
  Sampler sp(pr, kHost);
  EXPECT_EQ(*sp.Sample(logits, ctx, 2), 1);
  pr.presence_penalty = 0.4f;  // 2.6 > 2.5
  Sampler sp2(pr, kHost);
  EXPECT_EQ(*sp2.Sample(logits, ctx, 2), 0);
  SamplingParams neg;
  neg.frequency_penalty = -1.f;  // negative: encourages repeats
  Sampler sn(neg, kHost);
  const std::vector<int32_t> ctx1 = {2};
  EXPECT_EQ(*sn.Sample(logits, ctx1, 1), 0);  // 1.0 + 1 = 2.0 still below 3.0
  const std::vector<int32_t> ctx3 = {2, 2, 2};
  EXPECT_EQ(*sn.Sample(logits, ctx3, 3), 2);  // 1.0 + 3 = 4.0
  EXPECT_EQ(sf.Sample(logits, ctx, 3).status().code(), StatusCode::kInvalidArgument);  // more than the context
}

TEST(Sampler, LogprobsAreOfTheRawLogits) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, -1.0f};
  SamplingParams p;
  p.frequency_penalty = 5.f;  // changes the choice, not the logprobs
  p.logprobs = 2;
  Sampler s(p, kHost);
  const std::vector<int32_t> ctx = {1};
  ASSERT_EQ(*s.Sample(logits, ctx, 1), 2);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x));
  const double lse = std::log(sum);
  EXPECT_NEAR(s.last_logprobs().logprob, 2.0 - lse, 1e-6);
  EXPECT_EQ(s.last_logprobs().top_ids, (std::vector<int32_t>{1, 2}));
  ASSERT_EQ(s.last_logprobs().top_logprobs.size(), 2u);
  EXPECT_NEAR(s.last_logprobs().top_logprobs[0], 3.0 - lse, 1e-6);
  EXPECT_NEAR(s.last_logprobs().top_logprobs[1], 2.0 - lse, 1e-6);
}

TEST(Sampler, Validation) {
  SamplingParams p;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
  p.temperature = -1;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.frequency_penalty = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.presence_penalty = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.logprobs = 21;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p.logprobs = -2;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p.logprobs = 20;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
  p = {};
  p.top_p = 0;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.max_tokens = 0;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.top_k = -2;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.stop_strings = {""};
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
}

}  // namespace
}  // namespace icecache::model
