// Leaf ranking (DciParams::leaf_rank): the leaves of a wider set of level-1 cells ranked by
// per-leaf summaries, only the best scored exactly. What the rule promises: with an unbounded
// leaf budget it is whole-cell scoring of the wider set; it finds best leaves that lie in cells
// beyond the field of view; the summaries follow insertions and travel with the pages; its
// parameters are validated and carried on the wire.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "kvstore/dci_tree.h"
#include "kvstore/synthetic_keys.h"
#include "tests/kvstore/kv_test_util.h"

namespace icecache::kvstore {
namespace {

using testing::MakePool;

TokenBlock Block(const SyntheticData& d, int offset, int count, const float** kp, const float** vp) {
  *kp = d.keys.data() + static_cast<size_t>(offset) * d.dim;
  *vp = d.values.data() + static_cast<size_t>(offset) * d.dim;
  return TokenBlock{offset, count, kp, vp, static_cast<size_t>(d.dim)};
}

// Flat() as it serves: no leaf ranking, every leaf of the fov cells scored (the reference rule).
DciParams FlatCells() {
  DciParams p = DciParams::Flat();
  EXPECT_EQ(p.leaf_rank, LeafRank::kOff);
  return p;
}

// Flat() with the leaf ranking measured in docs/kvstore.md, "Tried and not served" (an option).
DciParams FlatRanked() {
  DciParams p = DciParams::Flat();
  p.leaf_rank = LeafRank::kCentroid;
  p.leaf_rank_cells = 1.5;
  p.leaf_rank_leaves = 3;
  return p;
}

DciParams FixedFov(DciParams p, int fov) {
  p.fov_min = fov;
  p.fov_fraction = 0;
  p.fov_sqrt = 0;
  return p;
}

void ExpectSameLists(const std::vector<ScoredLeaf>& a, const std::vector<ScoredLeaf>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].leaf, b[i].leaf) << what << " rank " << i;
    EXPECT_EQ(a[i].score, b[i].score) << what << " rank " << i;
  }
}

SyntheticData Scattered(int n, int dim, int nq, uint64_t seed) {
  SyntheticOptions o = SyntheticFamily("scattered").value();
  o.seed = seed;
  return MakeSyntheticData(n, dim, nq, o);
}

TEST(DciTreeLeafRankTest, UnboundedBudgetIsWholeCellScoringOfTheWiderSet) {
  // leaf_rank_cells 3 at fov 10 ranks the leaves of 30 cells; a budget above their leaf count
  // scores all of them: the answer (leaves and exact scores), for one head and for a GQA group,
  // is the reference rule's at fov 30.
  const int dim = 64, n = 8192, nq = 4, k = 12, fov = 10;
  auto pool = MakePool(dim, 2000, kernels::DType::kBF16);
  auto data = Scattered(n, dim, 3 * nq, 5);
  const float *kp, *vp;
  DciParams ranked = FixedFov(DciParams::Flat(), fov);
  ranked.leaf_rank = LeafRank::kCentroid;
  ranked.leaf_rank_cells = 3;
  ranked.leaf_rank_leaves = 1000;
  const DciParams wide = FixedFov(FlatCells(), 3 * fov);
  auto a = DciTree::Build(ranked, pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
  auto b = DciTree::Build(wide, pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
  for (int i = 0; i < 3 * nq; ++i) {
    const float* q = data.queries.data() + static_cast<size_t>(i) * dim;
    std::vector<ScoredLeaf> x, y;
    QueryStats sx, sy;
    a->Query(q, k, &x, &sx);
    b->Query(q, k, &y, &sy);
    ExpectSameLists(x, y, "query " + std::to_string(i));
    EXPECT_EQ(sx.cells_expanded, 3 * fov);
    EXPECT_EQ(sx.leaves_scored, sy.leaves_scored);
    EXPECT_EQ(sx.leaves_ranked, sx.leaves_scored);
  }
  for (int grp = 0; grp < 3; ++grp) {
    const float* qs = data.queries.data() + static_cast<size_t>(grp) * nq * dim;
    std::vector<std::vector<ScoredLeaf>> x, y;
    a->QueryGroup(qs, nq, k, &x);
    b->QueryGroup(qs, nq, k, &y);
    for (int j = 0; j < nq; ++j) ExpectSameLists(x[j], y[j], "group " + std::to_string(grp) + " head " + std::to_string(j));
  }
}

TEST(DciTreeLeafRankTest, FindsBestLeavesInCellsBeyondTheFieldOfView) {
  // Queries whose oracle-best leaf the reference rule (fov cells, every leaf scored) misses: the
  // best leaf lies in a cell ranked beyond fov. Leaf ranking over 2 fov cells with a budget of
  // 3 fov leaves (about as many leaves as the fov cells hold) finds a share of them, and keeps more
  // of the oracle's best leaves overall, for single queries and GQA groups.
  const int dim = 64, n = 16384, nq = 4, groups = 25, k = 12;
  auto pool = MakePool(dim, 4000, kernels::DType::kBF16);
  auto data = Scattered(n, dim, nq * groups, 11);
  const float *kp, *vp;
  const DciParams plain = FlatCells();
  DciParams ranked = FlatRanked();
  ranked.leaf_rank_cells = 2;  // 1.5 fov cells: 3 of 19 found, 0.707 -> 0.728 kept
  ASSERT_EQ(ranked.leaf_rank, LeafRank::kCentroid);
  auto a = DciTree::Build(plain, pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
  auto b = DciTree::Build(ranked, pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
  ASSERT_EQ(a->num_leaves(), b->num_leaves());  // the same tree: leaf_rank does not shape it
  for (int64_t t = 0; t < n; ++t) ASSERT_EQ(a->Locate(t).leaf, b->Locate(t).leaf);
  int missed = 0, found = 0;
  double hits_plain = 0, hits_ranked = 0, leaves_plain = 0, leaves_ranked = 0;
  for (int i = 0; i < nq * groups; ++i) {
    const float* q = data.queries.data() + static_cast<size_t>(i) * dim;
    std::vector<ScoredLeaf> best, x, y;
    QueryStats sx, sy;
    a->Oracle(q, k, &best);
    a->Query(q, k, &x, &sx);
    b->Query(q, k, &y, &sy);
    leaves_plain += static_cast<double>(sx.leaves_scored);
    leaves_ranked += static_cast<double>(sy.leaves_scored);
    EXPECT_LE(sy.leaves_scored, static_cast<int64_t>(std::ceil(3.0 * b->FieldOfView())));
    std::set<int32_t> in_x, in_y;
    for (const ScoredLeaf& l : x) in_x.insert(l.leaf);
    for (const ScoredLeaf& l : y) in_y.insert(l.leaf);
    for (const ScoredLeaf& l : best) {
      hits_plain += in_x.count(l.leaf);
      hits_ranked += in_y.count(l.leaf);
    }
    if (!in_x.count(best[0].leaf)) {
      ++missed;
      found += in_y.count(best[0].leaf) ? 1 : 0;
    }
  }
  std::printf("best leaf missed by the reference rule in %d of %d queries, found by leaf ranking in %d; "
              "oracle leaves kept %.3f -> %.3f; leaves scored %.1f -> %.1f\n",
              missed, nq * groups, found, hits_plain / (k * nq * groups), hits_ranked / (k * nq * groups),
              leaves_plain / (nq * groups), leaves_ranked / (nq * groups));
  ASSERT_GE(missed, 5);  // the data must exercise the case
  EXPECT_GE(found, std::max(2, missed / 4));  // measured: 6 of 19 (seed 11)
  EXPECT_GE(hits_ranked, hits_plain + 0.02 * k * nq * groups);
  EXPECT_LE(leaves_ranked, 1.1 * leaves_plain);
  // GQA groups use the same rule: more of each head's oracle leaves than the reference rule.
  double g_plain = 0, g_ranked = 0;
  for (int grp = 0; grp < groups; ++grp) {
    const float* qs = data.queries.data() + static_cast<size_t>(grp) * nq * dim;
    std::vector<std::vector<ScoredLeaf>> x, y;
    a->QueryGroup(qs, nq, k, &x);
    b->QueryGroup(qs, nq, k, &y);
    for (int j = 0; j < nq; ++j) {
      std::vector<ScoredLeaf> best;
      a->Oracle(qs + static_cast<size_t>(j) * dim, k, &best);
      std::set<int32_t> in_x, in_y;
      for (const ScoredLeaf& l : x[j]) in_x.insert(l.leaf);
      for (const ScoredLeaf& l : y[j]) in_y.insert(l.leaf);
      for (const ScoredLeaf& l : best) {
        g_plain += in_x.count(l.leaf);
        g_ranked += in_y.count(l.leaf);
      }
    }
  }
  std::printf("groups: oracle leaves kept %.3f -> %.3f\n", g_plain / (k * nq * groups), g_ranked / (k * nq * groups));
  EXPECT_GE(g_ranked, g_plain + 0.01 * k * nq * groups);
}

TEST(DciTreeLeafRankTest, AnswersAreExactOverTheScoredLeaves) {
  // Every listed leaf carries its exact best token score (the query stays exact over what it scores).
  const int dim = 64, n = 6000, k = 12;
  auto pool = MakePool(dim, 2000, kernels::DType::kBF16);
  auto data = Scattered(n, dim, 8, 3);
  const float *kp, *vp;
  for (LeafRank r : {LeafRank::kCentroid, LeafRank::kBox}) {
    DciParams p = DciParams::Flat();
    p.leaf_rank = r;
    auto tree = DciTree::Build(p, pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
    for (int i = 0; i < 8; ++i) {
      const float* q = data.queries.data() + static_cast<size_t>(i) * dim;
      std::vector<ScoredLeaf> got;
      tree->Query(q, k, &got);
      ASSERT_EQ(static_cast<int>(got.size()), k);
      for (const ScoredLeaf& l : got) {
        float best = -INFINITY;
        for (int64_t pos : tree->LeafPositions(l.leaf)) {
          const auto key = testing::Rounded(*pool, data.keys.data() + static_cast<size_t>(pos) * dim, dim);
          float s = 0;
          ScoreRows(kernels::DType::kF32, key.data(), 1, dim, q, &s);
          best = std::max(best, s);
        }
        EXPECT_NEAR(l.score, best, 1e-4f * (1 + std::fabs(best))) << "leaf rank " << static_cast<int>(r);
      }
    }
  }
}

TEST(DciTreeLeafRankTest, SummariesFollowInsertionsAndTravelWithThePages) {
  // A tree grown by insertions (new leaves, and in the projection layout leaves that split and
  // re-sort) and its wire copy, whose summaries are recomputed from the shipped pages, give
  // bit-equal answers under a small leaf budget (which any stale summary would change).
  const int dim = 64, n0 = 3000, added = 2000, nq = 4, k = 12;
  for (LeafLayout layout : {LeafLayout::kPosition, LeafLayout::kProjection}) {
    auto pool = MakePool(dim, 3000, kernels::DType::kBF16);
    auto data = Scattered(n0 + added, dim, 3 * nq, 7);
    const float *kp, *vp;
    DciParams p = layout == LeafLayout::kPosition ? DciParams::Flat() : DciParams::Tuned();
    p.centroid_cells = true;
    p.centroid_bonus = 1;
    p.promote_fraction = 0.05;
    p.fov_min = 8;
    p.leaf_rank = LeafRank::kCentroid;
    p.leaf_rank_cells = 3;
    p.leaf_rank_leaves = 1.5;
    auto tree = DciTree::Build(p, pool.get(), 1, Block(data, 0, n0, &kp, &vp)).value();
    std::vector<std::vector<ScoredLeaf>> a, b;
    for (int off = n0; off < n0 + added; off += 16) {
      std::vector<int32_t> written;
      ASSERT_TRUE(tree->Insert(Block(data, off, 16, &kp, &vp), off % 64 == 0 ? &written : nullptr).ok());
      if (off % 512 == 0) tree->QueryGroup(data.queries.data(), nq, k, &a);
    }
    ASSERT_TRUE(tree->CheckInvariants().ok());
    auto dst = MakePool(dim, 3000, kernels::DType::kBF16);
    auto copy = testing::ShipTree(*tree, dst.get());
    ASSERT_TRUE(copy.ok()) << copy.status().ToString();
    EXPECT_EQ((*copy)->params().leaf_rank, LeafRank::kCentroid);
    EXPECT_EQ((*copy)->params().leaf_rank_leaves, 1.5);
    const std::string what = layout == LeafLayout::kPosition ? "position" : "projection";
    for (int grp = 0; grp < 3; ++grp) {
      const float* qs = data.queries.data() + static_cast<size_t>(grp) * nq * dim;
      tree->QueryGroup(qs, nq, k, &a);
      (*copy)->QueryGroup(qs, nq, k, &b);
      for (int j = 0; j < nq; ++j) ExpectSameLists(a[j], b[j], what + " group head");
      std::vector<ScoredLeaf> x, y;
      tree->Query(qs, k, &x);
      (*copy)->Query(qs, k, &y);
      ExpectSameLists(x, y, what + " query");
    }
  }
}

TEST(DciTreeLeafRankTest, ParamsAreValidatedAndCarriedOnTheWire) {
  DciParams p = DciParams::Flat();
  p.leaf_rank = LeafRank::kBox;
  p.leaf_rank_cells = 2.5;
  p.leaf_rank_leaves = 3.25;
  p.leaf_bonus = 0.75;
  ASSERT_TRUE(ValidateDciParams(p).ok());
  auto carried = testing::ParamsOverTheWire(p);
  ASSERT_TRUE(carried.ok()) << carried.status().ToString();
  EXPECT_EQ(carried->leaf_rank, LeafRank::kBox);
  EXPECT_EQ(carried->leaf_rank_cells, 2.5);
  EXPECT_EQ(carried->leaf_rank_leaves, 3.25);
  EXPECT_EQ(carried->leaf_bonus, 0.75);
  WireWriter w;
  SerializeDciParams(p, &w);
  DciParams back;
  // An unknown leaf_rank byte (before the three doubles, the cell_spread byte and the two refine
  // int32s, last) is DATA_LOSS naming it.
  std::vector<uint8_t> bad = w.buffer();
  bad[bad.size() - 1 - 3 * sizeof(double) - 1 - 2 * sizeof(int32_t)] = 9;
  WireReader br(bad.data(), bad.size());
  Status s = DeserializeDciParams(&br, &back);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("leaf_rank"), std::string::npos) << s.ToString();
  // Bad values: INVALID_ARGUMENT naming the field.
  auto refused = [](DciParams q, const char* field) {
    Status st = ValidateDciParams(q);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(st.message().find(field), std::string::npos) << st.ToString();
  };
  DciParams q = p;
  q.leaf_rank_cells = 0;
  refused(q, "leaf_rank_cells");
  q = p;
  q.leaf_rank_leaves = NAN;
  refused(q, "leaf_rank_leaves");
  q = p;
  q.leaf_bonus = -1;
  refused(q, "leaf_bonus");
  q = p;
  q.leaf_rank = static_cast<LeafRank>(3);
  refused(q, "leaf_rank");
  q = DciParams{};  // greedy descent, partial cells: leaf ranking does not apply
  q.leaf_rank = LeafRank::kCentroid;
  refused(q, "exhaustive_upper");
  // Build refuses them too.
  auto pool = MakePool(16, 100);
  const float* none = nullptr;
  EXPECT_EQ(DciTree::Build(q, pool.get(), 1, TokenBlock{0, 0, &none, &none, 16}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace icecache::kvstore
