#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "tests/kernels/test_util.h"

namespace icecache::kernels {
namespace {

using testing::RandomVector;

std::vector<int32_t> RunArgmax(Backend b, const std::vector<float>& logits, int rows, int vocab) {
  auto dl = testing::Upload(b, logits);
  auto dout = testing::Upload(b, std::vector<int32_t>(rows, -7));
  const Status s = Argmax({dl.as<float>(), dout.as<int32_t>(), rows, vocab}, b);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return testing::Download<int32_t>(dout, rows);
}

class ArgmaxOnBackend : public testing::BackendTest {};
ICE_INSTANTIATE_ON_BACKENDS(ArgmaxOnBackend);

TEST_P(ArgmaxOnBackend, MatchesNaive) {
  const Backend b = GetParam();
  for (auto [rows, vocab] : {std::pair{1, 1}, {3, 17}, {8, 32000}, {2, 128256}}) {
    auto logits = RandomVector(static_cast<size_t>(rows) * vocab, rows + vocab, -10, 10);
    if (vocab > 3) {
      logits[1] = std::numeric_limits<float>::quiet_NaN();  // never chosen
      logits[2] = 1e9f;
      logits[3] = 1e9f;  // tie: lower index wins
    }
    std::vector<int32_t> want(rows);
    for (int r = 0; r < rows; ++r) {
      int best = -1;
      for (int i = 0; i < vocab; ++i) {
        const float v = logits[static_cast<size_t>(r) * vocab + i];
        if (!std::isnan(v) && (best < 0 || v > logits[static_cast<size_t>(r) * vocab + best])) best = i;
      }
      want[r] = best;
    }
    EXPECT_EQ(RunArgmax(b, logits, rows, vocab), want)
        << BackendName(b) << " rows=" << rows << " vocab=" << vocab;
  }
}

// Naive HF-order reference: temperature, top-k mask, top-p over sorted softmax, renormalise.
SamplingCandidates NaiveCandidates(const std::vector<float>& logits, float temperature, int top_k,
                                   float top_p) {
  const int vocab = static_cast<int>(logits.size());
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const int k = top_k > 0 ? std::min(top_k, vocab) : vocab;
  std::vector<double> e(k);
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += (e[i] = std::exp((logits[order[i]] - logits[order[0]]) / temperature));
  int keep = 0;
  double cum = 0;
  while (keep < k && (keep == 0 || cum < top_p)) cum += e[keep++] / sum;
  SamplingCandidates c;
  double kept = 0;
  for (int i = 0; i < keep; ++i) kept += e[i];
  for (int i = 0; i < keep; ++i) {
    c.ids.push_back(order[i]);
    c.probs.push_back(static_cast<float>(e[i] / kept));
  }
  return c;
}

class TopKTopPOnBackend : public testing::BackendTest {};
ICE_INSTANTIATE_ON_BACKENDS(TopKTopPOnBackend);

TEST_P(TopKTopPOnBackend, MatchesNaive) {
  const Backend b = GetParam();
  const auto logits = RandomVector(50000, 9, -6, 6);
  auto dl = testing::Upload(b, logits);
  for (auto [temperature, top_k, top_p] :
       {std::tuple{1.f, 0, 1.f}, {0.7f, 50, 1.f}, {1.f, 0, 0.9f}, {0.6f, 40, 0.95f},
        {2.f, 1, 0.5f}, {1.f, 100000, 0.01f}, {0.8f, 0, 0.3f}, {0.5f, 100000, 1.f}}) {
    auto got = TopKTopPCandidates({dl.as<float>(), 50000, temperature, top_k, top_p}, b);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    auto want = NaiveCandidates(logits, temperature, top_k, top_p);
    const std::string name = std::string(BackendName(b)) + " T=" + std::to_string(temperature) +
                             " k=" + std::to_string(top_k) + " p=" + std::to_string(top_p);
    if ((top_k <= 0 || top_k >= 50000) && top_p >= 1.f) {
      // Nothing is cut: every id, in id order (the contract), with the naive probabilities.
      SamplingCandidates by_id;
      by_id.ids.resize(50000);
      by_id.probs.resize(50000);
      std::iota(by_id.ids.begin(), by_id.ids.end(), 0);
      for (size_t i = 0; i < want.ids.size(); ++i) by_id.probs[want.ids[i]] = want.probs[i];
      want = by_id;
    }
    ASSERT_EQ(got->ids, want.ids) << name;
    testing::ExpectClose(got->probs, want.probs, 1e-7, 1e-5, name);  // double softmax both sides
    EXPECT_NEAR(std::accumulate(got->probs.begin(), got->probs.end(), 0.0), 1.0, 1e-5) << name;
  }
  auto greedy = TopKTopPCandidates({dl.as<float>(), 50000, 0.f, 0, 1.f}, b);
  ASSERT_TRUE(greedy.ok());
  EXPECT_EQ(greedy->ids, std::vector<int32_t>{static_cast<int32_t>(
                             std::max_element(logits.begin(), logits.end()) - logits.begin())});
  EXPECT_EQ(greedy->probs, std::vector<float>{1.f});
}

// Frequency / presence penalty: the op against a scalar loop over a random row and random counts.
class CountPenaltyOnBackend : public testing::BackendTest {};
ICE_INSTANTIATE_ON_BACKENDS(CountPenaltyOnBackend);

TEST_P(CountPenaltyOnBackend, MatchesScalarReference) {
  const Backend b = GetParam();
  const int vocab = 49152;
  const auto logits = RandomVector(vocab, 21, -8, 8);
  std::mt19937 rng(5);
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(1000);  // distinct
  std::vector<int32_t> counts(ids.size());
  for (auto& c : counts) c = 1 + static_cast<int32_t>(rng() % 40);
  for (auto [frequency, presence] : {std::pair{0.5f, 0.f}, {0.f, 1.5f}, {2.f, -2.f}, {-1.25f, 0.75f}}) {
    auto dl = testing::Upload(b, logits), di = testing::Upload(b, ids), dc = testing::Upload(b, counts);
    CountPenaltyParams p;
    p.logits = dl.as<float>();
    p.ids = di.as<int32_t>();
    p.counts = dc.as<int32_t>();
    p.count = static_cast<int>(ids.size());
    p.vocab = vocab;
    p.frequency = frequency;
    p.presence = presence;
    const Status s = CountPenalty(p, b);
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::vector<float> want = logits;
    for (size_t i = 0; i < ids.size(); ++i) want[ids[i]] -= frequency * static_cast<float>(counts[i]) + presence;
    // One fused multiply-add may differ from the scalar's separate rounding: 1 ulp of ~90.
    testing::ExpectClose(testing::Download<float>(dl, vocab), want, 1e-5, 1e-6,
                         std::string(BackendName(b)) + " f=" + std::to_string(frequency) + " p=" + std::to_string(presence));
  }
}

TEST(CountPenaltyTest, RejectsBadArguments) {
  float l[4] = {0, 1, 2, 3};
  int32_t id = 7, count = 1, zero = 0, ok_id = 1;
  EXPECT_EQ(CountPenalty({l, &id, &count, 1, 4, 1.f, 0.f}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CountPenalty({l, &ok_id, &zero, 1, 4, 1.f, 0.f}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CountPenalty({l, &ok_id, &count, 1, 4, std::numeric_limits<float>::infinity(), 0.f}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(CountPenalty({l, &ok_id, &count, 1, 4, 1.f, 0.5f}).ok());
  EXPECT_FLOAT_EQ(l[1], -0.5f);
}

// log_softmax at the token and the top entries, against a double-precision reference.
class TokenLogprobsOnBackend : public testing::BackendTest {};
ICE_INSTANTIATE_ON_BACKENDS(TokenLogprobsOnBackend);

TEST_P(TokenLogprobsOnBackend, MatchesDoubleLogSoftmax) {
  const Backend b = GetParam();
  for (int vocab : {1, 7, 32000, 128256}) {
    auto logits = RandomVector(vocab, vocab, -12, 12);
    if (vocab > 10) {
      logits[3] = std::numeric_limits<float>::quiet_NaN();  // counts as -inf
      logits[4] = -std::numeric_limits<float>::infinity();
      logits[5] = 40.f;  // dominant
    }
    double mx = -INFINITY;
    for (float x : logits) {
      if (!std::isnan(x)) mx = std::max(mx, static_cast<double>(x));
    }
    double sum = 0;
    for (float x : logits) {
      if (!std::isnan(x)) sum += std::exp(static_cast<double>(x) - mx);
    }
    const double lse = mx + std::log(sum);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    auto key = [&](int i) { return std::isnan(logits[i]) ? -INFINITY : logits[i]; };
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return key(x) > key(y); });
    auto dl = testing::Upload(b, logits);
    const int top = std::min(vocab, kMaxTopLogprobs);
    for (int32_t token : {0, vocab - 1, vocab > 10 ? 5 : 0}) {
      auto got = ComputeTokenLogprobs({dl.as<float>(), vocab, token, top}, b);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      const std::string name = std::string(BackendName(b)) + " vocab=" + std::to_string(vocab);
      // fp32 logit minus an lse good to ~1e-6 relative (CUDA sums in fp32): 1e-4 absolute.
      EXPECT_NEAR(got->logprob, key(token) - lse, 1e-4) << name << " token " << token;
      EXPECT_LE(got->logprob, 1e-6) << name;
      ASSERT_EQ(got->top_ids.size(), static_cast<size_t>(top)) << name;
      ASSERT_EQ(got->top_logprobs.size(), static_cast<size_t>(top)) << name;
      for (int i = 0; i < top; ++i) {
        EXPECT_EQ(got->top_ids[i], order[i]) << name << " rank " << i;
        EXPECT_NEAR(got->top_logprobs[i], key(order[i]) - lse, 1e-4) << name << " rank " << i;
      }
    }
    if (vocab > 10) {
      auto nan_token = ComputeTokenLogprobs({dl.as<float>(), vocab, 3, 0}, b);
      ASSERT_TRUE(nan_token.ok());
      EXPECT_EQ(nan_token->logprob, -std::numeric_limits<float>::infinity());
      EXPECT_TRUE(nan_token->top_ids.empty());
    }
  }
}

TEST(TokenLogprobsTest, RejectsBadArguments) {
  float l[3] = {0, 1, 2};
  EXPECT_EQ(ComputeTokenLogprobs({l, 3, 3, 1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeTokenLogprobs({l, 3, -1, 1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeTokenLogprobs({l, 3, 0, 4}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeTokenLogprobs({nullptr, 3, 0, 1}).status().code(), StatusCode::kInvalidArgument);
}

TEST(TopKTopPTest, RejectsBadTopP) {
  float l[2] = {0, 1};
  EXPECT_EQ(TopKTopPCandidates({l, 2, 1.f, 0, 0.f}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TopKTopPCandidates({l, 2, 1.f, 0, 1.5f}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace icecache::kernels
