// The int8 parent search: QuantizeRowI8 and ArgmaxAugDotI8 against naive references, and a
// DciTree built with DciParams::int8_parent_search.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "kvstore/dci_tree.h"
#include "kvstore/synthetic_keys.h"
#include "kvstore/vector_ops.h"
#include "kvstore/wire.h"

namespace icecache::kvstore {
namespace {

std::vector<float> Gaussian(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

TEST(QuantizeRowI8Test, RoundTripWithinHalfAStep) {
  for (int n : {1, 7, 128}) {
    auto v = Gaussian(n, 1 + n);
    std::vector<int8_t> q(n);
    const float s = QuantizeRowI8(v.data(), n, q.data());
    float mx = 0.f;
    for (float x : v) mx = std::max(mx, std::fabs(x));
    EXPECT_FLOAT_EQ(s, mx / 127.f);
    int extreme = 0;
    for (int j = 0; j < n; ++j) {
      EXPECT_LE(std::abs(static_cast<int>(q[j])), 127);
      // Half a quantisation step plus fp32 rounding of v / s.
      EXPECT_LE(std::fabs(q[j] * s - v[j]), 0.5f * s * (1.f + 1e-5f)) << "n " << n << " j " << j;
      extreme += std::abs(static_cast<int>(q[j])) == 127;
    }
    EXPECT_GE(extreme, 1);  // the largest |v| maps to +-127
  }
  std::vector<float> zero(5, 0.f);
  std::vector<int8_t> q(5, 3);
  EXPECT_EQ(QuantizeRowI8(zero.data(), 5, q.data()), 0.f);
  EXPECT_EQ(q, std::vector<int8_t>(5, 0));
}

// Quantised operands in the layout of ArgmaxAugDotI8, with the fp32 originals kept.
struct I8Problem {
  int nx, nr, dim, quads, ld;
  std::vector<float> x, rows, x_extra, row_extra_f;  // originals: [nx, dim], [nr, dim], [nx], [nr]
  std::vector<int8_t> xq, rq;                          // [nx, 4 quads], [nr, 4 quads]
  std::vector<float> xs;                               // key scales [nx]
  std::vector<uint32_t> xw, rows_t;                    // kernel inputs
  std::vector<int32_t> row_sum;
  std::vector<float> row_scale, row_extra, x_extra_scaled;
};

I8Problem MakeProblem(int nx, int nr, int dim, uint64_t seed) {
  I8Problem p;
  p.nx = nx, p.nr = nr, p.dim = dim, p.quads = (dim + 3) / 4, p.ld = (nr + 31) / 32 * 32;
  p.x = Gaussian(static_cast<size_t>(nx) * dim, seed);
  p.rows = Gaussian(static_cast<size_t>(nr) * dim, seed + 1);
  std::mt19937_64 rng(seed + 2);
  std::uniform_real_distribution<float> u(0.f, 3.f);
  for (int i = 0; i < nx; ++i) p.x_extra.push_back(u(rng));
  for (int r = 0; r < nr; ++r) p.row_extra_f.push_back(u(rng));
  const int w = 4 * p.quads;
  p.xq.assign(static_cast<size_t>(nx) * w, 0);
  p.rq.assign(static_cast<size_t>(nr) * w, 0);
  p.xw.assign(static_cast<size_t>(nx) * p.quads, 0);
  p.rows_t.assign(static_cast<size_t>(p.quads) * p.ld, 0);
  p.row_sum.assign(p.ld, 0);
  p.row_scale.assign(p.ld, 0.f);
  p.row_extra.assign(p.ld, -INFINITY);
  for (int i = 0; i < nx; ++i) {
    const float s = QuantizeRowI8(&p.x[static_cast<size_t>(i) * dim], dim, &p.xq[static_cast<size_t>(i) * w]);
    p.xs.push_back(s);
    p.x_extra_scaled.push_back(p.x_extra[i] / s);
    auto* bytes = reinterpret_cast<uint8_t*>(&p.xw[static_cast<size_t>(i) * p.quads]);
    for (int j = 0; j < w; ++j) bytes[j] = static_cast<uint8_t>(p.xq[static_cast<size_t>(i) * w + j] + 128);
  }
  for (int r = 0; r < nr; ++r) {
    int8_t* q = &p.rq[static_cast<size_t>(r) * w];
    p.row_scale[r] = QuantizeRowI8(&p.rows[static_cast<size_t>(r) * dim], dim, q);
    p.row_extra[r] = p.row_extra_f[r];
    for (int j = 0; j < dim; ++j) p.row_sum[r] += q[j];
    for (int j = 0; j < p.quads; ++j) std::memcpy(&p.rows_t[static_cast<size_t>(j) * p.ld + r], q + 4 * j, 4);
  }
  return p;
}

// Naive: the int8 dot in int64 from the quantised values, then the kernel's two roundings.
std::vector<int32_t> NaiveI8(const I8Problem& p) {
  const int w = 4 * p.quads;
  std::vector<int32_t> best(p.nx);
  for (int i = 0; i < p.nx; ++i) {
    float bs = -INFINITY;
    for (int r = 0; r < p.nr; ++r) {
      int64_t dot = 0;
      for (int j = 0; j < p.dim; ++j) dot += int64_t{p.xq[static_cast<size_t>(i) * w + j]} * p.rq[static_cast<size_t>(r) * w + j];
      const float s = std::fma(p.x_extra_scaled[i], p.row_extra[r], static_cast<float>(dot) * p.row_scale[r]);
      if (s > bs) { bs = s; best[i] = r; }
    }
  }
  return best;
}

TEST(ArgmaxAugDotI8Test, MatchesNaiveInt8Reference) {
  for (const auto& [nx, nr, dim] : {std::tuple{1, 1, 4}, std::tuple{13, 31, 5}, std::tuple{40, 33, 64},
                                    std::tuple{67, 100, 128}, std::tuple{9, 655, 129}}) {
    SCOPED_TRACE("nx " + std::to_string(nx) + " nr " + std::to_string(nr) + " dim " + std::to_string(dim));
    const I8Problem p = MakeProblem(nx, nr, dim, 100 + nx);
    std::vector<int32_t> best(nx, -1);
    ArgmaxAugDotI8(p.xw.data(), p.x_extra_scaled.data(), nx, p.rows_t.data(), p.ld, p.row_sum.data(),
                   p.row_scale.data(), p.row_extra.data(), nr, p.quads, best.data());
    // Identical arithmetic (exact integer sums, same fp32 roundings): the same indices.
    EXPECT_EQ(best, NaiveI8(p));
  }
}

TEST(ArgmaxAugDotI8Test, CloseToFp32ArgmaxWithinQuantisationBound) {
  const int nx = 200, nr = 300, dim = 128;
  const I8Problem p = MakeProblem(nx, nr, dim, 7);
  std::vector<int32_t> best(nx, -1);
  ArgmaxAugDotI8(p.xw.data(), p.x_extra_scaled.data(), nx, p.rows_t.data(), p.ld, p.row_sum.data(),
                 p.row_scale.data(), p.row_extra.data(), nr, p.quads, best.data());
  int agree = 0;
  for (int i = 0; i < nx; ++i) {
    const float* xi = &p.x[static_cast<size_t>(i) * dim];
    std::vector<double> s(nr);
    int arg = 0;
    for (int r = 0; r < nr; ++r) {
      const float* rr = &p.rows[static_cast<size_t>(r) * dim];
      s[r] = double{p.x_extra[i]} * p.row_extra_f[r];
      for (int j = 0; j < dim; ++j) s[r] += double{xi[j]} * rr[j];
      if (s[r] > s[arg]) arg = r;
    }
    agree += best[i] == arg;
    // |x.r - sx sr xq.rq| <= sum_j (|x_j| sr / 2 + |r_j| sx / 2 + sx sr / 4) per row; the chosen
    // row loses at most the sum of its own and the best row's bounds (plus fp32 slack 1e-3).
    auto bound = [&](int r) {
      const float* rr = &p.rows[static_cast<size_t>(r) * dim];
      double b = 0;
      for (int j = 0; j < dim; ++j)
        b += std::fabs(xi[j]) * p.row_scale[r] / 2 + std::fabs(rr[j]) * p.xs[i] / 2 + p.xs[i] * p.row_scale[r] / 4;
      return b;
    };
    EXPECT_GE(s[best[i]], s[arg] - bound(arg) - bound(best[i]) - 1e-3) << "key " << i;
  }
  // Gaussian rows: the int8 choice is the fp32 one for most keys (196/200 here).
  EXPECT_GE(agree, nx * 8 / 10);
}

TEST(ArgmaxAugDotI8Test, TiesGoToTheLowestRowAndPaddingIsNeverChosen) {
  I8Problem p = MakeProblem(20, 40, 16, 9);
  // Rows 5, 22 and 37 identical and far ahead of the others.
  for (int r : {5, 22, 37}) {
    for (int j = 0; j < p.quads; ++j) p.rows_t[static_cast<size_t>(j) * p.ld + r] = 0x7f7f7f7fu;
    p.row_sum[r] = 127 * 16;
    p.row_scale[r] = 1.f;
    p.row_extra[r] = 0.f;
  }
  // Padding columns 40..63 carry large scales/sums that must not matter.
  for (int r = 40; r < p.ld; ++r) {
    p.row_scale[r] = 1e3f;
    p.row_sum[r] = -1000;
  }
  for (int i = 0; i < p.nx; ++i) {  // all-positive keys
    auto* bytes = reinterpret_cast<uint8_t*>(&p.xw[static_cast<size_t>(i) * p.quads]);
    for (int j = 0; j < 16; ++j) bytes[j] = 128 + 100;
  }
  std::vector<int32_t> best(p.nx, -1);
  ArgmaxAugDotI8(p.xw.data(), p.x_extra_scaled.data(), p.nx, p.rows_t.data(), p.ld, p.row_sum.data(),
                 p.row_scale.data(), p.row_extra.data(), p.nr, p.quads, best.data());
  EXPECT_EQ(best, std::vector<int32_t>(p.nx, 5));
}

TEST(ArgmaxAugDotI8Test, HeadroomColumnsPastTheLastRowBlockAreNotRead) {
  // A level matrix keeps insertion headroom: ld far beyond nr. Columns from the first block of 32
  // past nr on hold rows that would win (and garbage sums) if they were scanned.
  const I8Problem p0 = MakeProblem(24, 70, 32, 11);
  I8Problem p = p0;
  p.ld = 160;
  p.rows_t.assign(static_cast<size_t>(p.quads) * p.ld, 0x7f7f7f7fu);
  p.row_sum.assign(p.ld, 127 * 32);
  p.row_scale.assign(p.ld, 1e3f);
  p.row_extra.assign(p.ld, 1e3f);
  for (int r = 0; r < 96; ++r) {  // rows, then the -inf pad of the last block (70..95)
    p.row_sum[r] = r < p.nr ? p0.row_sum[r] : 0;
    p.row_scale[r] = p0.row_scale[r];
    p.row_extra[r] = p0.row_extra[r];
    for (int j = 0; j < p.quads; ++j)
      p.rows_t[static_cast<size_t>(j) * p.ld + r] = r < p.nr ? p0.rows_t[static_cast<size_t>(j) * p0.ld + r] : 0;
  }
  std::vector<int32_t> best(p.nx, -1);
  ArgmaxAugDotI8(p.xw.data(), p.x_extra_scaled.data(), p.nx, p.rows_t.data(), p.ld, p.row_sum.data(),
                 p.row_scale.data(), p.row_extra.data(), p.nr, p.quads, best.data());
  EXPECT_EQ(best, NaiveI8(p0));
}

std::unique_ptr<PagePool> MakePool(int dim, int64_t pages) {
  PagePoolOptions o;
  o.page_size = 16;
  o.head_dim = dim;
  o.dtype = kernels::DType::kBF16;
  o.num_pages = pages;
  return PagePool::Create(o).value();
}

TokenBlock Block(const std::vector<float>& k, const std::vector<float>& v, int offset, int count, int dim,
                 const float** kp, const float** vp) {
  *kp = k.data() + static_cast<size_t>(offset) * dim;
  *vp = v.data() + static_cast<size_t>(offset) * dim;
  return TokenBlock{offset, count, kp, vp, static_cast<size_t>(dim)};
}

// Fraction of the oracle's top-k leaves a query finds, over the synthetic queries.
double PageRecall(const DciTree& tree, const SyntheticData& data, int dim, int k) {
  std::vector<ScoredLeaf> a, b;
  int hit = 0, total = 0;
  for (int j = 0; j < data.num_queries; ++j) {
    const float* q = data.queries.data() + static_cast<size_t>(j) * dim;
    tree.Query(q, k, &a);
    tree.Oracle(q, k, &b);
    std::set<int32_t> got;
    for (const auto& s : a) got.insert(s.leaf);
    for (const auto& s : b) hit += got.count(s.leaf);
    total += static_cast<int>(b.size());
  }
  return static_cast<double>(hit) / total;
}

TEST(DciTreeInt8ParentsTest, BuildsValidTreeWithBf16RecallAndRoundTrips) {
  const int dim = 64, n = 12000, k = 16;
  auto data = MakeSyntheticData(n, dim, 24);
  const float *kp, *vp;
  EXPECT_TRUE(DciParams::Tuned().int8_parent_search);
  EXPECT_TRUE(DciParams::Flat().int8_parent_search);
  DciParams bf = DciParams::Tuned();
  bf.int8_parent_search = false;
  DciParams i8 = bf;
  i8.int8_parent_search = true;
  auto pool_bf = MakePool(dim, 3000), pool_i8 = MakePool(dim, 3000);
  auto tree_bf = DciTree::Build(bf, pool_bf.get(), 1, Block(data.keys, data.values, 0, n, dim, &kp, &vp)).value();
  auto tree_i8 = DciTree::Build(i8, pool_i8.get(), 1, Block(data.keys, data.values, 0, n, dim, &kp, &vp)).value();
  Status inv = tree_i8->CheckInvariants();
  ASSERT_TRUE(inv.ok()) << inv.ToString();
  EXPECT_EQ(tree_i8->level_counts(), tree_bf->level_counts());  // same levels; only parents may differ
  const double r_bf = PageRecall(*tree_bf, data, dim, k), r_i8 = PageRecall(*tree_i8, data, dim, k);
  // The int8 search moves only near-tied keys between cells: recall within 0.03 of bf16's.
  EXPECT_NEAR(r_i8, r_bf, 0.03);
  EXPECT_GT(r_i8, 0.5);  // and the tree retrieves (not a vacuous comparison)

  WireWriter w;
  tree_i8->Serialize(&w);
  auto dst = MakePool(dim, 3000);
  std::vector<int32_t> pages;
  ASSERT_TRUE(dst->AllocateMany(tree_i8->AllPages().size(), &pages).ok());
  for (size_t i = 0; i < pages.size(); ++i)
    std::memcpy(dst->PageK(pages[i]), pool_i8->PageK(tree_i8->AllPages()[i]), pool_i8->page_bytes());
  WireReader r(w.buffer().data(), w.buffer().size());
  size_t used = 0;
  auto copy = DciTree::Deserialize(&r, dst.get(), pages.data(), pages.size(), &used);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_TRUE((*copy)->params().int8_parent_search);
  EXPECT_TRUE((*copy)->params().bf16_parent_search);
  // Insertions after the build (bf16 search) keep the tree valid.
  std::vector<float> k2 = Gaussian(static_cast<size_t>(500) * dim, 11), v2 = k2;
  const float *kp2, *vp2;
  for (int off = 0; off < 500; off += 50) {
    kp2 = k2.data() + static_cast<size_t>(off) * dim;
    vp2 = v2.data() + static_cast<size_t>(off) * dim;
    ASSERT_TRUE((*copy)->Insert(TokenBlock{n + off, 50, &kp2, &vp2, static_cast<size_t>(dim)}).ok());
  }
  inv = (*copy)->CheckInvariants();
  EXPECT_TRUE(inv.ok()) << inv.ToString();
}

}  // namespace
}  // namespace icecache::kvstore
