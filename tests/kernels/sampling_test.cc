#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

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
        {2.f, 1, 0.5f}, {1.f, 100000, 0.01f}}) {
    auto got = TopKTopPCandidates({dl.as<float>(), 50000, temperature, top_k, top_p}, b);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const auto want = NaiveCandidates(logits, temperature, top_k, top_p);
    const std::string name = std::string(BackendName(b)) + " T=" + std::to_string(temperature) +
                             " k=" + std::to_string(top_k) + " p=" + std::to_string(top_p);
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

TEST(TopKTopPTest, RejectsBadTopP) {
  float l[2] = {0, 1};
  EXPECT_EQ(TopKTopPCandidates({l, 2, 1.f, 0, 0.f}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TopKTopPCandidates({l, 2, 1.f, 0, 1.5f}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace icecache::kernels
