#include "kvstore/dci_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <utility>

#include "kvstore/synthetic_keys.h"
#include "kvstore/vector_ops.h"
#include "tests/kvstore/kv_test_util.h"

namespace icecache::kvstore {
namespace {

using testing::MakePool;

std::vector<float> Gaussian(size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// Every token's K and V in its (page, slot) equal the input (after the pool's rounding).
void ExpectContents(const DciTree& tree, const PagePool& pool, const std::vector<float>& k, const std::vector<float>& v,
                    int64_t first, int dim) {
  std::vector<float> row(dim), want(dim);
  std::vector<uint8_t> tmp(dim * 4);
  for (int64_t pos = tree.first_position(); pos < tree.end_position(); ++pos) {
    const TokenLocation loc = tree.Locate(pos);
    const int32_t page = tree.leaf_page(loc.leaf);
    RowFromF32(pool.dtype(), k.data() + (pos - first) * dim, tmp.data(), dim);
    RowToF32(pool.dtype(), tmp.data(), want.data(), dim);
    RowToF32(pool.dtype(), pool.KRow(page, loc.slot), row.data(), dim);
    ASSERT_EQ(row, want) << "key of position " << pos;
    RowFromF32(pool.dtype(), v.data() + (pos - first) * dim, tmp.data(), dim);
    RowToF32(pool.dtype(), tmp.data(), want.data(), dim);
    RowToF32(pool.dtype(), pool.VRow(page, loc.slot), row.data(), dim);
    ASSERT_EQ(row, want) << "value of position " << pos;
  }
}

TokenBlock Block(const std::vector<float>& k, const std::vector<float>& v, int64_t first, int offset, int count, int dim,
                 const float** kp, const float** vp) {
  *kp = k.data() + static_cast<size_t>(offset) * dim;
  *vp = v.data() + static_cast<size_t>(offset) * dim;
  return TokenBlock{first + offset, count, kp, vp, static_cast<size_t>(dim)};
}

class DciTreeBuildTest : public ::testing::TestWithParam<std::tuple<int, kernels::DType>> {};

TEST_P(DciTreeBuildTest, InvariantsAndContents) {
  const auto [n, dt] = GetParam();
  const int dim = 32;
  auto pool = MakePool(dim, 4000, dt);
  auto k = Gaussian(static_cast<size_t>(n) * dim, 1), v = Gaussian(static_cast<size_t>(n) * dim, 2);
  const float *kp, *vp;
  auto tree = DciTree::Build(DciParams{}, pool.get(), 1, Block(k, v, 100, 0, n, dim, &kp, &vp));
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  ASSERT_TRUE((*tree)->CheckInvariants().ok()) << (*tree)->CheckInvariants().ToString();
  EXPECT_EQ((*tree)->size(), n);
  EXPECT_EQ(pool->used_pages(), (*tree)->num_leaves());
  ExpectContents(**tree, *pool, k, v, 100, dim);
  if (n > 0) {
    int64_t sum = 0;
    for (int64_t c : (*tree)->level_counts()) sum += c;
    EXPECT_EQ(sum, n);
    EXPECT_EQ((*tree)->level_counts()[1], static_cast<int64_t>(std::ceil(n * 0.01)));
  }
  tree->reset();
  EXPECT_EQ(pool->used_pages(), 0);
}

INSTANTIATE_TEST_SUITE_P(Sizes, DciTreeBuildTest,
                         ::testing::Combine(::testing::Values(0, 1, 17, 600, 5000),
                                            ::testing::Values(kernels::DType::kF32, kernels::DType::kBF16)));

TEST(DciTreeTest, LevelSizesFollowP1AndP2) {
  const int n = 36000, dim = 16;
  auto pool = MakePool(dim, 5000);
  auto k = Gaussian(static_cast<size_t>(n) * dim, 3), v = k;
  const float *kp, *vp;
  auto tree = DciTree::Build(DciParams{}, pool.get(), 1, Block(k, v, 0, 0, n, dim, &kp, &vp)).value();
  // docs/design.md: at 36k tokens about [35553, 356, 72, 15, 4]; we draw ceil(n p1), then ceil(p2 x).
  EXPECT_EQ(tree->level_counts(), (std::vector<int64_t>{35550, 360, 72, 15, 3}));
  ASSERT_TRUE(tree->CheckInvariants().ok());
}

TEST(DciTreeTest, InsertKeepsInvariantsThroughSplitsAndRekeys) {
  // Reference parameters (fp32 parent search) and Tuned() (bf16 parent search, also at an odd dim).
  for (const auto& [params, dim] : {std::pair{DciParams{}, 32}, std::pair{DciParams::Tuned(), 32}, std::pair{DciParams::Tuned(), 33}}) {
    SCOPED_TRACE("dim " + std::to_string(dim) + (params.bf16_parent_search ? " bf16" : " fp32"));
    const int n0 = 3000, extra = 2500;
    auto pool = MakePool(dim, 4000, kernels::DType::kBF16);
    auto k = Gaussian(static_cast<size_t>(n0 + extra) * dim, 4), v = Gaussian(static_cast<size_t>(n0 + extra) * dim, 5);
    // Some inserted keys have a new maximum norm: the tree re-keys.
    for (int t : {n0 + 10, n0 + 700, n0 + 2000})
      for (int i = 0; i < dim; ++i) k[static_cast<size_t>(t) * dim + i] *= 3.f + t % 7;
    const float *kp, *vp;
    auto tree = DciTree::Build(params, pool.get(), 1, Block(k, v, 50, 0, n0, dim, &kp, &vp)).value();
    const int32_t leaves_before = tree->num_leaves();
    const float m_before = tree->max_norm2();
    for (int off = n0; off < n0 + extra; off += 16) {
      const int cnt = std::min(16, n0 + extra - off);
      ASSERT_TRUE(tree->Insert(Block(k, v, 50, off, cnt, dim, &kp, &vp)).ok());
    }
    EXPECT_GT(tree->max_norm2(), m_before);
    EXPECT_GT(tree->num_leaves(), leaves_before);  // splits happened
    Status inv = tree->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv.ToString();
    EXPECT_EQ(tree->size(), n0 + extra);
    EXPECT_EQ(pool->used_pages(), tree->num_leaves());
    ExpectContents(*tree, *pool, k, v, 50, dim);
    // Wrong position is rejected.
    EXPECT_EQ(tree->Insert(Block(k, v, 0, 0, 1, dim, &kp, &vp)).code(), StatusCode::kInvalidArgument);
    tree->Release();
    EXPECT_EQ(pool->used_pages(), 0);
  }
}

// Insert's written_pages lists every page whose bytes changed (compared over the whole pool),
// across splits, re-keys (which re-sort cells), both leaf layouts and two payloads (ICE(r) followers), and only
// pages of the tree; the rest of the tree stays byte for byte (what keeps a device copy valid).
TEST(DciTreeTest, InsertReportsEveryPageItChanged) {
  const int dim = 32, n0 = 1500, extra = 1200;
  for (const int variant : {0, 1, 2, 3}) {
    const int payloads = 1 + variant % 2;
    // Projection-ordered leaves (splits, re-sorts) and the serving preset's position leaves.
    const DciParams params = variant < 2 ? DciParams{} : DciParams::Flat();
    SCOPED_TRACE("payloads " + std::to_string(payloads) + (variant < 2 ? ", projection leaves" : ", position leaves"));
    auto pool = MakePool(dim, 4000, kernels::DType::kBF16);
    const size_t total = static_cast<size_t>(n0 + extra) * dim;
    std::vector<std::vector<float>> k, v;
    for (int p = 0; p < payloads; ++p) {
      k.push_back(Gaussian(total, 20 + p));
      v.push_back(Gaussian(total, 30 + p));
    }
    for (int t : {n0 + 100, n0 + 900})  // new maximum norms: re-keys, so cells re-sort
      for (int i = 0; i < dim; ++i) k[0][static_cast<size_t>(t) * dim + i] *= 4.f;
    auto block = [&](int offset, int count, std::vector<const float*>* kp, std::vector<const float*>* vp) {
      kp->clear();
      vp->clear();
      for (int p = 0; p < payloads; ++p) {
        kp->push_back(k[p].data() + static_cast<size_t>(offset) * dim);
        vp->push_back(v[p].data() + static_cast<size_t>(offset) * dim);
      }
      return TokenBlock{offset, count, kp->data(), vp->data(), static_cast<size_t>(dim)};
    };
    std::vector<const float*> kp, vp;
    auto tree = DciTree::Build(params, pool.get(), payloads, block(0, n0, &kp, &vp)).value();
    const size_t page_bytes = pool->page_bytes();
    const auto* base = static_cast<const uint8_t*>(pool->base());
    int64_t reported = 0, changed_total = 0;
    std::vector<int32_t> written;
    for (int off = n0; off < n0 + extra; off += 16) {
      std::vector<uint8_t> before(base, base + pool->capacity_bytes());
      ASSERT_TRUE(tree->Insert(block(off, 16, &kp, &vp), &written).ok());
      ASSERT_TRUE(std::is_sorted(written.begin(), written.end()));
      ASSERT_EQ(std::adjacent_find(written.begin(), written.end()), written.end());
      const std::vector<int32_t> tree_pages = tree->AllPages();
      const std::set<int32_t> in_tree(tree_pages.begin(), tree_pages.end());
      for (int32_t p : written) ASSERT_TRUE(in_tree.count(p)) << "page " << p << " is not the tree's";
      for (int32_t p : tree_pages) {
        const bool changed = std::memcmp(before.data() + p * page_bytes, base + p * page_bytes, page_bytes) != 0;
        if (changed) {
          ++changed_total;
          ASSERT_TRUE(std::binary_search(written.begin(), written.end(), p))
              << "page " << p << " changed at offset " << off << " but was not reported";
        }
      }
      reported += static_cast<int64_t>(written.size());
      // Only tree pages change (no page outside the tree was touched).
      for (int64_t p = 0; p < static_cast<int64_t>(pool->capacity_bytes() / page_bytes); ++p) {
        if (in_tree.count(static_cast<int32_t>(p))) continue;
        ASSERT_EQ(std::memcmp(before.data() + p * page_bytes, base + p * page_bytes, page_bytes), 0) << "page " << p;
      }
    }
    EXPECT_GT(changed_total, 0);
    // The list is far smaller than the tree: a block of 16 tokens writes a few dozen leaves at most.
    EXPECT_LT(reported, static_cast<int64_t>(extra / 16) * tree->num_leaves() * payloads / 4);
    ASSERT_TRUE(tree->CheckInvariants().ok());
    tree->Release();
  }
}

TEST(DciTreeTest, GrowsFromEmptyAndUsesDciParentSearch) {
  const int dim = 24, n = 4000;
  auto pool = MakePool(dim, 2000, kernels::DType::kF16, 8);
  auto k = Gaussian(static_cast<size_t>(n) * dim, 6), v = Gaussian(static_cast<size_t>(n) * dim, 7);
  DciParams p;
  p.exact_parent_max_nodes = 8;  // force prioritized DCI parent search
  p.num_simple = 2;
  p.num_composite = 3;
  p.promote_fraction = 0.02;
  const float *kp, *vp;
  auto tree = DciTree::Build(p, pool.get(), 1, Block(k, v, 0, 0, 0, dim, &kp, &vp)).value();
  for (int t = 0; t < n; ++t) ASSERT_TRUE(tree->Insert(Block(k, v, 0, t, 1, dim, &kp, &vp)).ok());
  Status inv = tree->CheckInvariants();
  ASSERT_TRUE(inv.ok()) << inv.ToString();
  EXPECT_GT(tree->level_counts()[1], 20);
  ExpectContents(*tree, *pool, k, v, 0, dim);
  // And a build with the DCI parent path.
  auto built = DciTree::Build(p, pool.get(), 1, Block(k, v, 0, 0, n, dim, &kp, &vp)).value();
  ASSERT_TRUE(built->CheckInvariants().ok());
}

TEST(DciTreeTest, RunsOutOfPagesCleanly) {
  const int dim = 16, n = 2000;
  auto pool = MakePool(dim, 50);
  auto k = Gaussian(static_cast<size_t>(n) * dim, 8), v = k;
  const float *kp, *vp;
  auto tree = DciTree::Build(DciParams{}, pool.get(), 1, Block(k, v, 0, 0, n, dim, &kp, &vp));
  ASSERT_FALSE(tree.ok());
  EXPECT_EQ(tree.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->used_pages(), 0);
  auto small = DciTree::Build(DciParams{}, pool.get(), 1, Block(k, v, 0, 0, 300, dim, &kp, &vp)).value();
  Status s;
  int off = 300;
  while (s.ok() && off < n) s = small->Insert(Block(k, v, 0, off++, 1, dim, &kp, &vp));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(small->CheckInvariants().ok());  // the failed token was undone
  EXPECT_EQ(small->size(), off - 1);
}

// Naive exact best pages: best token score per leaf from the raw keys.
std::vector<int32_t> NaiveBestLeaves(const DciTree& tree, const std::vector<float>& k, int64_t first, int dim,
                                     const float* q, int kk) {
  std::vector<double> best(tree.num_leaves(), -1e300);
  for (int64_t pos = tree.first_position(); pos < tree.end_position(); ++pos) {
    double s = 0;
    for (int i = 0; i < dim; ++i) s += double(k[(pos - first) * dim + i]) * q[i];
    const int32_t leaf = tree.Locate(pos).leaf;
    best[leaf] = std::max(best[leaf], s);
  }
  std::vector<int32_t> order(tree.num_leaves());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return best[a] > best[b]; });
  order.resize(std::min<size_t>(kk, order.size()));
  return order;
}

TEST(DciTreeTest, OracleEqualsNaive) {
  const int dim = 64, n = 3000;
  auto pool = MakePool(dim, 1000);
  auto data = MakeSyntheticData(n, dim, 20);
  const float *kp, *vp;
  auto tree = DciTree::Build(DciParams{}, pool.get(), 1, Block(data.keys, data.values, 0, 0, n, dim, &kp, &vp)).value();
  std::vector<ScoredLeaf> got;
  for (int j = 0; j < data.num_queries; ++j) {
    const float* q = data.queries.data() + static_cast<size_t>(j) * dim;
    tree->Oracle(q, 12, &got);
    auto want = NaiveBestLeaves(*tree, data.keys, 0, dim, q, 12);
    ASSERT_EQ(got.size(), want.size());
    for (size_t r = 0; r < want.size(); ++r) EXPECT_EQ(got[r].leaf, want[r]) << "query " << j << " rank " << r;
  }
}

TEST(DciTreeTest, QueryWithFullFieldOfViewIsExact) {
  const int dim = 32, n = 2000;
  auto pool = MakePool(dim, 1000);
  auto data = MakeSyntheticData(n, dim, 10);
  DciParams p;
  p.fov_fraction = 1.0;
  p.cell_score_fraction = 1.0;
  const float *kp, *vp;
  auto tree = DciTree::Build(p, pool.get(), 1, Block(data.keys, data.values, 0, 0, n, dim, &kp, &vp)).value();
  std::vector<ScoredLeaf> a, b;
  for (int j = 0; j < data.num_queries; ++j) {
    const float* q = data.queries.data() + static_cast<size_t>(j) * dim;
    tree->Query(q, 10, &a);
    tree->Oracle(q, 10, &b);
    ASSERT_EQ(a.size(), b.size());
    for (size_t r = 0; r < a.size(); ++r) EXPECT_EQ(a[r].leaf, b[r].leaf);
  }
}

TEST(DciTreeTest, ExhaustiveUpperWithFullFieldOfViewIsExact) {
  const int dim = 32, n = 3000;
  auto pool = MakePool(dim, 1000);
  auto data = MakeSyntheticData(n, dim, 10);
  DciParams p = DciParams::Tuned();
  p.fov_fraction = 1.0;
  const float *kp, *vp;
  auto tree = DciTree::Build(p, pool.get(), 1, Block(data.keys, data.values, 0, 0, n, dim, &kp, &vp)).value();
  std::vector<ScoredLeaf> a, b;
  QueryStats st;
  for (int j = 0; j < data.num_queries; ++j) {
    const float* q = data.queries.data() + static_cast<size_t>(j) * dim;
    tree->Query(q, 10, &a, &st);
    tree->Oracle(q, 10, &b);
    EXPECT_EQ(st.tokens_scored, n);  // every token once: upper nodes from the fp32 copy, the rest from pages
    ASSERT_EQ(a.size(), b.size());
    for (size_t r = 0; r < a.size(); ++r) EXPECT_EQ(a[r].leaf, b[r].leaf);
  }
}

TEST(DciTreeTest, QueryGroupSharesOneTraversal) {
  const int dim = 64, n = 6000, nq = 4;
  auto pool = MakePool(dim, 2000, kernels::DType::kBF16);
  auto data = MakeSyntheticData(n, dim, 3 * nq);
  const float *kp, *vp;
  for (double fov_fraction : {1e-3, 1.0}) {
    DciParams p = DciParams::Tuned();
    p.fov_fraction = fov_fraction;
    auto tree = DciTree::Build(p, pool.get(), 1, Block(data.keys, data.values, 0, 0, n, dim, &kp, &vp)).value();
    for (int grp = 0; grp < 3; ++grp) {
      const float* qs = data.queries.data() + static_cast<size_t>(grp) * nq * dim;
      std::vector<std::vector<ScoredLeaf>> group;
      tree->QueryGroup(qs, nq, 12, &group);
      ASSERT_EQ(group.size(), static_cast<size_t>(nq));
      for (int j = 0; j < nq; ++j) {
        std::vector<ScoredLeaf> alone, exact;
        tree->Query(qs + j * dim, 12, &alone);
        tree->Oracle(qs + j * dim, 12, &exact);
        ASSERT_EQ(group[j].size(), alone.size());
        // The group scores a superset of what each head scores alone: rank by rank, its scores
        // are at least as high; with a full field of view both are exact.
        for (size_t r = 0; r < alone.size(); ++r) EXPECT_GE(group[j][r].score, alone[r].score);
        if (fov_fraction == 1.0) {
          for (size_t r = 0; r < exact.size(); ++r) EXPECT_EQ(group[j][r].leaf, exact[r].leaf);
        }
      }
    }
  }
}

TEST(DciTreeTest, FieldOfViewCountsOnlyNodesWithChildren) {
  // Repeated content: bit-identical keys make many level-1 nodes tie; the one with the lowest
  // index collects every copy's children, the others own no cell. The field of view must still
  // expand fov non-empty cells (childless nodes tying at the top used to use up its slots), and
  // a needle hidden in repeated filler must be found.
  const int dim = 32, n = 4000, types = 10, fov = 8;
  auto pool = MakePool(dim, 2000);
  std::vector<float> keys = Gaussian(static_cast<size_t>(n) * dim, 21), values = Gaussian(static_cast<size_t>(n) * dim, 22);
  const std::vector<float> type_keys = Gaussian(static_cast<size_t>(types) * dim, 23);
  std::mt19937_64 rng(24);
  for (int t = 0; t < n; t += 2) {  // every other token is a copy of one of `types` keys
    const int ty = static_cast<int>(rng() % types);
    std::copy_n(type_keys.data() + static_cast<size_t>(ty) * dim, dim, keys.data() + static_cast<size_t>(t) * dim);
  }
  const int needle = 2001;
  for (int j = 0; j < dim; ++j) keys[static_cast<size_t>(needle) * dim + j] = 0.3f * type_keys[j] + ((j % 2) ? 2.f : -2.f);
  DciParams p = DciParams::Tuned();
  p.fov_min = fov;
  p.fov_fraction = 0;
  const float *kp, *vp;
  auto tree = DciTree::Build(p, pool.get(), 1, Block(keys, values, 0, 0, n, dim, &kp, &vp)).value();
  ASSERT_TRUE(tree->CheckInvariants().ok());
  std::vector<ScoredLeaf> got;
  QueryStats st;
  for (int ty = 0; ty < types; ++ty) {  // queries whose best level-1 nodes are the tied copies of a type
    tree->Query(type_keys.data() + static_cast<size_t>(ty) * dim, 12, &got, &st);
    EXPECT_EQ(st.cells_expanded, fov) << "type " << ty;
  }
  std::vector<float> q(keys.begin() + static_cast<size_t>(needle) * dim, keys.begin() + static_cast<size_t>(needle + 1) * dim);
  for (float& x : q) x *= 3.f;
  tree->Query(q.data(), 12, &got);
  const int32_t needle_leaf = tree->Locate(needle).leaf;
  EXPECT_TRUE(std::any_of(got.begin(), got.end(), [&](const ScoredLeaf& l) { return l.leaf == needle_leaf; }));
}

TEST(DciTreeTest, DefaultQueryReturnsDistinctRankedLeaves) {
  const int dim = 64, n = 8000;
  auto pool = MakePool(dim, 2000, kernels::DType::kBF16);
  auto data = MakeSyntheticData(n, dim, 30);
  const float *kp, *vp;
  auto tree = DciTree::Build(DciParams{}, pool.get(), 1, Block(data.keys, data.values, 0, 0, n, dim, &kp, &vp)).value();
  std::vector<ScoredLeaf> a;
  for (int j = 0; j < data.num_queries; ++j) {
    tree->Query(data.queries.data() + static_cast<size_t>(j) * dim, 12, &a);
    ASSERT_EQ(a.size(), 12u);
    std::set<int32_t> distinct;
    for (size_t r = 0; r < a.size(); ++r) {
      distinct.insert(a[r].leaf);
      if (r > 0) {
        EXPECT_GE(a[r - 1].score, a[r].score);
      }
    }
    EXPECT_EQ(distinct.size(), a.size());
  }
}

TEST(DciTreeTest, SerializeRoundTrip) {
  const int dim = 32, n = 2500;
  auto pool = MakePool(dim, 1000, kernels::DType::kBF16);
  auto data = MakeSyntheticData(n + 200, dim, 8);
  const float *kp, *vp;
  auto tree = DciTree::Build(DciParams{}, pool.get(), 1, Block(data.keys, data.values, 0, 0, n, dim, &kp, &vp)).value();
  ASSERT_TRUE(tree->Insert(Block(data.keys, data.values, 0, n, 200, dim, &kp, &vp)).ok());
  WireWriter w;
  tree->Serialize(&w);
  auto dst = MakePool(dim, 1000, kernels::DType::kBF16);
  std::vector<int32_t> pages;
  ASSERT_TRUE(dst->AllocateMany(tree->AllPages().size(), &pages).ok());
  for (size_t i = 0; i < pages.size(); ++i)
    std::memcpy(dst->PageK(pages[i]), pool->PageK(tree->AllPages()[i]), pool->page_bytes());
  WireReader r(w.buffer().data(), w.buffer().size());
  size_t used = 0;
  auto copy = DciTree::Deserialize(&r, dst.get(), pages.data(), pages.size(), &used);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_TRUE(r.done());
  EXPECT_EQ(used, pages.size());
  WireWriter w2;
  (*copy)->Serialize(&w2);
  EXPECT_EQ(w.buffer(), w2.buffer());
  std::vector<ScoredLeaf> a, b;
  for (int j = 0; j < data.num_queries; ++j) {
    const float* q = data.queries.data() + static_cast<size_t>(j) * dim;
    tree->Query(q, 12, &a);
    (*copy)->Query(q, 12, &b);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].leaf, b[i].leaf);
      EXPECT_EQ(a[i].score, b[i].score);
    }
  }
}

}  // namespace
}  // namespace icecache::kvstore
