// RMSNorm, RoPE (inverse frequencies and rotation), SwiGLU, Add, Embedding, dtype conversions.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "tests/kernels/test_util.h"

namespace icecache::kernels {
namespace {

#include "tests/kernels/rope_reference.inc"

using testing::ExpectClose;
using testing::RandomVector;
using testing::ToTyped;

// --- dtype -----------------------------------------------------------------------------------

TEST(DTypeTest, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = F16ToF32(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
      continue;
    }
    ASSERT_EQ(F32ToF16(f), bits) << "half bits " << h << " value " << f;
  }
}

TEST(DTypeTest, F16RoundsToNearestEven) {
  // Exact values from IEEE half: 1 + 2^-10 is the next half after 1; halfway rounds to even.
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);           // tie -> even (1.0)
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);       // tie -> even (1+2^-9)
  EXPECT_EQ(F32ToF16(65504.f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.f), 0x7c00);                                // overflow to inf
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);                  // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);                  // tie -> even (0)
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(F32ToF16(-0.f), 0x8000);
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);   // tie -> even
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  std::vector<float> v = {0.1f, -3.5f, 1e30f, 7.f};
  std::vector<uint16_t> b(v.size());
  std::vector<float> back(v.size());
  ConvertFromF32(DType::kBF16, v.data(), b.data(), v.size());
  ConvertToF32(DType::kBF16, b.data(), back.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(back[i], v[i], std::fabs(v[i]) * (1.0 / 256));
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
}

// --- RMSNorm ---------------------------------------------------------------------------------

std::vector<float> RunRmsNorm(Backend backend, const std::vector<float>& x, const testing::Typed& w,
                              DType t, int rows, int dim, bool in_place) {
  auto dx = testing::Upload(backend, x);
  auto dw = testing::Upload(backend, w.bytes);
  auto dy = testing::Upload(backend, std::vector<float>(x.size(), 9.f));
  RmsNormParams p;
  p.x = dx.as<float>();
  p.weight = dw.data();
  p.weight_dtype = t;
  p.y = in_place ? dx.as<float>() : dy.as<float>();
  p.rows = rows;
  p.dim = dim;
  p.eps = 1e-5f;
  const Status s = RmsNorm(p, backend);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return testing::Download<float>(in_place ? dx : dy, x.size());
}

class RmsNormOnBackend : public testing::BackendTest {};
ICE_INSTANTIATE_ON_BACKENDS(RmsNormOnBackend);

TEST_P(RmsNormOnBackend, MatchesNaive) {
  const Backend b = GetParam();
  uint32_t seed = 5;
  for (auto [rows, dim] : {std::pair{1, 1}, {3, 64}, {7, 128}, {2, 4096}, {33, 100}}) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      const auto x = RandomVector(static_cast<size_t>(rows) * dim, seed++, -3, 3);
      const auto w = ToTyped(t, RandomVector(dim, seed++, 0.5f, 1.5f));
      std::vector<float> want(x.size());
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
        const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
        for (int i = 0; i < dim; ++i) want[r * dim + i] = static_cast<float>(x[r * dim + i] * inv * w.values[i]);
      }
      const std::string name = std::string(BackendName(b)) + " rows=" + std::to_string(rows) +
                               " dim=" + std::to_string(dim) + " " + std::string(DTypeName(t));
      // fp32 sum of squares and rsqrt: 2e-6 relative (outputs up to ~1.5 * sqrt(3)).
      ExpectClose(RunRmsNorm(b, x, w, t, rows, dim, false), want, 1e-6, 2e-6, name);
      ExpectClose(RunRmsNorm(b, x, w, t, rows, dim, true), want, 1e-6, 2e-6, name + " in place");
    }
  }
}

// --- RoPE ------------------------------------------------------------------------------------

void ExpectBitsEqual(const std::vector<float>& got, const uint32_t* want, size_t n, const char* what) {
  ASSERT_EQ(got.size(), n) << what;
  for (size_t i = 0; i < n; ++i) {
    uint32_t g;
    std::memcpy(&g, &got[i], 4);
    // pow is not correctly rounded everywhere; allow one ulp against torch's fp32 pow.
    EXPECT_LE(std::abs(static_cast<int64_t>(g) - static_cast<int64_t>(want[i])), 1)
        << what << " index " << i;
  }
}

TEST(RopeTest, InvFreqMatchesTransformers) {
  RopeConfig c;
  c.rotary_dim = 128;
  c.theta = 500000.0;
  ExpectBitsEqual(ComputeRopeInvFreq(c), kDefault500k128, 64, "default 500k/128");
  c.rotary_dim = 64;
  c.theta = 10000.0;
  ExpectBitsEqual(ComputeRopeInvFreq(c), kDefault10k64, 32, "default 10k/64");
  c.scaling = RopeScaling::kLinear;
  c.factor = 4.0;
  ExpectBitsEqual(ComputeRopeInvFreq(c), kLinear10k64x4, 32, "linear x4");
  c.scaling = RopeScaling::kLlama3;
  c.rotary_dim = 128;
  c.theta = 500000.0;
  c.factor = 8.0;
  c.low_freq_factor = 1.0;
  c.high_freq_factor = 4.0;
  c.original_max_position = 8192;
  ExpectBitsEqual(ComputeRopeInvFreq(c), kLlama3_500k128, 64, "llama3 (Llama 3.1 8B)");
  c.rotary_dim = 64;
  c.factor = 32.0;
  ExpectBitsEqual(ComputeRopeInvFreq(c), kLlama3_500k64x32, 32, "llama3 x32 (Llama 3.2 1B)");
}

std::vector<float> RunRope(Backend backend, const std::vector<float>& x, const std::vector<int>& pos,
                           const std::vector<float>& inv, int heads, int head_dim, int rotary_dim) {
  auto dx = testing::Upload(backend, x);
  auto dpos = testing::Upload(backend, pos);
  auto dinv = testing::Upload(backend, inv);
  RopeParams p;
  p.x = dx.as<float>();
  p.positions = dpos.as<int>();
  p.inv_freq = dinv.as<float>();
  p.tokens = static_cast<int>(pos.size());
  p.heads = heads;
  p.head_dim = head_dim;
  p.rotary_dim = rotary_dim;
  const Status s = ApplyRope(p, backend);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return testing::Download<float>(dx, x.size());
}

class RopeOnBackend : public testing::BackendTest {};
ICE_INSTANTIATE_ON_BACKENDS(RopeOnBackend);

TEST_P(RopeOnBackend, RotateHalfMatchesNaive) {
  const Backend b = GetParam();
  for (auto [heads, head_dim, rotary_dim] : {std::tuple{1, 2, 2}, {4, 64, 64}, {8, 128, 128},
                                             {3, 128, 64}, {2, 80, 32}}) {
    RopeConfig c;
    c.rotary_dim = rotary_dim;
    c.theta = 500000.0;
    const auto inv = ComputeRopeInvFreq(c);
    const std::vector<int> pos = {0, 1, 7, 4095, 131071};
    const auto x = RandomVector(pos.size() * heads * head_dim, 77);
    std::vector<float> want = x;
    const int half = rotary_dim / 2;
    for (size_t t = 0; t < pos.size(); ++t) {
      for (int h = 0; h < heads; ++h) {
        float* v = &want[(t * heads + h) * head_dim];
        const float* src = &x[(t * heads + h) * head_dim];
        for (int i = 0; i < rotary_dim; ++i) {
          // HF: emb = cat(freqs, freqs); x * cos(emb) + rotate_half(x) * sin(emb).
          const double a = static_cast<double>(static_cast<float>(pos[t]) * inv[i % half]);
          const double rot = i < half ? -src[i + half] : src[i - half];
          v[i] = static_cast<float>(src[i] * std::cos(a) + rot * std::sin(a));
        }
      }
    }
    // Angles up to ~1.3e5 rad: fp32 cos/sin of the same fp32 angle agree to ~1e-6.
    ExpectClose(RunRope(b, x, pos, inv, heads, head_dim, rotary_dim), want, 3e-6, 1e-6,
                std::string(BackendName(b)) + " rope d=" + std::to_string(head_dim) +
                    " rot=" + std::to_string(rotary_dim));
  }
}

TEST(RopeTest, RejectsOddRotaryDim) {
  float x[4] = {};
  int pos = 0;
  float inv = 1;
  RopeParams p{x, &pos, &inv, 1, 1, 4, 3};
  EXPECT_EQ(ApplyRope(p).code(), StatusCode::kInvalidArgument);
}

// --- SwiGLU, Add, Embedding ------------------------------------------------------------------

class ElementwiseOnBackend : public testing::BackendTest {};
ICE_INSTANTIATE_ON_BACKENDS(ElementwiseOnBackend);

TEST_P(ElementwiseOnBackend, SwiGluAndAddMatchNaive) {
  const Backend b = GetParam();
  for (long n : {1L, 15L, 14336L, 100003L}) {
    const auto g = RandomVector(n, 1, -8, 8), u = RandomVector(n, 2);
    std::vector<float> want_swiglu(n), want_add(n);
    for (long i = 0; i < n; ++i) {
      want_swiglu[i] = static_cast<float>(g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i]);
      want_add[i] = u[i] + g[i];
    }
    auto dg = testing::Upload(b, g), du = testing::Upload(b, u);
    ASSERT_TRUE(SwiGlu({dg.as<float>(), du.as<float>(), dg.as<float>(), n}, b).ok());  // out aliases gate
    // expf vs exp: 2 ulp-ish, 1e-6 relative.
    ExpectClose(testing::Download<float>(dg, n), want_swiglu, 1e-7, 2e-6,
                std::string(BackendName(b)) + " swiglu n=" + std::to_string(n));
    auto dy = testing::Upload(b, u), dx = testing::Upload(b, g);
    ASSERT_TRUE(Add({dy.as<float>(), dx.as<float>(), n}, b).ok());
    ExpectClose(testing::Download<float>(dy, n), want_add, 0, 0, "add");  // exact
  }
}

class EmbeddingOnBackend : public testing::BackendTest {};
ICE_INSTANTIATE_ON_BACKENDS(EmbeddingOnBackend);

TEST_P(EmbeddingOnBackend, GathersRowsAndChecksIds) {
  const Backend b = GetParam();
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int vocab = 1000, dim = 67;
    const auto table = ToTyped(t, RandomVector(static_cast<size_t>(vocab) * dim, 3));
    const std::vector<int32_t> ids = {0, 999, 5, 5, 123};
    std::vector<float> want;
    for (int id : ids) want.insert(want.end(), &table.values[id * dim], &table.values[(id + 1) * dim]);
    auto dids = testing::Upload(b, ids);
    auto dtab = testing::Upload(b, table.bytes);
    auto dout = testing::Upload(b, std::vector<float>(want.size()));
    EmbeddingParams p;
    p.ids = dids.as<int32_t>();
    p.table = dtab.data();
    p.table_dtype = t;
    p.out = dout.as<float>();
    p.n = static_cast<int>(ids.size());
    p.vocab = vocab;
    p.dim = dim;
    ASSERT_TRUE(Embedding(p, b).ok());
    ExpectClose(testing::Download<float>(dout, want.size()), want, 0, 0, "embedding");  // exact

    const std::vector<int32_t> bad = {1, 1000};
    auto dbad = testing::Upload(b, bad);
    p.ids = dbad.as<int32_t>();
    p.n = 2;
    const Status s = Embedding(p, b);
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.ToString();
    EXPECT_NE(s.message().find("1000"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace icecache::kernels
