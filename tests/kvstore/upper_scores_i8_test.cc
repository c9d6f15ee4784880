// A query's int8 first pass over the upper levels: RowBlocksI8 / ScoreRowsI8 against an integer
// reference and the fp32 dot within ErrorBound, and the trees' rescoring rule (no upper node that
// beats a query's answer is left out of it, and no int8 score reaches the answer).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvstore/dci_tree.h"
#include "kvstore/synthetic_keys.h"
#include "kvstore/vector_ops.h"
#include "tests/kvstore/kv_test_util.h"

namespace icecache::kvstore {
namespace {

// Gaussian rows with a few large outlier channels (as real keys have), so that the int8 steps
// are coarse relative to most values.
std::vector<float> Outliers(size_t rows, int dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> v(rows * dim);
  for (size_t r = 0; r < rows; ++r)
    for (int j = 0; j < dim; ++j) v[r * dim + j] = g(rng) * (j % 17 == 3 ? 12.f : 1.f);
  return v;
}

TEST(ScoreRowsI8Test, MatchesIntegerReferenceAndStaysWithinErrorBound) {
  for (int dim : {5, 64, 128}) {
    for (int nr : {1, 31, 33, 70}) {
      for (int nq : {1, 3, 6}) {
        SCOPED_TRACE("dim " + std::to_string(dim) + " rows " + std::to_string(nr) + " queries " + std::to_string(nq));
        const auto rows = Outliers(nr, dim, 7 + nr), qs = Outliers(nq, dim, 99 + dim);
        RowBlocksI8 b;
        b.Reset(dim);
        for (int r = 0; r < nr; ++r) b.Append(rows.data() + static_cast<size_t>(r) * dim);
        ASSERT_EQ(b.rows, nr);
        const int qq = I8Quads(dim);
        std::vector<uint32_t> qw(static_cast<size_t>(nq) * qq);
        std::vector<int32_t> sum(nq);
        std::vector<float> scale(nq);
        for (int h = 0; h < nq; ++h)
          sum[h] = QuantizeKeyI8(qs.data() + static_cast<size_t>(h) * dim, dim, 0.f, qw.data() + static_cast<size_t>(h) * qq, &scale[h]);
        std::vector<float> out(static_cast<size_t>(nq) * nr, NAN);
        testing::ForEachInt8Form([&] {
          std::fill(out.begin(), out.end(), NAN);
          ScoreRowsI8(b, qw.data(), qq, sum.data(), scale.data(), nq, out.data());
          for (int h = 0; h < nq; ++h) {
            const float* q = qs.data() + static_cast<size_t>(h) * dim;
            float q_l1 = 0.f;
            for (int j = 0; j < dim; ++j) q_l1 += std::fabs(q[j]);
            for (int r = 0; r < nr; ++r) {
              // Bytes read back from the documented layout: block r / 32, [quads][32].
              int64_t dot = 0;
              const uint32_t* blk = b.words.data() + static_cast<size_t>(r / 32) * b.quads * 32 + r % 32;
              for (int j = 0; j < b.quads; ++j)
                for (int k = 0; k < 4; ++k)
                  dot += int64_t{static_cast<int8_t>(qw[static_cast<size_t>(h) * qq + j] >> (8 * k))} *
                         (static_cast<int>((blk[j * 32] >> (8 * k)) & 0xff) - 128);
              const float got = out[static_cast<size_t>(h) * nr + r];
              EXPECT_EQ(got, static_cast<float>(dot) * (scale[h] * b.scale[r])) << "h " << h << " r " << r;
              double exact = 0;
              for (int j = 0; j < dim; ++j) exact += double{q[j]} * rows[static_cast<size_t>(r) * dim + j];
              EXPECT_LE(std::fabs(got - exact), b.ErrorBound(q_l1, scale[h]) * 1.0001 + 1e-6) << "h " << h << " r " << r;
            }
          }
        });
      }
    }
  }
}

TEST(RowBlocksI8Test, AppendingNeverMovesARowAndZeroRowsScoreZero) {
  const int dim = 12;
  const auto rows = Outliers(70, dim, 3);
  RowBlocksI8 b;
  b.Reset(dim);
  for (int r = 0; r < 32; ++r) b.Append(rows.data() + static_cast<size_t>(r) * dim);
  const std::vector<uint32_t> first(b.words.begin(), b.words.end());
  for (int r = 32; r < 70; ++r) b.Append(rows.data() + static_cast<size_t>(r) * dim);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), b.words.begin()));
  EXPECT_EQ(b.words.size(), static_cast<size_t>(3) * b.quads * 32);
  std::vector<float> zero(dim, 0.f);
  b.Append(zero.data());
  EXPECT_EQ(b.scale.back(), 0.f);
  std::vector<uint32_t> qw(I8Quads(dim));
  float s = 0.f;
  const int32_t sum = QuantizeKeyI8(rows.data(), dim, 0.f, qw.data(), &s);
  std::vector<float> out(b.rows);
  ScoreRowsI8(b, qw.data(), 0, &sum, &s, 1, out.data());
  EXPECT_EQ(out.back(), 0.f);
}

// Exact score of position p's key as the pages hold it.
double ExactScore(const std::vector<float>& keys, const PagePool& pool, int dim, int64_t p, const float* q) {
  const auto k = testing::Rounded(pool, keys.data() + p * dim, dim);
  double s = 0;
  for (int j = 0; j < dim; ++j) s += double{q[j]} * k[j];
  return s;
}

// Every upper node whose exact score beats the k-th answer must have its leaf in the answer, and
// every answer's score is the exact score of one of its leaf's tokens.
void CheckAnswer(const DciTree& tree, const std::vector<float>& keys, int dim, const float* q,
                 const std::vector<ScoredLeaf>& got, int* upper_checked) {
  const PagePool& pool = *tree.pool();
  ASSERT_FALSE(got.empty());
  std::set<int32_t> leaves;
  for (const ScoredLeaf& l : got) {
    leaves.insert(l.leaf);
    double best = -INFINITY;
    for (int64_t p : tree.LeafPositions(l.leaf)) best = std::max(best, ExactScore(keys, pool, dim, p, q));
    EXPECT_NEAR(l.score, best, 1e-4 * (1 + std::fabs(best))) << "leaf " << l.leaf;
  }
  const double kth = got.back().score;
  for (int64_t p = 0; p < tree.size(); ++p) {
    if (tree.Level(p) < 1) continue;
    const double e = ExactScore(keys, pool, dim, p, q);
    if (e <= kth + 1e-4 * (1 + std::fabs(kth))) continue;
    ++*upper_checked;
    EXPECT_TRUE(leaves.count(tree.Locate(p).leaf)) << "upper node " << p << " scores " << e << " > k-th answer " << kth;
  }
}

TEST(DciTreeUpperI8Test, NoUpperNodeAboveTheAnswerIsLeftOut) {
  const int dim = 64, n = 6000, k = 8, nq = 4;
  SyntheticOptions o;
  o.outlier_scale = 12.0;  // coarse int8 steps for the other channels
  const auto data = MakeSyntheticData(n, dim, 24, o);
  auto pool = testing::MakePool(dim, 2000, kernels::DType::kBF16);
  const float* kp = data.keys.data();
  const float* vp = data.values.data();
  auto tree = DciTree::Build(DciParams::Tuned(), pool.get(), 1, TokenBlock{0, n, &kp, &vp, static_cast<size_t>(dim)}).value();
  int checked = 0;
  for (int j = 0; j < data.num_queries; ++j) {
    const float* q = data.queries.data() + static_cast<size_t>(j) * dim;
    std::vector<ScoredLeaf> got;
    tree->Query(q, k, &got);
    CheckAnswer(*tree, data.keys, dim, q, got, &checked);
  }
  for (int grp = 0; grp + nq <= data.num_queries; grp += nq) {
    std::vector<std::vector<ScoredLeaf>> got;
    tree->QueryGroup(data.queries.data() + static_cast<size_t>(grp) * dim, nq, k, &got);
    for (int j = 0; j < nq; ++j)
      CheckAnswer(*tree, data.keys, dim, data.queries.data() + static_cast<size_t>(grp + j) * dim, got[j], &checked);
  }
  EXPECT_GT(checked, 0);  // upper nodes did beat answers: the rule was exercised

  // Insertions promote new level-1 nodes (appended to the int8 rows): the rule still holds.
  const auto more = MakeSyntheticData(n + 3000, dim, 1, o);
  const int64_t l1_before = tree->level_counts()[1];
  for (int off = n; off < n + 3000; off += 250) {
    const float* kp2 = more.keys.data() + static_cast<size_t>(off) * dim;
    const float* vp2 = more.values.data() + static_cast<size_t>(off) * dim;
    ASSERT_TRUE(tree->Insert(TokenBlock{off, 250, &kp2, &vp2, static_cast<size_t>(dim)}).ok());
  }
  EXPECT_GT(tree->level_counts()[1], l1_before);
  checked = 0;
  for (int j = 0; j < data.num_queries; ++j) {
    const float* q = data.queries.data() + static_cast<size_t>(j) * dim;
    std::vector<ScoredLeaf> got;
    tree->Query(q, k, &got);
    CheckAnswer(*tree, more.keys, dim, q, got, &checked);
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace icecache::kvstore
