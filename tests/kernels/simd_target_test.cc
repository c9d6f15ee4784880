// The run-time SIMD dispatch (kernels/simd_target.h), and every target this CPU supports against
// the scalar target on the same inputs, in one process. (Each target is also checked against the
// naive references of the other kernel tests: CTest runs kernels_test once per target.)
#include "kernels/simd_target.h"

#include <array>
#include <cmath>
#include <iostream>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "tests/kernels/test_util.h"

namespace icecache::kernels {
namespace {

using testing::ExpectClose;
using testing::ForEachSimdTarget;
using testing::RandomVector;
using testing::ToTyped;

TEST(SimdTargetTest, NamesRoundTripAndUnknownNamesFail) {
  for (SimdTarget t : kAllSimdTargets) {
    auto parsed = ParseSimdTarget(SimdTargetName(t));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
  }
  auto bad = ParseSimdTarget("avx-512");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(SimdTargetTest, OnlySupportedTargetsCanBeActive) {
  const auto supported = SupportedSimdTargets();
  ASSERT_FALSE(supported.empty());
  EXPECT_EQ(supported.front(), SimdTarget::kScalar);
  EXPECT_TRUE(SimdTargetSupported(ActiveSimdTarget()));
  const SimdTarget saved = ActiveSimdTarget();
  for (SimdTarget t : kAllSimdTargets) {
    const Status s = SetSimdTarget(t);
    if (SimdTargetSupported(t)) {
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(ActiveSimdTarget(), t);
    } else {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << SimdTargetName(t);
      EXPECT_NE(ActiveSimdTarget(), t);
      std::cout << "note: this CPU lacks " << SimdTargetName(t) << "; its kernels are not run here\n";
    }
  }
  ASSERT_TRUE(SetSimdTarget(saved).ok());
}

TEST(SimdTargetTest, AmxCanBeTurnedOnOnlyWhereSupported) {
  const bool saved = AmxActive();
  EXPECT_TRUE(!saved || AmxSupported());
  ASSERT_TRUE(SetAmxActive(false).ok());
  EXPECT_FALSE(AmxActive());
  const Status on = SetAmxActive(true);
  if (AmxSupported()) {
    EXPECT_TRUE(on.ok()) << on.ToString();
    EXPECT_TRUE(AmxActive());
  } else {
    EXPECT_EQ(on.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(on.message().find("AMX"), std::string::npos);
    EXPECT_FALSE(AmxActive());
    std::cout << "note: this CPU (or OS) lacks AMX-BF16; the AMX tile GEMM is not run here\n";
  }
  ASSERT_TRUE(SetAmxActive(saved).ok());
}

TEST(SimdTargetTest, AvxVnniCanBeTurnedOnOnlyWhereSupported) {
  const bool saved = AvxVnniActive();
  EXPECT_TRUE(!saved || AvxVnniSupported());
  EXPECT_TRUE(!AvxVnniSupported() || SimdTargetSupported(SimdTarget::kAvx2));
  ASSERT_TRUE(SetAvxVnniActive(false).ok());
  EXPECT_FALSE(AvxVnniActive());
  const Status on = SetAvxVnniActive(true);
  if (AvxVnniSupported()) {
    EXPECT_TRUE(on.ok()) << on.ToString();
    EXPECT_TRUE(AvxVnniActive());
  } else {
    EXPECT_EQ(on.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(on.message().find("AVX-VNNI"), std::string::npos);
    EXPECT_FALSE(AvxVnniActive());
    std::cout << "note: this CPU lacks AVX-VNNI; the avx2 target's vpdpbusd int8 form is not run here\n";
  }
  ASSERT_TRUE(SetAvxVnniActive(saved).ok());
}

// Matmul across the GEMV (m <= 16) and GEMM paths, every weight type, ragged k and n; with bf16
// weights also with bf16_activations (vdpbf16ps on avx512, rounded x elsewhere).
TEST(SimdTargetTest, MatmulOnEveryTargetMatchesScalar) {
  for (int variant = 0; variant < 4; ++variant) {
    const DType wt = variant == 3 ? DType::kBF16 : std::array{DType::kF32, DType::kF16, DType::kBF16}[variant];
    const bool bf16_x = variant == 3;
    for (int m : {1, 5, 16, 37}) {
      const int n = 67, k = 301;
      const auto x = RandomVector(static_cast<size_t>(m) * k, 11 + m);
      const auto w = ToTyped(wt, RandomVector(static_cast<size_t>(n) * k, 12 + m));
      std::vector<float> want;
      ForEachSimdTarget([&](SimdTarget t) {
        std::vector<float> y(static_cast<size_t>(m) * n, 0.f);
        MatmulParams p;
        p.x = x.data();
        p.w = w.bytes.data();
        p.w_dtype = wt;
        p.y = y.data();
        p.m = m;
        p.n = n;
        p.k = k;
        p.bf16_activations = bf16_x;
        ASSERT_TRUE(Matmul(p).ok());
        if (t == SimdTarget::kScalar) {
          want = y;
        } else {
          ExpectClose(y, want, 4e-6 * std::sqrt(k) + 1e-6, 1e-5,
                      "matmul m=" + std::to_string(m) + " " + std::string(DTypeName(wt)) +
                          (bf16_x ? " bf16 activations" : ""));
        }
      });
    }
  }
}

TEST(SimdTargetTest, SwiGluAndPrefillAttentionOnEveryTargetMatchScalar) {
  const long n = 1000 + 5;
  const auto gate = RandomVector(n, 21, -20.f, 20.f), up = RandomVector(n, 22);
  // GQA 3 (SmolLM2's 9 / 3 heads), head_dim 64 and 48 (a 16-column tail), 150 positions.
  for (int d : {64, 48}) {
    const int len = 150, hq = 3, hk = 1;
    const auto q = RandomVector(static_cast<size_t>(len) * hq * d, 23);
    const auto k = RandomVector(static_cast<size_t>(len) * hk * d, 24);
    const auto v = RandomVector(static_cast<size_t>(len) * hk * d, 25);
    std::vector<float> want_sw, want_att;
    ForEachSimdTarget([&](SimdTarget t) {
      std::vector<float> out(n);
      ASSERT_TRUE(SwiGlu({gate.data(), up.data(), out.data(), n}).ok());
      std::vector<float> att(q.size());
      PrefillAttentionParams p{q.data(), k.data(), v.data(), att.data(), len, len, hq, hk, d,
                               1.f / std::sqrt(static_cast<float>(d))};
      ASSERT_TRUE(PrefillAttention(p).ok());
      if (t == SimdTarget::kScalar) {
        want_sw = out;
        want_att = att;
      } else {
        ExpectClose(out, want_sw, 0, 4e-6, "swiglu");
        ExpectClose(att, want_att, 4e-5, 0, "prefill attention d=" + std::to_string(d));
      }
    });
  }
}

}  // namespace
}  // namespace icecache::kernels
