#include "kvstore/vector_ops.h"

#include "kernels/dtype.h"
#include "kernels/simd_target.h"
#include "tests/kvstore/kv_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <iostream>
#include <random>

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

namespace icecache::kvstore {
namespace {

TEST(VectorOpsTest, HalfConversionsMatchIeee) {
  EXPECT_EQ(kernels::F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(kernels::F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(kernels::F32ToF16(65504.f), 0x7bff);
  EXPECT_EQ(kernels::F32ToF16(65520.f), 0x7c00);  // rounds to inf
  EXPECT_EQ(kernels::F32ToF16(5.9604645e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(kernels::F32ToF16(2.98023224e-8f), 0x0000);  // exactly half of it: ties to even
  EXPECT_EQ(kernels::F32ToF16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  EXPECT_EQ(kernels::F32ToF16(1.0f + 3.0f / 2048), 0x3c02);  // tie -> even (up)
  EXPECT_FLOAT_EQ(kernels::F16ToF32(0x3555), 0.333251953125f);
  EXPECT_FLOAT_EQ(kernels::F16ToF32(0x0001), 5.9604645e-8f);
  EXPECT_TRUE(std::isinf(kernels::F16ToF32(0x7c00)));
  EXPECT_TRUE(std::isnan(kernels::F16ToF32(0x7e00)));
  // Every finite half round-trips exactly.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(kernels::F32ToF16(kernels::F16ToF32(static_cast<uint16_t>(h))), h) << h;
  }
}

// Every finite half through each target's vector f16 load (F16C's vcvtph2ps on avx2 / avx512,
// vcvt_f32_f16 on neon; the scalar target's F16ToF32) gives F16ToF32's value, subnormals and
// signed zeros included: rows of 16 halves scored against one-hot queries (x * 1 plus zeros, exact).
TEST(VectorOpsTest, F16RowsLoadExactlyOnEveryTarget) {
  constexpr int kDim = 16;
  std::vector<uint16_t> halves;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) != 0x7c00) halves.push_back(static_cast<uint16_t>(h));  // not inf / NaN
  }
  ASSERT_EQ(halves.size() % kDim, 0u);
  const int rows = static_cast<int>(halves.size() / kDim);
  std::vector<float> q(kDim), out(rows);
  const kernels::SimdTarget saved = kernels::ActiveSimdTarget();
  for (kernels::SimdTarget t : kernels::SupportedSimdTargets()) {
    SCOPED_TRACE(std::string(kernels::SimdTargetName(t)));
    ASSERT_TRUE(kernels::SetSimdTarget(t).ok());
    for (int j = 0; j < kDim; ++j) {
      std::fill(q.begin(), q.end(), 0.f);
      q[j] = 1.f;
      ScoreRows(DType::kF16, halves.data(), rows, kDim, q.data(), out.data());
      for (int r = 0; r < rows; ++r) {
        const uint16_t h = halves[static_cast<size_t>(r) * kDim + j];
        ASSERT_EQ(out[r], kernels::F16ToF32(h)) << "half bits " << h;  // == : -0 scores as +0
      }
    }
  }
  ASSERT_TRUE(kernels::SetSimdTarget(saved).ok());
}

TEST(VectorOpsTest, Bf16RowConversionMatchesScalar) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> x(1000);
  for (auto& v : x) {
    uint32_t u = bits(rng);
    std::memcpy(&v, &u, 4);  // every bit pattern: NaNs, infs, subnormals, ties
  }
  x[0] = 1.0f + 1.0f / 256;  // exact tie
  std::vector<uint16_t> got(x.size());
  RowFromF32(DType::kBF16, x.data(), got.data(), static_cast<int>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], kernels::F32ToBf16(x[i])) << i;
}

TEST(VectorOpsTest, StreamRowFromF32WritesTheSameBytesAlignedOrNot) {
  // Non-temporal stores apply to 64-byte-aligned rows of whole lines; other rows (an odd offset,
  // a ragged length, f16) take the plain path. Every case must write RowFromF32's bytes, ties,
  // NaN, inf and subnormals included, and nothing past the row.
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  std::vector<float> x(256);
  for (auto& v : x) v = g(rng);
  x[1] = 1.0f + 1.0f / 256;
  x[2] = std::nanf("");
  x[3] = -INFINITY;
  x[4] = 1e-40f;
  for (DType dt : {DType::kBF16, DType::kF32, DType::kF16}) {
    const size_t es = kernels::DTypeSize(dt);
    for (int n : {128, 64, 96, 40}) {
      for (size_t offset : {size_t{0}, size_t{2}, size_t{64}}) {
        SCOPED_TRACE("dtype " + std::to_string(static_cast<int>(dt)) + " n " + std::to_string(n) + " offset " +
                     std::to_string(offset));
        alignas(64) uint8_t want[1280], got[1280];
        std::memset(want, 0xab, sizeof(want));
        std::memset(got, 0xab, sizeof(got));
        RowFromF32(dt, x.data(), want + offset, n);
        StreamRowFromF32(dt, x.data(), got + offset, n);
        StoreFence();
        ASSERT_EQ(std::memcmp(want, got, sizeof(want)), 0);
        ASSERT_LE(offset + n * es, sizeof(want));
      }
    }
  }
}

class ScoreRowsTest : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(ScoreRowsTest, MatchesNaive) {
  const auto [dt, dim] = GetParam();
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  const int rows = 13;  // odd: the fused multi-query kernel's four- and two-row loops and their tails
  std::vector<float> x(rows * dim), q(9 * dim);
  for (auto& v : x) v = g(rng);
  for (auto& v : q) v = g(rng);
  std::vector<uint8_t> stored(rows * dim * kernels::DTypeSize(dt));
  RowFromF32(dt, x.data(), stored.data(), rows * dim);
  std::vector<float> back(rows * dim);
  RowToF32(dt, stored.data(), back.data(), rows * dim);
  auto ref = [&](int r, int j) {
    double s = 0;
    for (int i = 0; i < dim; ++i) s += double(back[r * dim + i]) * q[j * dim + i];
    return s;
  };
  // fp32 accumulation of dim products of O(1) values: a few ulps times sqrt(dim).
  auto tol = [&](double v) { return 1e-4 * (1 + std::fabs(v)) * std::sqrt(dim); };
  std::vector<float> out(rows);
  ScoreRows(dt, stored.data(), rows, dim, q.data(), out.data());
  for (int r = 0; r < rows; ++r) EXPECT_NEAR(out[r], ref(r, 0), tol(ref(r, 0)));
  // nq 2, 3, 4, 8 take the fused kernel (dim % 16 == 0 on avx512, % 8 on avx2), 5, 6, 7 and 9
  // passes of it (3 + 2, 3 + 3, 3 + 4, 3 + 3 + 3), 1 the per-query loop.
  for (int nq : {1, 2, 3, 4, 5, 6, 7, 8, 9}) {
    std::vector<float> multi(static_cast<size_t>(nq) * rows, 99.f);
    ScoreRowsMulti(dt, stored.data(), rows, dim, q.data(), nq, multi.data());
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < nq; ++j) EXPECT_NEAR(multi[j * rows + r], ref(r, j), tol(ref(r, j))) << "nq " << nq;
    // The fused kernels sum as ScoreRows does, query by query: the same floats.
    for (int j = 0; j < nq; ++j) {
      ScoreRows(dt, stored.data(), rows, dim, q.data() + j * dim, out.data());
      for (int r = 0; r < rows; ++r) EXPECT_EQ(multi[j * rows + r], out[r]) << "nq " << nq << " query " << j << " row " << r;
    }
  }
  // A row's score does not depend on the call: scored alone, or from any first row on, each row
  // gets the floats it got above (a tree's group query rescores an upper node's row alone and
  // compares it with the same row scored in its leaf; DciTreeFlatTest).
  const size_t row_bytes = static_cast<size_t>(dim) * kernels::DTypeSize(dt);
  ScoreRows(dt, stored.data(), rows, dim, q.data(), out.data());
  for (int first = 1; first < rows; ++first) {
    std::vector<float> part(rows - first), one(8);
    ScoreRows(dt, stored.data() + first * row_bytes, rows - first, dim, q.data(), part.data());
    for (int r = first; r < rows; ++r) EXPECT_EQ(part[r - first], out[r]) << "from row " << first << ", row " << r;
    for (int nq : {1, 2, 4, 8}) {
      ScoreRowsMulti(dt, stored.data() + first * row_bytes, 1, dim, q.data(), nq, one.data());
      EXPECT_EQ(one[0], out[first]) << "row " << first << " alone, nq " << nq;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ScoreRowsTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                            ::testing::Values(5, 64, 128, 100)));

TEST(VectorOpsTest, ArgmaxAugDotMatchesNaive) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  // dim 27 and 5: the SIMD forms' dimension tails (NEON takes dimensions four at a time).
  for (const auto& [nr, dim] : {std::pair{1, 24}, std::pair{7, 24}, std::pair{32, 24}, std::pair{45, 24},
                                std::pair{100, 24}, std::pair{45, 27}, std::pair{100, 5}}) {
    const int nx = 9, ld = (nr + 31) / 32 * 32;
    std::vector<float> rows(nr * dim), x(nx * dim), xe(nx), re(ld, -INFINITY), rows_t(dim * ld, 0.f);
    for (auto& v : rows) v = g(rng);
    for (auto& v : x) v = g(rng);
    for (auto& v : xe) v = std::fabs(g(rng));
    for (int r = 0; r < nr; ++r) re[r] = std::fabs(g(rng));
    for (int r = 0; r < nr; ++r)
      for (int j = 0; j < dim; ++j) rows_t[j * ld + r] = rows[r * dim + j];
    std::vector<int32_t> best(nx);
    ArgmaxAugDot(x.data(), dim, xe.data(), nx, rows_t.data(), ld, re.data(), nr, dim, best.data());
    for (int i = 0; i < nx; ++i) {
      int arg = 0;
      double bs = -1e30;
      for (int r = 0; r < nr; ++r) {
        double s = double(xe[i]) * re[r];
        for (int j = 0; j < dim; ++j) s += double(x[i * dim + j]) * rows[r * dim + j];
        if (s > bs) { bs = s; arg = r; }
      }
      EXPECT_EQ(best[i], arg) << "nr=" << nr << " dim=" << dim << " i=" << i;
    }
  }
}

TEST(VectorOpsTest, ArgmaxAugDotBf16PicksTheBestBf16Product) {
  // Reference: the same bf16-rounded inputs in double. The kernel sums in fp32, so its pick may
  // differ only between rows whose reference scores are within 1e-4 of the best (scores ~ 10).
  std::mt19937 rng(7);
  std::normal_distribution<float> g;
  auto bf = [](float v) { return kernels::Bf16ToF32(kernels::F32ToBf16(v)); };
  for (int dim : {24, 33, 128}) {
    for (int nr : {1, 7, 32, 45, 100}) {
      const int nx = 19, pairs = (dim + 1) / 2, ld = (nr + 31) / 32 * 32;
      std::vector<float> rows(nr * dim), x(nx * dim), xe(nx), re(ld, -INFINITY);
      for (auto& v : rows) v = g(rng);
      for (auto& v : x) v = g(rng);
      for (auto& v : xe) v = std::fabs(g(rng));
      for (int r = 0; r < nr; ++r) re[r] = std::fabs(g(rng));
      std::vector<uint32_t> rows_p(pairs * ld, 0), x_p(nx * pairs, 0);
      auto pack = [&](const float* src, int j) {
        const uint32_t lo = kernels::F32ToBf16(src[2 * j]);
        const uint32_t hi = 2 * j + 1 < dim ? kernels::F32ToBf16(src[2 * j + 1]) : 0;
        return lo | hi << 16;
      };
      for (int r = 0; r < nr; ++r)
        for (int j = 0; j < pairs; ++j) rows_p[j * ld + r] = pack(&rows[r * dim], j);
      for (int i = 0; i < nx; ++i)
        for (int j = 0; j < pairs; ++j) x_p[i * pairs + j] = pack(&x[i * dim], j);
      std::vector<int32_t> best(nx);
      ArgmaxAugDotBf16(x_p.data(), xe.data(), nx, rows_p.data(), ld, re.data(), nr, pairs, best.data());
      for (int i = 0; i < nx; ++i) {
        auto score = [&](int r) {
          double s = double(xe[i]) * re[r];
          for (int j = 0; j < dim; ++j) s += double(bf(x[i * dim + j])) * bf(rows[r * dim + j]);
          return s;
        };
        double bs = -1e30;
        for (int r = 0; r < nr; ++r) bs = std::max(bs, score(r));
        ASSERT_GE(best[i], 0);
        ASSERT_LT(best[i], nr);
        EXPECT_GE(score(best[i]), bs - 1e-4) << "dim=" << dim << " nr=" << nr << " i=" << i;
      }
    }
  }
}

TEST(VectorOpsTest, KthLargestMatchesNthElement) {
  std::mt19937 rng(9);
  std::normal_distribution<float> g;
  std::vector<int32_t> scratch(700);
  for (int n : {1, 2, 5, 64, 655, 700}) {
    std::vector<float> v(n);
    for (auto& x : v) x = g(rng) * 10;
    for (int i = 0; i + 3 < n; i += 7) v[i + 3] = v[i];  // duplicates
    if (n > 4) v[4] = -0.f, v[1] = 0.f, v[2] = -INFINITY;
    for (int k : {1, 2, n / 2 + 1, n}) {
      if (k < 1 || k > n) continue;
      std::vector<float> w = v;
      std::nth_element(w.begin(), w.begin() + (k - 1), w.end(), std::greater<float>());
      const float got = KthLargest(v.data(), n, k, scratch.data());
      EXPECT_EQ(got, w[k - 1]) << "n=" << n << " k=" << k;
      int at_least = 0;
      for (float x : v) at_least += x >= got;
      EXPECT_GE(at_least, k);
    }
  }
}

// The int8 kernels on every SIMD target this CPU supports against exact integer references, on
// words whose bytes span the whole ranges each kernel takes (u8 rows; s8 queries for ScoreRowsI8,
// -128 * 0 ... 127 * 255: the pair sums that an int16-saturating multiply-add would clip; keys
// within +-kI8ParentKeyMax for ArgmaxDotI8, whose avx2 form adds two quads' pairs in int16), so
// every target must give the same integers.
TEST(VectorOpsTest, Int8KernelsAreExactOnEveryTargetForExtremeBytes) {
#if defined(__aarch64__)
  // The neon int8 kernels take the sdot form where the CPU has dotprod, else the vmull_s8 form
  // (scripts/check-arm64.sh runs both CPU models and looks for this line).
  std::cout << "note: this CPU " << ((getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0 ? "has dotprod (sdot form)" : "lacks dotprod (vmull_s8 form)") << "\n";
#endif
  std::mt19937 rng(7);
  const int quads = 17, nr = 75, ld = 96, nx = 9;
  std::vector<uint32_t> x(static_cast<size_t>(nx) * quads), xp(x.size()), rows_t(static_cast<size_t>(quads) * ld);
  enum class Kind { kQuery, kParentKey, kRow };
  auto extreme_word = [&](Kind kind) {
    constexpr int m = kI8ParentKeyMax;
    uint32_t w = 0;
    for (int b = 0; b < 4; ++b) {
      const int r = static_cast<int>(rng() % 4);
      const int v = kind == Kind::kQuery       ? (r == 0 ? -128 : r == 1 ? 127 : r == 2 ? -127 : static_cast<int>(rng() % 256) - 128)
                    : kind == Kind::kParentKey ? (r == 0 ? -m : r == 1 ? m : r == 2 ? 1 - m : static_cast<int>(rng() % (2 * m + 1)) - m)
                                               : (r == 0 ? 255 : r == 1 ? 0 : r == 2 ? 254 : static_cast<int>(rng() % 256));
      w |= static_cast<uint32_t>(v & 0xff) << (8 * b);
    }
    return w;
  };
  for (auto& w : x) w = extreme_word(Kind::kQuery);
  for (auto& w : xp) w = extreme_word(Kind::kParentKey);
  for (auto& w : rows_t) w = extreme_word(Kind::kRow);
  auto dot = [&](const uint32_t* key, int r) {
    int64_t d = 0;
    for (int j = 0; j < quads; ++j) {
      for (int b = 0; b < 4; ++b) {
        d += static_cast<int8_t>(key[j] >> (8 * b)) * (static_cast<int>((rows_t[static_cast<size_t>(j) * ld + r] >> (8 * b)) & 0xff) - 128);
      }
    }
    return d;
  };
  auto byte_sum = [&](const uint32_t* key) {
    int32_t s = 0;
    for (int j = 0; j < quads; ++j)
      for (int b = 0; b < 4; ++b) s += static_cast<int8_t>(key[j] >> (8 * b));
    return s;
  };
  std::vector<int32_t> x_sum(nx), xp_sum(nx), want(nx);
  for (int i = 0; i < nx; ++i) {
    x_sum[i] = byte_sum(x.data() + static_cast<size_t>(i) * quads);
    const uint32_t* key = xp.data() + static_cast<size_t>(i) * quads;
    xp_sum[i] = byte_sum(key);
    int64_t best = INT64_MIN;
    for (int r = 0; r < nr; ++r) {
      if (dot(key, r) > best) {
        best = dot(key, r);
        want[i] = r;
      }
    }
  }
  // ScoreRowsI8 over the same rows as RowBlocksI8 blocks (scale 1, so the score is the integer).
  RowBlocksI8 blocks;
  blocks.Reset(4 * quads);
  blocks.rows = nr;
  blocks.words.assign(static_cast<size_t>((nr + 31) / 32) * quads * 32, 0x80808080u);
  for (int r = 0; r < nr; ++r)
    for (int j = 0; j < quads; ++j) blocks.words[static_cast<size_t>(r / 32) * quads * 32 + j * 32 + r % 32] = rows_t[static_cast<size_t>(j) * ld + r];
  blocks.scale.assign(nr, 1.f);
  const std::vector<float> q_scale(nx, 1.f);
  const kernels::SimdTarget saved = kernels::ActiveSimdTarget();
  for (kernels::SimdTarget t : kernels::SupportedSimdTargets()) {
    SCOPED_TRACE(std::string(kernels::SimdTargetName(t)));
    ASSERT_TRUE(kernels::SetSimdTarget(t).ok());
    testing::ForEachInt8Form([&] {
      std::vector<int32_t> best(nx, -1);
      ArgmaxDotI8(xp.data(), xp_sum.data(), nx, rows_t.data(), ld, nr, quads, best.data());
      EXPECT_EQ(best, want);
      std::vector<float> out(static_cast<size_t>(nx) * nr);
      ScoreRowsI8(blocks, x.data(), quads, x_sum.data(), q_scale.data(), nx, out.data());
      for (int i = 0; i < nx; ++i)
        for (int r = 0; r < nr; ++r)
          ASSERT_EQ(out[static_cast<size_t>(i) * nr + r], static_cast<float>(dot(x.data() + static_cast<size_t>(i) * quads, r))) << i << " " << r;
    });
  }
  ASSERT_TRUE(kernels::SetSimdTarget(saved).ok());
}

// SelfAndCrossDotF32's contract: DotF32(a, a) and DotF32(b, a) bit for bit, on every target and
// for lengths around each target's vector widths (tails included).
TEST(VectorOpsTest, SelfAndCrossDotIsDotF32BitForBitOnEveryTarget) {
  std::mt19937 rng(13);
  std::normal_distribution<float> g;
  const kernels::SimdTarget saved = kernels::ActiveSimdTarget();
  for (kernels::SimdTarget t : kernels::SupportedSimdTargets()) {
    SCOPED_TRACE(std::string(kernels::SimdTargetName(t)));
    ASSERT_TRUE(kernels::SetSimdTarget(t).ok());
    for (int n : {1, 3, 4, 5, 8, 15, 16, 17, 31, 33, 64, 100}) {
      std::vector<float> a(n), b(n);
      for (auto& v : a) v = g(rng);
      for (auto& v : b) v = g(rng);
      float aa = 0.f, ab = 0.f;
      SelfAndCrossDotF32(a.data(), b.data(), n, &aa, &ab);
      const float want_aa = DotF32(a.data(), a.data(), n), want_ab = DotF32(b.data(), a.data(), n);
      EXPECT_EQ(std::memcmp(&aa, &want_aa, 4), 0) << "n=" << n << " " << aa << " vs " << want_aa;
      EXPECT_EQ(std::memcmp(&ab, &want_ab, 4), 0) << "n=" << n << " " << ab << " vs " << want_ab;
    }
  }
  ASSERT_TRUE(kernels::SetSimdTarget(saved).ok());
}

// The int8 quantisers (QuantizeKeyI8, QuantizeRowsI8, RowBlocksI8::Append) write the same words,
// sums and scales on every target: the vector forms round (nearest, ties to even) and clamp as the
// scalar form does. Values include exact .5 ties (scale 1: max |v| = 127) and every dim tail.
TEST(VectorOpsTest, Int8QuantisersGiveTheSameWordsOnEveryTarget) {
  std::mt19937 rng(17);
  std::normal_distribution<float> g;
  const kernels::SimdTarget saved = kernels::ActiveSimdTarget();
  for (int dim : {1, 3, 4, 7, 8, 9, 13, 16, 17, 33, 64, 100}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const int nr = 5, quads = I8Quads(dim), ld = 32;
    std::vector<float> rows(static_cast<size_t>(nr) * dim), extra(nr);
    for (auto& v : rows) v = 30.f * g(rng);  // below 127: row 0's first value, 127, is the key's max
    for (int j = 0; j < dim; j += 2) rows[j] = static_cast<float>(j % 7) - 3.5f;  // row 0: ties
    rows[0] = 127.f;
    for (auto& e : extra) e = std::fabs(100.f * g(rng));
    std::vector<uint32_t> want_key, want_key6, want_rows, want_block;
    int32_t want_sum = 0, want_sum6 = 0;
    float want_scale = 0.f, want_s = 0.f, want_mx = 0.f;
    for (kernels::SimdTarget t : kernels::SupportedSimdTargets()) {
      SCOPED_TRACE(std::string(kernels::SimdTargetName(t)));
      ASSERT_TRUE(kernels::SetSimdTarget(t).ok());
      std::vector<uint32_t> key(quads), rows_t(static_cast<size_t>(quads) * ld, 0u);
      float scale = 0.f;
      const int32_t sum = QuantizeKeyI8(rows.data(), dim, 3.5f, key.data(), &scale);
      std::vector<uint32_t> key6(quads);  // the parent search's 6-bit key
      const int32_t sum6 = QuantizeKeyI8(rows.data(), dim, 3.5f, key6.data(), nullptr, kI8ParentKeyMax);
      const float s = QuantizeRowsI8(rows.data(), nr, dim, extra.data(), ld, rows_t.data());
      RowBlocksI8 block;
      block.Reset(dim);
      for (int r = 0; r < nr; ++r) block.Append(rows.data() + static_cast<size_t>(r) * dim);
      if (t == kernels::SimdTarget::kScalar) {
        want_key = key, want_key6 = key6, want_rows = rows_t, want_block = block.words;
        want_sum = sum, want_sum6 = sum6, want_scale = scale, want_s = s, want_mx = block.max_scale;
        int32_t bytes = 0;
        for (int b = 0; b < 4 * quads; ++b) bytes += static_cast<int8_t>(key[b / 4] >> (8 * (b % 4)));
        EXPECT_EQ(sum, bytes);
        continue;
      }
      EXPECT_EQ(key, want_key);
      EXPECT_EQ(sum, want_sum);
      EXPECT_EQ(key6, want_key6);
      EXPECT_EQ(sum6, want_sum6);
      EXPECT_EQ(scale, want_scale);
      EXPECT_EQ(rows_t, want_rows);
      EXPECT_EQ(s, want_s);
      EXPECT_EQ(block.words, want_block);
      EXPECT_EQ(block.max_scale, want_mx);
    }
  }
  ASSERT_TRUE(kernels::SetSimdTarget(saved).ok());
}

}  // namespace
}  // namespace icecache::kvstore
