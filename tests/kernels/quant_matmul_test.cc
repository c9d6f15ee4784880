// Matmul and Embedding over block-quantised weights (q8_0, q4_0, q4_1; kernels/dtype.h and
// kernels/matmul.h), on every SIMD target CTest runs this binary on, against references in double
// computed from the definitions: the dequantised weights times x (fp32 activations and the GEMM),
// and x rounded per block as quant_activations defines it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "tests/kernels/test_util.h"

namespace icecache::kernels {
namespace {

using testing::ExpectClose;
using testing::RandomVector;
using testing::ToTyped;

constexpr DType kTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1};

struct Case {
  int m, n, k;
  DType t;
  bool bias, accumulate;
  std::string Name() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " " +
           std::string(DTypeName(t)) + (bias ? " bias" : "") + (accumulate ? " acc" : "");
  }
};

std::vector<float> RunQuant(const Case& c, const std::vector<float>& x, const std::vector<uint8_t>& w,
                       const std::vector<float>& bias, const std::vector<float>& y0, QuantActivations mode) {
  std::vector<float> y = y0;
  MatmulParams p;
  p.x = x.data();
  p.w = w.data();
  p.w_dtype = c.t;
  p.bias = c.bias ? bias.data() : nullptr;
  p.y = y.data();
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.accumulate = c.accumulate;
  p.quant_activations = mode;
  const Status s = Matmul(p);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return y;
}

// The levels a side of a rounding mode (kernels/matmul.h).
float Levels(QuantActivations mode) { return mode == QuantActivations::kInt8 ? 127.f : 32767.f; }
const char* ModeName(QuantActivations mode) {
  return mode == QuantActivations::kFp32 ? "fp32" : mode == QuantActivations::kInt8 ? "int8" : "int16";
}

// x rows rounded per block as quant_activations defines it (kernels/matmul.h), as values d_x * q_i.
std::vector<double> RoundedX(const std::vector<float>& x, QuantActivations mode) {
  const float levels = Levels(mode);
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* xb = x.data() + b * 32;
    float a = 0.f;
    for (int i = 0; i < 32; ++i) a = std::max(a, std::fabs(xb[i]));
    const float inv = a > 0.f ? levels / a : 0.f, d = a / levels;
    for (int i = 0; i < 32; ++i) out[b * 32 + i] = static_cast<double>(d) * std::nearbyint(xb[i] * inv);
  }
  return out;
}

std::vector<float> Reference(const Case& c, const std::vector<double>& x, const std::vector<float>& w,
                             const std::vector<float>& bias, const std::vector<float>& y0) {
  std::vector<float> want(y0.size());
  for (int r = 0; r < c.m; ++r) {
    for (int j = 0; j < c.n; ++j) {
      double s = c.bias ? bias[j] : 0.0;
      for (int i = 0; i < c.k; ++i) s += x[static_cast<size_t>(r) * c.k + i] * w[static_cast<size_t>(j) * c.k + i];
      if (c.accumulate) s += y0[static_cast<size_t>(r) * c.n + j];
      want[static_cast<size_t>(r) * c.n + j] = static_cast<float>(s);
    }
  }
  return want;
}

std::vector<Case> Cases() {
  // GEMV rows 1..16 (strips of 4 and their tails), the GEMM from 17 (k in one panel, 576, and in
  // several, 1536 = 2 x 768 and 2080 = 3 blocks of 704/704/672), one-block rows, odd n.
  const int shapes[][3] = {{1, 1, 32},    {1, 130, 576},  {2, 33, 64},    {3, 64, 1536}, {4, 17, 96},
                           {5, 70, 2080}, {8, 9, 576},    {16, 31, 128},  {17, 65, 576}, {40, 33, 1536},
                           {23, 7, 2080}, {200, 19, 64}};
  std::vector<Case> cases;
  int i = 0;
  for (auto& s : shapes) {
    for (DType t : kTypes) {
      cases.push_back({s[0], s[1], s[2], t, i % 2 == 0, i % 3 == 1});
      ++i;
    }
  }
  return cases;
}

// kFp32 activations (and every m > 16): the exact product of the stored weights, within fp32
// rounding of k products (the q4 forms sum n_i x_i with n_i <= 15 before scaling: a few ulps more).
TEST(QuantMatmulTest, Fp32ActivationsGiveTheProductOfTheDequantisedWeights) {
  uint32_t seed = 11;
  for (const Case& c : Cases()) {
    const auto x = RandomVector(static_cast<size_t>(c.m) * c.k, seed++);
    const auto w = ToTyped(c.t, RandomVector(static_cast<size_t>(c.n) * c.k, seed++));
    const auto bias = RandomVector(c.n, seed++);
    const auto y0 = RandomVector(static_cast<size_t>(c.m) * c.n, seed++);
    const std::vector<double> xd(x.begin(), x.end());
    ExpectClose(RunQuant(c, x, w.bytes, bias, y0, QuantActivations::kFp32), Reference(c, xd, w.values, bias, y0),
                1e-5 * std::sqrt(c.k) + 1e-6, 1e-5, c.Name());
  }
}

// kInt16 / kInt8 (m <= 16): the product of the stored weights and x rounded per block (the
// integer sums exact, the scaling and the sum over blocks in fp32), and within the stated bound of
// the exact product; for m > 16 the mode changes nothing.
TEST(QuantMatmulTest, RoundedActivationsGiveTheProductOfTheRoundedValues) {
  uint32_t seed = 211;
  for (QuantActivations mode : {QuantActivations::kInt16, QuantActivations::kInt8}) {
    for (const Case& c : Cases()) {
      const auto x = RandomVector(static_cast<size_t>(c.m) * c.k, seed++);
      const auto w = ToTyped(c.t, RandomVector(static_cast<size_t>(c.n) * c.k, seed++));
      const auto bias = RandomVector(c.n, seed++);
      const auto y0 = RandomVector(static_cast<size_t>(c.m) * c.n, seed++);
      const auto got = RunQuant(c, x, w.bytes, bias, y0, mode);
      if (c.m > 16) {
        EXPECT_EQ(got, RunQuant(c, x, w.bytes, bias, y0, QuantActivations::kFp32)) << c.Name();
        continue;
      }
      ExpectClose(got, Reference(c, RoundedX(x, mode), w.values, bias, y0), 1e-5 * std::sqrt(c.k) + 1e-6, 1e-5,
                  c.Name() + " " + ModeName(mode) + " activations");
      // The rounding bound: per block d_x / 2 * sum |w_i|.
      const std::vector<double> xd(x.begin(), x.end());
      const auto exact = Reference(c, xd, w.values, bias, y0);
      for (int r = 0; r < c.m; ++r) {
        for (int j = 0; j < c.n; ++j) {
          double bound = 1e-5 * std::sqrt(c.k) + 1e-6;
          for (int b = 0; b < c.k / 32; ++b) {
            float a = 0.f;
            double wsum = 0;
            for (int i = 0; i < 32; ++i) {
              a = std::max(a, std::fabs(x[static_cast<size_t>(r) * c.k + b * 32 + i]));
              wsum += std::fabs(w.values[static_cast<size_t>(j) * c.k + b * 32 + i]);
            }
            bound += a / Levels(mode) / 2 * wsum;
          }
          const size_t o = static_cast<size_t>(r) * c.n + j;
          ASSERT_LE(std::fabs(got[o] - exact[o]), bound)
              << c.Name() << " " << ModeName(mode) << " row " << r << " column " << j;
        }
      }
    }
  }
}

// A decode row's arithmetic does not depend on the batch: the rows of 1..16-row calls are equal bit
// for bit, in both numerics (batched decode relies on it).
TEST(QuantMatmulTest, EachRowOfABatchMatchesTheRowAlone) {
  uint32_t seed = 411;
  for (DType t : kTypes) {
    for (QuantActivations mode : {QuantActivations::kFp32, QuantActivations::kInt16, QuantActivations::kInt8}) {
      const int n = 35, k = 576, max_m = 16;
      const auto x = RandomVector(static_cast<size_t>(max_m) * k, seed++);
      const auto w = ToTyped(t, RandomVector(static_cast<size_t>(n) * k, seed++));
      const auto bias = RandomVector(n, seed++);
      auto run = [&](int m, int first) {
        const Case c{m, n, k, t, true, false};
        const std::vector<float> xs(x.begin() + static_cast<size_t>(first) * k,
                                    x.begin() + static_cast<size_t>(first + m) * k);
        return RunQuant(c, xs, w.bytes, bias, std::vector<float>(static_cast<size_t>(m) * n, 0.f), mode);
      };
      const auto full = run(max_m, 0);
      for (int m : {1, 2, 3, 5, 8, 13}) {
        for (int first : {0, max_m - m}) {
          const auto part = run(m, first);
          for (size_t i = 0; i < part.size(); ++i) {
            ASSERT_EQ(part[i], full[static_cast<size_t>(first) * n + i])
                << DTypeName(t) << " " << ModeName(mode) << " m=" << m << " first=" << first << " element " << i;
          }
        }
      }
    }
  }
}

// MatmulGroup's joint loop (q/k/v, gate/up of one x) gives each product's Matmul values, with one
// x row (items of several weight rows, products of 17 rows ending in a partial item) and three.
TEST(QuantMatmulTest, GroupMatchesSeparateProducts) {
  uint32_t seed = 611;
  for (DType t : kTypes) {
    for (QuantActivations mode : {QuantActivations::kFp32, QuantActivations::kInt16, QuantActivations::kInt8}) {
      for (const int m : {1, 3}) {
        const int k = 192;
        const int ns[] = {64, 17, 17};
        const auto x = RandomVector(static_cast<size_t>(m) * k, seed++);
        std::vector<testing::Typed> ws;
        std::vector<std::vector<float>> ys, alone;
        MatmulParams ps[3];
        for (int c = 0; c < 3; ++c) {
          ws.push_back(ToTyped(t, RandomVector(static_cast<size_t>(ns[c]) * k, seed++)));
          ys.emplace_back(static_cast<size_t>(m) * ns[c], 0.f);
        }
        for (int c = 0; c < 3; ++c) {
          ps[c].x = x.data();
          ps[c].w = ws[c].bytes.data();
          ps[c].w_dtype = t;
          ps[c].y = ys[c].data();
          ps[c].m = m;
          ps[c].n = ns[c];
          ps[c].k = k;
          ps[c].quant_activations = mode;
          alone.push_back(RunQuant({m, ns[c], k, t, false, false}, x, ws[c].bytes, {}, ys[c], mode));
        }
        ASSERT_TRUE(MatmulGroup(ps, 3).ok());
        for (int c = 0; c < 3; ++c) EXPECT_EQ(ys[c], alone[c]) << DTypeName(t) << " m=" << m << " product " << c;
      }
    }
  }
}

TEST(QuantMatmulTest, EmbeddingRowsAreTheDequantisedRows) {
  for (DType t : kTypes) {
    const int vocab = 50, dim = 96;
    const auto table = ToTyped(t, RandomVector(static_cast<size_t>(vocab) * dim, 7));
    const std::vector<int32_t> ids = {3, 0, 49, 3};
    std::vector<float> out(ids.size() * dim);
    EmbeddingParams p;
    p.ids = ids.data();
    p.table = table.bytes.data();
    p.table_dtype = t;
    p.out = out.data();
    p.n = static_cast<int>(ids.size());
    p.vocab = vocab;
    p.dim = dim;
    ASSERT_TRUE(Embedding(p).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int d = 0; d < dim; ++d) {
        ASSERT_EQ(out[i * dim + d], table.values[static_cast<size_t>(ids[i]) * dim + d]) << DTypeName(t);
      }
    }
  }
}

// The quantisers keep every value within half a step of the block's grid (plus the fp16 rounding
// of the scale), except q4_0's, whose grid -8d..7d ends a step short of the value of largest
// magnitude's opposite: within a step there. A block of zeros stays zero.
TEST(QuantMatmulTest, QuantisersStayWithinHalfAStep) {
  for (DType t : kTypes) {
    auto v = RandomVector(32 * 64, 9);
    for (int i = 0; i < 32; ++i) v[i] = 0.f;
    const auto q = ToTyped(t, v);
    ASSERT_EQ(q.bytes.size(), DTypeBytes(t, v.size()));
    for (size_t b = 0; b < v.size() / 32; ++b) {
      float lo = v[b * 32], hi = v[b * 32], amax = 0.f;
      for (int i = 0; i < 32; ++i) {
        lo = std::min(lo, v[b * 32 + i]);
        hi = std::max(hi, v[b * 32 + i]);
        amax = std::max(amax, std::fabs(v[b * 32 + i]));
      }
      const double step = t == DType::kQ8_0 ? amax / 127.0 : t == DType::kQ4_0 ? amax / 8.0 : (hi - lo) / 15.0;
      for (int i = 0; i < 32; ++i) {
        const double bound = (t == DType::kQ4_0 ? 1.0 : 0.5) * step * 1.01 + 1e-3 * amax;
        ASSERT_LE(std::fabs(q.values[b * 32 + i] - v[b * 32 + i]), bound)
            << DTypeName(t) << " block " << b << " value " << i;
      }
    }
  }
}

TEST(QuantMatmulTest, BadShapesAndDevicesAreRefused) {
  const std::vector<float> x(40, 1.f);
  std::vector<float> y(4);
  const std::vector<uint8_t> w(4 * 34 * 2);
  MatmulParams p;
  p.x = x.data();
  p.w = w.data();
  p.w_dtype = DType::kQ8_0;
  p.y = y.data();
  p.m = 1;
  p.n = 4;
  p.k = 40;
  Status s = Matmul(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("whole blocks of 32"), std::string::npos) << s.ToString();
  p.k = 32;
  s = Matmul(p, Backend::kCuda);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("CPU only"), std::string::npos) << s.ToString();
  p.bias = x.data();
  p.bias_dtype = DType::kQ4_0;
  EXPECT_EQ(Matmul(p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(DTypeName(DType::kQ4_1)), "q4_1");
  EXPECT_FALSE(ParseDType("q8_0").ok());  // KV caches and tensors take plain types only
  auto parsed = ParseWeightDType("q4_0");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, DType::kQ4_0);
}

}  // namespace
}  // namespace icecache::kernels
