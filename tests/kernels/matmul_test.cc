#include "kernels/matmul.h"

#include <cmath>
#include <iostream>

#include "kernels/simd_target.h"

#include "tests/kernels/test_util.h"

namespace icecache::kernels {
namespace {

using testing::ExpectClose;
using testing::RandomVector;
using testing::ToTyped;

struct MatmulCase {
  int m, n, k;
  DType w_dtype;
  bool bias;
  bool accumulate;
  std::string Name() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " " +
           std::string(DTypeName(w_dtype)) + (bias ? " bias" : "") + (accumulate ? " acc" : "");
  }
};

std::vector<MatmulCase> Cases() {
  std::vector<MatmulCase> cases;
  const int shapes[][3] = {{1, 1, 1},   {1, 7, 15},   {1, 130, 1024}, {2, 33, 100}, {3, 64, 515},
                           {4, 17, 16}, {5, 70, 33},  {8, 64, 512},   {17, 129, 1030}, {33, 5, 7},
                           // multi-row GEMV: row groups of 8 + rest, n % 3 != 0, k % 16 != 0
                           {9, 31, 47}, {12, 64, 300}, {16, 100, 4100},
                           // GEMM: row-strip and panel tails; k in one block (600, 513), in two
                           // (1030: 520 + 510) and in three (2000: 672 + 672 + 656)
                           {200, 70, 600}, {23, 16, 513}, {40, 33, 2000}};
  int i = 0;
  for (auto& s : shapes) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      cases.push_back({s[0], s[1], s[2], t, (i % 2) == 0, (i % 3) == 1});
      ++i;
    }
  }
  return cases;
}

// Runs Matmul on `backend` with host inputs; y starts as y0.
std::vector<float> RunMatmul(Backend backend, const MatmulCase& c, const std::vector<float>& x,
                       const testing::Typed& w, const std::vector<float>& bias,
                       const std::vector<float>& y0, bool bf16_activations = false) {
  auto dx = testing::Upload(backend, x);
  auto dw = testing::Upload(backend, w.bytes);
  auto db = testing::Upload(backend, bias);
  auto dy = testing::Upload(backend, y0);
  MatmulParams p;
  p.x = dx.as<float>();
  p.w = dw.data();
  p.w_dtype = c.w_dtype;
  p.bias = c.bias ? db.data() : nullptr;
  p.y = dy.as<float>();
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.accumulate = c.accumulate;
  p.bf16_activations = bf16_activations;
  Status s = Matmul(p, backend);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return testing::Download<float>(dy, y0.size());
}

// The product in double (bias, accumulate as the case says); round_x: x rounded to bf16 first.
std::vector<float> Naive(const MatmulCase& c, const std::vector<float>& x, const testing::Typed& w,
                         const std::vector<float>& bias, const std::vector<float>& y0, bool round_x) {
  std::vector<float> want(y0.size());
  for (int r = 0; r < c.m; ++r) {
    for (int j = 0; j < c.n; ++j) {
      double s = c.bias ? bias[j] : 0.0;
      for (int i = 0; i < c.k; ++i) {
        const float xi = round_x ? Bf16ToF32(F32ToBf16(x[r * c.k + i])) : x[r * c.k + i];
        s += static_cast<double>(xi) * w.values[j * c.k + i];
      }
      if (c.accumulate) s += y0[r * c.n + j];
      want[r * c.n + j] = static_cast<float>(s);
    }
  }
  return want;
}

TEST(MatmulTest, CpuMatchesNaive) {
  uint32_t seed = 1;
  for (const MatmulCase& c : Cases()) {
    const auto x = RandomVector(static_cast<size_t>(c.m) * c.k, seed++);
    const auto w = ToTyped(c.w_dtype, RandomVector(static_cast<size_t>(c.n) * c.k, seed++));
    const auto bias = RandomVector(c.n, seed++);
    const auto y0 = RandomVector(static_cast<size_t>(c.m) * c.n, seed++);
    const auto want = Naive(c, x, w, bias, y0, /*round_x=*/false);
    const auto got = RunMatmul(Backend::kCpu, c, x, w, bias, y0);
    // fp32 accumulation of k products of magnitude <= 1: error grows ~ sqrt(k) ulps of the sum.
    ExpectClose(got, want, 2e-6 * std::sqrt(c.k) + 1e-6, 1e-5, c.Name());
  }
}

// bf16_activations: the product of round_bf16(x) and the bf16 weights at every m (for m > 16 on
// the avx512 target AMX tiles where the CPU has them, and vdpbf16ps, both checked here; the
// rounded x through the fp32 kernels elsewhere; CTest runs this on every target), within
// CpuMatchesNaive's bound of the exact product of the rounded values. The shapes cover the
// tiles' tails in m (32-row blocks), n (32 weight rows) and k (32 elements, odd k included).
// For other weight types the flag changes nothing (bit for bit).
TEST(MatmulTest, Bf16ActivationsMultiplyTheRoundedActivations) {
  const bool amx_saved = AmxActive();
  std::vector<bool> amx_modes{false};
  if (AmxSupported() && ActiveSimdTarget() == SimdTarget::kAvx512) {
    amx_modes.push_back(true);
  } else {
    std::cout << "note: the AMX tile GEMM is not run here (needs AMX-BF16 and the avx512 target)\n";
  }
  const int shapes[][3] = {{1, 7, 15},    {5, 70, 33},     {16, 100, 300}, {17, 5, 1},     {17, 67, 31},
                           {33, 130, 33}, {70, 64, 576},   {129, 65, 1030}, {200, 3, 64},  {64, 32, 32},
                           {300, 200, 577}, {47, 97, 1}};
  for (bool amx : amx_modes) {
    ASSERT_TRUE(SetAmxActive(amx).ok());
    uint32_t seed = 500;
    for (auto& s : shapes) {
      const MatmulCase c{s[0], s[1], s[2], DType::kBF16, (seed % 2) == 0, (seed % 3) == 1};
      const auto x = RandomVector(static_cast<size_t>(c.m) * c.k, seed++);
      const auto w = ToTyped(DType::kBF16, RandomVector(static_cast<size_t>(c.n) * c.k, seed++));
      const auto bias = RandomVector(c.n, seed++);
      const auto y0 = RandomVector(static_cast<size_t>(c.m) * c.n, seed++);
      const auto want = Naive(c, x, w, bias, y0, /*round_x=*/true);
      ExpectClose(RunMatmul(Backend::kCpu, c, x, w, bias, y0, /*bf16_activations=*/true), want,
                  2e-6 * std::sqrt(c.k) + 1e-6, 1e-5, c.Name() + " bf16 activations" + (amx ? " (AMX)" : ""));
    }
  }
  ASSERT_TRUE(SetAmxActive(amx_saved).ok());
  uint32_t seed = 600;
  for (const MatmulCase& c : Cases()) {
    if (c.w_dtype == DType::kBF16) continue;
    const auto x = RandomVector(static_cast<size_t>(c.m) * c.k, seed++);
    const auto w = ToTyped(c.w_dtype, RandomVector(static_cast<size_t>(c.n) * c.k, seed++));
    const auto bias = RandomVector(c.n, seed++);
    const std::vector<float> y0(static_cast<size_t>(c.m) * c.n, 0.f);
    EXPECT_EQ(RunMatmul(Backend::kCpu, c, x, w, bias, y0, false), RunMatmul(Backend::kCpu, c, x, w, bias, y0, true))
        << c.Name();
  }
}

TEST(MatmulTest, PrecisionNamesRoundTripAndAutoFollowsTheTarget) {
  for (MatmulPrecision p : {MatmulPrecision::kAuto, MatmulPrecision::kFp32, MatmulPrecision::kBf16, MatmulPrecision::kInt8}) {
    auto parsed = ParseMatmulPrecision(MatmulPrecisionName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  auto bad = ParseMatmulPrecision("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("auto, fp32, bf16 or int8"), std::string::npos);

  const MatmulPrecision saved = GetMatmulPrecision();
  const SimdTarget saved_target = ActiveSimdTarget();
  SetMatmulPrecision(MatmulPrecision::kFp32);
  EXPECT_FALSE(UseBf16Activations());
  EXPECT_EQ(BlockActivations(), QuantActivations::kFp32);
  SetMatmulPrecision(MatmulPrecision::kBf16);
  EXPECT_TRUE(UseBf16Activations());
  EXPECT_EQ(BlockActivations(), QuantActivations::kInt16);
  SetMatmulPrecision(MatmulPrecision::kInt8);
  EXPECT_EQ(BlockActivations(), QuantActivations::kInt8);
  SetMatmulPrecision(MatmulPrecision::kAuto);
  EXPECT_EQ(BlockActivations(), QuantActivations::kInt16);
  for (SimdTarget t : SupportedSimdTargets()) {
    ASSERT_TRUE(SetSimdTarget(t).ok());
    EXPECT_EQ(UseBf16Activations(), t == SimdTarget::kAvx512) << SimdTargetName(t);
  }
  ASSERT_TRUE(SetSimdTarget(saved_target).ok());
  SetMatmulPrecision(saved);
}

// Up to 16 rows the CPU kernel streams the weights once for all rows. Batched decode relies on a
// row of a batch matching the row computed alone. Rows of 2..16-row calls are computed alike (the
// arithmetic of a row does not depend on m): exactly equal. m = 1 sums in another order: each
// result is within the CpuMatchesNaive bound of the exact value, so they differ by at most twice it.
TEST(MatmulTest, EachRowOfABatchMatchesTheRowAlone) {
  uint32_t seed = 300;
  // The last pass: bf16 weights with bf16_activations (the rounded x through the same GEMV).
  for (int variant = 0; variant < 4; ++variant) {
    const DType t = variant == 1 ? DType::kF16 : variant == 2 ? DType::kF32 : DType::kBF16;
    const bool bf16_x = variant == 3;
    const int n = 35, k = 530;
    const int max_m = 16;
    const auto x = RandomVector(static_cast<size_t>(max_m) * k, seed++);
    const auto w = ToTyped(t, RandomVector(static_cast<size_t>(n) * k, seed++));
    const auto bias = RandomVector(n, seed++);
    auto run = [&](int m, int first_row) {
      const MatmulCase c{m, n, k, t, true, false};
      const std::vector<float> xs(x.begin() + static_cast<size_t>(first_row) * k,
                                  x.begin() + static_cast<size_t>(first_row + m) * k);
      return RunMatmul(Backend::kCpu, c, xs, w, bias, std::vector<float>(static_cast<size_t>(m) * n, 0.f), bf16_x);
    };
    const auto full = run(max_m, 0);
    for (int m : {2, 3, 5, 8, 9, 13}) {
      const auto batch = run(m, 0);
      for (size_t i = 0; i < batch.size(); ++i) {
        ASSERT_EQ(batch[i], full[i]) << DTypeName(t) << (bf16_x ? " bf16 activations" : "") << " m=" << m
                                     << " element " << i;
      }
    }
    for (int r = 0; r < max_m; ++r) {
      const auto alone = run(1, r);
      const std::vector<float> row(full.begin() + static_cast<size_t>(r) * n,
                                   full.begin() + static_cast<size_t>(r + 1) * n);
      ExpectClose(alone, row, 2 * (2e-6 * std::sqrt(k) + 1e-6), 2e-5,
                  std::string(DTypeName(t)) + (bf16_x ? " bf16 activations" : "") + " row " + std::to_string(r));
    }
  }
}

// The GEMM (m > 16) computes a row the same way whatever the batch: the same x row gives the same
// bits at m = 17, 40, 199 and 400 (strips of 4 rows and their tails), for every weight dtype, so a
// prompt's rows do not depend on how it is chunked or batched.
TEST(MatmulTest, GemmRowsDoNotDependOnTheBatch) {
  uint32_t seed = 700;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int n = 70, k = 600, max_m = 400;
    const auto x = RandomVector(static_cast<size_t>(max_m) * k, seed++);
    const auto w = ToTyped(t, RandomVector(static_cast<size_t>(n) * k, seed++));
    const auto bias = RandomVector(n, seed++);
    auto run = [&](int m) {
      const MatmulCase c{m, n, k, t, true, false};
      const std::vector<float> xs(x.begin(), x.begin() + static_cast<size_t>(m) * k);
      return RunMatmul(Backend::kCpu, c, xs, w, bias, std::vector<float>(static_cast<size_t>(m) * n, 0.f));
    };
    const auto full = run(max_m);
    for (int m : {17, 40, 199}) {
      const auto part = run(m);
      for (size_t i = 0; i < part.size(); ++i) {
        ASSERT_EQ(part[i], full[i]) << DTypeName(t) << " m=" << m << " element " << i;
      }
    }
  }
}

// The GEMM's work items (weight panels, and x row blocks when there are few panels) change with
// the thread count; every output must not.
TEST(MatmulTest, GemmDoesNotDependOnTheThreadCount) {
  const int saved = SetCpuThreadsForThisThread(1);
  uint32_t seed = 800;
  for (DType t : {DType::kF32, DType::kBF16}) {
    // 3 panels (rows split into blocks), 11 panels, and k in two blocks
    for (const MatmulCase& c : {MatmulCase{301, 192, 576, t, true, false}, MatmulCase{130, 700, 96, t, false, true},
                                MatmulCase{97, 64, 1030, t, true, true}}) {
      const auto x = RandomVector(static_cast<size_t>(c.m) * c.k, seed++);
      const auto w = ToTyped(t, RandomVector(static_cast<size_t>(c.n) * c.k, seed++));
      const auto bias = RandomVector(c.n, seed++);
      const auto y0 = RandomVector(static_cast<size_t>(c.m) * c.n, seed++);
      SetCpuThreadsForThisThread(1);
      const auto one = RunMatmul(Backend::kCpu, c, x, w, bias, y0);
      for (int threads : {2, 3, 7}) {
        SetCpuThreadsForThisThread(threads);
        const auto many = RunMatmul(Backend::kCpu, c, x, w, bias, y0);
        for (size_t i = 0; i < one.size(); ++i) {
          ASSERT_EQ(many[i], one[i]) << c.Name() << " threads=" << threads << " element " << i;
        }
      }
    }
  }
  SetCpuThreadsForThisThread(saved);
}

// MatmulGroup computes each product as Matmul does, bit for bit: the fused GEMV loop (products
// sharing x at m <= 16, e.g. a layer's q/k/v) runs the same per-feature work as the one-product
// loop, and anything else (the GEMM path, products with different x) runs Matmul one by one.
TEST(MatmulTest, GroupMatchesMatmulOneByOne) {
  uint32_t seed = 500;
  const int k = 130;
  const int ns[3] = {37, 12, 13};
  for (int m : {1, 3, 16, 20}) {
    for (int variant = 0; variant < 5; ++variant) {
      const DType t = variant == 0 ? DType::kF32 : variant == 1 ? DType::kF16 : DType::kBF16;
      const bool bf16_x = variant == 3;
      const bool shared_x = variant != 4;
      const auto x = RandomVector(static_cast<size_t>(m) * k, seed++);
      const auto x2 = RandomVector(static_cast<size_t>(m) * k, seed++);
      std::vector<testing::Typed> w;
      std::vector<std::vector<float>> bias, y0;
      for (int c = 0; c < 3; ++c) {
        w.push_back(ToTyped(t, RandomVector(static_cast<size_t>(ns[c]) * k, seed++)));
        bias.push_back(RandomVector(ns[c], seed++));
        y0.push_back(RandomVector(static_cast<size_t>(m) * ns[c], seed++));
      }
      std::vector<std::vector<float>> one(3), group(3);
      for (int c = 0; c < 3; ++c) group[c] = y0[c];
      MatmulParams ps[3];
      for (int c = 0; c < 3; ++c) {
        MatmulParams& p = ps[c];
        p.x = (c == 1 && !shared_x ? x2 : x).data();
        p.w = w[c].bytes.data();
        p.w_dtype = t;
        p.bias = c < 2 ? bias[c].data() : nullptr;
        p.y = group[c].data();
        p.m = m;
        p.n = ns[c];
        p.k = k;
        p.accumulate = c == 2;
        p.bf16_activations = bf16_x;
        one[c] = y0[c];
        MatmulParams alone = p;
        alone.y = one[c].data();
        ASSERT_TRUE(Matmul(alone).ok());
      }
      ASSERT_TRUE(MatmulGroup(ps, 3).ok());
      for (int c = 0; c < 3; ++c) {
        for (size_t i = 0; i < one[c].size(); ++i) {
          ASSERT_EQ(group[c][i], one[c][i]) << "m=" << m << " " << DTypeName(t) << (bf16_x ? " bf16 activations" : "")
                                            << (shared_x ? "" : " different x") << " product " << c << " element " << i;
        }
      }
    }
  }
}

TEST(MatmulTest, GroupRejectsBadArgumentsNamingTheProduct) {
  EXPECT_EQ(MatmulGroup(nullptr, 1).code(), StatusCode::kInvalidArgument);
  float x = 1, w = 1, y = 0;
  MatmulParams ps[2];
  for (MatmulParams& p : ps) {
    p.x = &x;
    p.w = &w;
    p.y = &y;
    p.m = p.n = p.k = 1;
  }
  EXPECT_EQ(MatmulGroup(ps, 0).code(), StatusCode::kInvalidArgument);
  ps[1].n = 0;
  const Status s = MatmulGroup(ps, 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("product 1"), std::string::npos) << s.ToString();
}

TEST(MatmulTest, CudaGroupMatchesCpu) {
  ICE_SKIP_WITHOUT_CUDA();
  uint32_t seed = 700;
  const MatmulCase cases[2] = {{1, 70, 96, DType::kBF16, true, false}, {1, 24, 96, DType::kBF16, false, true}};
  const auto x = RandomVector(96, seed++);
  std::vector<testing::Typed> w;
  std::vector<std::vector<float>> bias, y0, cpu;
  for (const MatmulCase& c : cases) {
    w.push_back(ToTyped(c.w_dtype, RandomVector(static_cast<size_t>(c.n) * c.k, seed++)));
    bias.push_back(RandomVector(c.n, seed++));
    y0.push_back(RandomVector(c.n, seed++));
    cpu.push_back(RunMatmul(Backend::kCpu, c, x, w.back(), bias.back(), y0.back()));
  }
  auto dx = testing::Upload(Backend::kCuda, x);
  std::vector<DeviceBuffer> dw, db, dy;
  MatmulParams ps[2];
  for (int c = 0; c < 2; ++c) {
    dw.push_back(testing::Upload(Backend::kCuda, w[c].bytes));
    db.push_back(testing::Upload(Backend::kCuda, bias[c]));
    dy.push_back(testing::Upload(Backend::kCuda, y0[c]));
    MatmulParams& p = ps[c];
    p.x = dx.as<float>();
    p.w = dw.back().data();
    p.w_dtype = cases[c].w_dtype;
    p.bias = cases[c].bias ? db.back().data() : nullptr;
    p.y = dy.back().as<float>();
    p.m = cases[c].m;
    p.n = cases[c].n;
    p.k = cases[c].k;
    p.accumulate = cases[c].accumulate;
  }
  ASSERT_TRUE(MatmulGroup(ps, 2, Backend::kCuda).ok());
  for (int c = 0; c < 2; ++c) {
    ExpectClose(testing::Download<float>(dy[c], y0[c].size()), cpu[c], 4e-6 * std::sqrt(96) + 1e-6, 1e-5,
                "product " + std::to_string(c));
  }
}

TEST(MatmulTest, CudaMatchesCpu) {
  ICE_SKIP_WITHOUT_CUDA();
  uint32_t seed = 100;
  for (const MatmulCase& c : Cases()) {
    const auto x = RandomVector(static_cast<size_t>(c.m) * c.k, seed++);
    const auto w = ToTyped(c.w_dtype, RandomVector(static_cast<size_t>(c.n) * c.k, seed++));
    const auto bias = RandomVector(c.n, seed++);
    const auto y0 = RandomVector(static_cast<size_t>(c.m) * c.n, seed++);
    const auto cpu = RunMatmul(Backend::kCpu, c, x, w, bias, y0);
    const auto gpu = RunMatmul(Backend::kCuda, c, x, w, bias, y0);
    // cuBLAS may use a different summation order (and TF32 is disabled): same fp32 bound as above.
    ExpectClose(gpu, cpu, 4e-6 * std::sqrt(c.k) + 1e-6, 1e-5, c.Name());
  }
}

TEST(MatmulTest, RejectsBadArguments) {
  MatmulParams p;
  EXPECT_EQ(Matmul(p).code(), StatusCode::kInvalidArgument);
  float x = 1, w = 1, y = 0;
  p.x = &x;
  p.w = &w;
  p.y = &y;
  p.m = 1;
  p.n = 0;
  p.k = 1;
  EXPECT_EQ(Matmul(p).code(), StatusCode::kInvalidArgument);
}

TEST(MatmulTest, CudaWithoutDeviceIsFailedPrecondition) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  float x = 1, w = 2, y = 0;
  MatmulParams p;
  p.x = &x;
  p.w = &w;
  p.y = &y;
  p.m = p.n = p.k = 1;
  const Status s = Matmul(p, Backend::kCuda);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("CUDA"), std::string::npos) << s.message();
  EXPECT_EQ(ResolveBackend(Backend::kAuto), Backend::kCpu);
  ASSERT_TRUE(Matmul(p, Backend::kAuto).ok());
  EXPECT_EQ(y, 2.f);
}

}  // namespace
}  // namespace icecache::kernels
