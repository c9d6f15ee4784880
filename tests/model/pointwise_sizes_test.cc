// The model's pointwise ops at decode sizes (run on the caller's thread) and prefill sizes (run
// by the OpenMP team; kernels/cpu/pointwise_cpu.cc switches at 64K elements) against naive
// double-precision references, so both paths are covered.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"

namespace icecache::model {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Decode (batch 8) and prefill (256 tokens) row counts for a 768-wide model.
constexpr int kRowCounts[] = {1, 8, 256};

TEST(PointwiseSizes, RmsNormMatchesNaive) {
  const int dim = 768;
  for (int rows : kRowCounts) {
    const auto x = Random(static_cast<size_t>(rows) * dim, rows, -3, 3);
    const auto w = Random(dim, 99, 0.5f, 1.5f);
    std::vector<float> y(x.size());
    kernels::RmsNormParams p;
    p.x = x.data();
    p.weight = w.data();
    p.weight_dtype = kernels::DType::kF32;
    p.y = y.data();
    p.rows = rows;
    p.dim = dim;
    p.eps = 1e-5f;
    ASSERT_TRUE(kernels::RmsNorm(p).ok());
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int i = 0; i < dim; ++i) {
        // fp32 sum of 768 squares: relative error well under 1e-5.
        const double want = x[r * dim + i] * inv * w[i];
        ASSERT_NEAR(y[r * dim + i], want, 1e-5 * std::abs(want) + 1e-6) << "rows " << rows << " r " << r << " i " << i;
      }
    }
  }
}

TEST(PointwiseSizes, SwiGluMatchesNaive) {
  const int inter = 2048;
  for (int rows : kRowCounts) {
    const size_t n = static_cast<size_t>(rows) * inter;
    const auto g = Random(n, 2 * rows, -8, 8);
    const auto u = Random(n, 2 * rows + 1, -2, 2);
    std::vector<float> out(n);
    kernels::SwiGluParams p;
    p.gate = g.data();
    p.up = u.data();
    p.out = out.data();
    p.n = static_cast<long>(n);
    ASSERT_TRUE(kernels::SwiGlu(p).ok());
    for (size_t i = 0; i < n; ++i) {
      const double want = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
      // fp32 exp and division: a few ulps.
      ASSERT_NEAR(out[i], want, 1e-5 * std::abs(want) + 1e-6) << "rows " << rows << " i " << i;
    }
  }
}

TEST(PointwiseSizes, RopeMatchesNaive) {
  const int heads = 12, head_dim = 64, half = head_dim / 2;
  kernels::RopeConfig rc;
  rc.rotary_dim = head_dim;
  const std::vector<float> inv = kernels::ComputeRopeInvFreq(rc);
  for (int tokens : kRowCounts) {
    std::vector<int> pos(tokens);
    for (int t = 0; t < tokens; ++t) pos[t] = 100 + 3 * t;
    const auto x0 = Random(static_cast<size_t>(tokens) * heads * head_dim, 3 * tokens, -2, 2);
    std::vector<float> x = x0;
    kernels::RopeParams p;
    p.x = x.data();
    p.positions = pos.data();
    p.inv_freq = inv.data();
    p.tokens = tokens;
    p.heads = heads;
    p.head_dim = head_dim;
    p.rotary_dim = head_dim;
    ASSERT_TRUE(kernels::ApplyRope(p).ok());
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < heads; ++h) {
        const size_t base = (static_cast<size_t>(t) * heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          // The angle is the fp32 product (as in transformers); cos/sin in double.
          const double a = static_cast<float>(pos[t]) * inv[i];
          const double x1 = x0[base + i], x2 = x0[base + i + half];
          // Same fp32 angle; fp32 sin/cos and products on |x| <= 2: a few 1e-7.
          ASSERT_NEAR(x[base + i], x1 * std::cos(a) - x2 * std::sin(a), 1e-5) << tokens << " " << t << " " << h << " " << i;
          ASSERT_NEAR(x[base + i + half], x2 * std::cos(a) + x1 * std::sin(a), 1e-5)
              << tokens << " " << t << " " << h << " " << i;
        }
      }
    }
  }
}

TEST(PointwiseSizes, ArgmaxOneAndManyRowsMatchNaive) {
  const int vocab = 32000;
  for (int rows : {1, 8}) {
    const auto logits = Random(static_cast<size_t>(rows) * vocab, 5 * rows, -10, 10);
    std::vector<int32_t> got(rows, -1);
    kernels::ArgmaxParams p;
    p.logits = logits.data();
    p.out = got.data();
    p.rows = rows;
    p.vocab = vocab;
    ASSERT_TRUE(kernels::Argmax(p).ok());
    for (int r = 0; r < rows; ++r) {
      int best = 0;
      for (int i = 1; i < vocab; ++i) {
        if (logits[r * vocab + i] > logits[r * vocab + best]) best = i;
      }
      EXPECT_EQ(got[r], best) << "rows " << rows << " r " << r;
    }
  }
}

}  // namespace
}  // namespace icecache::model
