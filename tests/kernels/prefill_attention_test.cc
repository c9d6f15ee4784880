// The CPU prefill attention kernels (tiled and row-by-row) against a naive double-precision
// reference, on shapes that cross the tiled kernel's block edges: several 64-key blocks, task
// boundaries inside a GQA group, chunked prefill (q_len < kv_len), head_dim that is a multiple of
// 64, of 16 only, and of neither (scalar fallback).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/prefill_attention_cpu.h"
#include "kernels/dtype.h"
#include "kernels/simd_target.h"
#include "tests/kernels/test_util.h"

namespace icecache::kernels {
namespace {

using testing::ExpectClose;
using testing::RandomVector;

struct Case {
  int q_len, kv_len, hq, hkv, d;
  std::string Name() const {
    return "q=" + std::to_string(q_len) + " kv=" + std::to_string(kv_len) + " hq=" + std::to_string(hq) +
           " hkv=" + std::to_string(hkv) + " d=" + std::to_string(d);
  }
};

std::vector<float> Naive(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                         const std::vector<float>& v, float scale) {
  const int group = c.hq / c.hkv;
  std::vector<float> out(q.size());
  for (int i = 0; i < c.q_len; ++i) {
    for (int h = 0; h < c.hq; ++h) {
      const int kvh = h / group, n = i + c.kv_len - c.q_len + 1;
      std::vector<double> s(n);
      double mx = -1e300, sum = 0;
      for (int j = 0; j < n; ++j) {
        double dot = 0;
        for (int e = 0; e < c.d; ++e)
          dot += static_cast<double>(q[(static_cast<size_t>(i) * c.hq + h) * c.d + e]) *
                 k[(static_cast<size_t>(j) * c.hkv + kvh) * c.d + e];
        mx = std::max(mx, s[j] = dot * scale);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int e = 0; e < c.d; ++e) {
        double acc = 0;
        for (int j = 0; j < n; ++j) acc += s[j] * v[(static_cast<size_t>(j) * c.hkv + kvh) * c.d + e];
        out[(static_cast<size_t>(i) * c.hq + h) * c.d + e] = static_cast<float>(acc / sum);
      }
    }
  }
  return out;
}

PrefillAttentionParams Params(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, float scale) {
  PrefillAttentionParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.q_len = c.q_len;
  p.kv_len = c.kv_len;
  p.num_q_heads = c.hq;
  p.num_kv_heads = c.hkv;
  p.head_dim = c.d;
  p.scale = scale;
  return p;
}

TEST(PrefillAttentionCpuTest, TiledAndRowwiseMatchNaive) {
  const std::vector<Case> cases = {{130, 130, 1, 1, 64},  {200, 200, 4, 1, 128}, {97, 300, 8, 2, 64},
                                   {65, 65, 32, 8, 128},  {150, 150, 2, 2, 80},  {70, 90, 6, 3, 40},
                                   {1, 257, 4, 4, 64},    {129, 129, 3, 1, 48}};
  uint32_t seed = 3;
  for (const Case& c : cases) {
    const auto q = RandomVector(static_cast<size_t>(c.q_len) * c.hq * c.d, seed += 7);
    // Keys in [-3, 3] give peaked softmaxes, so the online rescaling is exercised.
    const auto k = RandomVector(static_cast<size_t>(c.kv_len) * c.hkv * c.d, seed + 1, -3.f, 3.f);
    const auto v = RandomVector(static_cast<size_t>(c.kv_len) * c.hkv * c.d, seed + 2);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.d));
    const auto want = Naive(c, q, k, v, scale);
    PrefillAttentionParams p = Params(c, q, k, v, scale);
    std::vector<float> tiled(q.size(), 55.f), rows(q.size(), 55.f);
    p.out = tiled.data();
    ASSERT_TRUE(cpu::PrefillAttention(p).ok());
    p.out = rows.data();
    ASSERT_TRUE(cpu::PrefillAttentionRowwise(p).ok());
    // fp32 accumulation over up to 300 keys of convex combinations of values in [-1, 1]: 2e-5 abs.
    ExpectClose(tiled, want, 2e-5, 1e-5, "tiled " + c.Name());
    ExpectClose(rows, want, 2e-5, 1e-5, "rowwise " + c.Name());
  }
}

// PrefillAttentionParams::bf16: on the avx512 target with AMX (run here where the CPU has it) the
// products use bf16 operands: within 4e-3 abs of the naive attention over round_bf16(q * scale),
// round_bf16(K) and round_bf16(V) (the probabilities' own rounding, 2^-9 relative, over values in
// [-1, 1]); elsewhere, and with AMX turned off, the flag changes nothing (the fp32 bound above).
// Shapes: head_dim 64 and 128 (and 48, 80: not multiples of 32, fp32), several 128-key blocks,
// key counts that are not multiples of 32, row groups of 32 cut by GQA groups, chunked prefill.
TEST(PrefillAttentionCpuTest, Bf16OperandsOnAmxMatchTheRoundedAttention) {
  const bool amx_saved = AmxActive();
  const bool amx_here = AmxSupported() && ActiveSimdTarget() == SimdTarget::kAvx512;
  if (!amx_here) std::cout << "note: the AMX form is not run here (needs AMX-BF16 and the avx512 target)\n";
  const std::vector<Case> cases = {{130, 130, 1, 1, 64}, {200, 200, 4, 1, 128}, {97, 300, 9, 3, 64},
                                   {65, 65, 32, 8, 128}, {1, 257, 4, 4, 64},    {300, 300, 3, 1, 64},
                                   {33, 600, 6, 2, 128}, {150, 150, 2, 2, 80},  {40, 70, 2, 1, 48}};
  auto rounded = [](std::vector<float> x, float scale) {
    for (float& e : x) e = Bf16ToF32(F32ToBf16(e * scale));
    return x;
  };
  for (bool amx : {false, true}) {
    if (amx && !amx_here) continue;
    ASSERT_TRUE(SetAmxActive(amx).ok());
    uint32_t seed = 41;
    for (const Case& c : cases) {
      const auto q = RandomVector(static_cast<size_t>(c.q_len) * c.hq * c.d, seed += 7);
      const auto k = RandomVector(static_cast<size_t>(c.kv_len) * c.hkv * c.d, seed + 1, -3.f, 3.f);
      const auto v = RandomVector(static_cast<size_t>(c.kv_len) * c.hkv * c.d, seed + 2);
      const float scale = 1.f / std::sqrt(static_cast<float>(c.d));
      PrefillAttentionParams p = Params(c, q, k, v, scale);
      p.bf16 = true;
      std::vector<float> got(q.size(), 55.f);
      p.out = got.data();
      ASSERT_TRUE(cpu::PrefillAttention(p).ok());
      EXPECT_EQ(cpu::PrefillAttentionOnAmx(p), amx && c.d % 32 == 0) << c.Name();
      if (amx && c.d % 32 == 0) {
        ExpectClose(got, Naive(c, rounded(q, scale), rounded(k, 1.f), rounded(v, 1.f), 1.f), 4e-3, 0.f,
                    "AMX " + c.Name());
      } else {
        ExpectClose(got, Naive(c, q, k, v, scale), 2e-5, 1e-5, (amx ? "AMX on, fp32 " : "fp32 ") + c.Name());
      }
    }
  }
  ASSERT_TRUE(SetAmxActive(amx_saved).ok());
}

}  // namespace
}  // namespace icecache::kernels
