// DciParams::sticky_margin: a level-0 key joins its predecessor's cell when that cell's node is
// nearly as near as its nearest node, at build and at insertion (one rule: DciTree::StickyParent);
// validation and the wire form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kvstore/dci_tree.h"
#include "kvstore/wire.h"
#include "tests/kvstore/kv_test_util.h"

namespace icecache::kvstore {
namespace {

using testing::KeyRows;
using testing::MakePool;

constexpr int kDim = 32;

// Random keys N(0, 1), with a run [run_first, run_first + run_len) of near-identical keys (center
// c = 3 N(0, 1) with c[0] = 0, noise 0.05 per channel) and two level-1 nodes a, b = c +- 8 e_0:
// a and b have the same norm, each run key is nearly equidistant from them (its squared distances
// differ by 32 |noise_0| of ~128) and far nearer to them than to any other node, so its nearest
// node is a or b by the sign of its noise on channel 0.
KeyRows MakeKeys(int n, int run_first, int run_len, int node_a, int node_b) {
  KeyRows d;
  d.n = n;
  d.dim = kDim;
  d.k.resize(static_cast<size_t>(n) * kDim);
  d.v.resize(d.k.size());
  std::mt19937_64 rng(5);
  std::normal_distribution<float> g;
  for (auto& x : d.k) x = g(rng);
  for (auto& x : d.v) x = g(rng);
  std::vector<float> c(kDim);
  for (auto& x : c) x = 3.f * g(rng);
  c[0] = 0.f;
  for (int i = 0; i < kDim; ++i) {
    d.k[static_cast<size_t>(node_a) * kDim + i] = c[i] + (i == 0 ? 8.f : 0.f);
    d.k[static_cast<size_t>(node_b) * kDim + i] = c[i] - (i == 0 ? 8.f : 0.f);
  }
  for (int t = run_first; t < run_first + run_len; ++t)
    for (int i = 0; i < kDim; ++i) d.k[static_cast<size_t>(t) * kDim + i] = c[i] + 0.05f * g(rng);
  return d;
}

DciParams Sticky(double margin) {
  DciParams p = DciParams::Flat();
  p.sticky_margin = margin;
  p.promote_fraction = 0;  // no inserted token becomes a node (it would found a cell of its own)
  return p;
}

// Which tokens a build of n keys puts on level >= 1 depends only on n and the seed: a probe
// build finds two level-1 nodes and the longest stretch of level-0 tokens after them.
struct Plan {
  int node_a = -1, node_b = -1, run_first = -1, run_len = 0;
};
Plan PlanRun(int n, int min_first) {
  auto pool = MakePool(kDim, 2 * n / 16 + 200);
  KeyRows d = MakeKeys(n, 0, 0, 0, 1);
  auto tree = DciTree::Build(Sticky(0), pool.get(), 1, d.Block(0, n)).value();
  Plan p;
  for (int t = 0; t < n && p.node_b < 0; ++t)
    if (tree->Level(t) == 1) (p.node_a < 0 ? p.node_a : p.node_b) = t;
  int start = std::max(min_first, p.node_b + 1);
  for (int t = start; t <= n; ++t) {
    if (t == n || tree->Level(t) != 0) {
      if (t - start > p.run_len) p.run_first = start, p.run_len = t - start;
      start = t + 1;
    }
  }
  return p;
}

std::map<int32_t, int> RunCells(const DciTree& tree, int first, int len) {
  std::map<int32_t, int> cells;
  for (int t = first; t < first + len; ++t) ++cells[tree.leaf_cell(tree.Locate(t).leaf)];
  return cells;
}

// No preset is sticky: margin 0.1 cost perplexity on real text (docs/kvstore.md, "Tried and not
// served"); the rule is a DciParams option (--sticky-margin in the retrieval bench).
TEST(DciTreeStickyTest, NoPresetIsSticky) {
  EXPECT_EQ(DciParams::Flat().sticky_margin, 0);
  EXPECT_EQ(DciParams::Tuned().sticky_margin, 0);
  EXPECT_EQ(DciParams{}.sticky_margin, 0);
}

TEST(DciTreeStickyTest, BuildKeepsARunOfNearIdenticalKeysInOneCell) {
  const int n = 3000;
  const Plan plan = PlanRun(n, 0);
  ASSERT_GE(plan.run_len, 24) << "no long level-0 stretch in the probe tree";
  const int len = std::min(plan.run_len, 48);
  KeyRows d = MakeKeys(n, plan.run_first, len, plan.node_a, plan.node_b);
  // Both parent searches of a build: the batched exact one, and prioritized DCI (forced here with
  // exact_parent_max_nodes = 0; its 64 candidates cover the 60 level-1 nodes). The batched search
  // on bf16 keys: on the int8 keys of Flat() (6-bit, kI8ParentKeyMax) the run's channel-0 noise
  // (0.05) is below half a step (max |c| / 31), so every run key would tie between a and b and
  // join the lower row: no split for the sticky rule to undo.
  for (int exact_max : {3000, 0}) {
    SCOPED_TRACE("exact_parent_max_nodes " + std::to_string(exact_max));
    DciParams p0 = Sticky(0), p1 = Sticky(0.1);
    p0.exact_parent_max_nodes = p1.exact_parent_max_nodes = exact_max;
    p0.int8_parent_search = p1.int8_parent_search = false;
    auto pool = MakePool(kDim, 4 * n / 16 + 400);
    auto plain = DciTree::Build(p0, pool.get(), 1, d.Block(0, n)).value();
    auto sticky = DciTree::Build(p1, pool.get(), 1, d.Block(0, n)).value();
    ASSERT_TRUE(sticky->CheckInvariants().ok()) << sticky->CheckInvariants().ToString();
    ASSERT_EQ(plain->level_counts(), sticky->level_counts());
    // Nearest-node cells split the run between a's and b's cells ...
    const auto split = RunCells(*plain, plan.run_first, len);
    ASSERT_EQ(split.size(), 2u);
    for (const auto& [cell, count] : split) EXPECT_GE(count, 3) << "cell " << cell;
    // ... the sticky rule keeps it in the cell its first key chose (a's or b's), and in the
    // position layout the run fills consecutive slots: ceil(len / 16) leaves, + 1 for a cell whose
    // last leaf it starts in.
    const auto one = RunCells(*sticky, plan.run_first, len);
    ASSERT_EQ(one.size(), 1u);
    std::map<int32_t, int> leaves;
    for (int t = plan.run_first; t < plan.run_first + len; ++t) ++leaves[sticky->Locate(t).leaf];
    EXPECT_LE(static_cast<int>(leaves.size()), (len + 15) / 16 + 1);
  }
}

TEST(DciTreeStickyTest, InsertionUsesTheSameRule) {
  const int n = 3000, n0 = 1500;
  const Plan plan = PlanRun(n0, 0);  // nodes a, b among the built tokens
  ASSERT_GE(plan.node_b, 0);
  const int first = n0 + 100, len = 40;
  for (double margin : {0.0, 0.1}) {
    KeyRows d = MakeKeys(n, first, len, plan.node_a, plan.node_b);
    auto pool = MakePool(kDim, 4 * n / 16 + 400);
    auto tree = DciTree::Build(Sticky(margin), pool.get(), 1, d.Block(0, n0)).value();
    for (int off = n0; off < n; off += 16) ASSERT_TRUE(tree->Insert(d.Block(off, std::min(16, n - off))).ok());
    ASSERT_TRUE(tree->CheckInvariants().ok()) << tree->CheckInvariants().ToString();
    const auto cells = RunCells(*tree, first, len);
    if (margin == 0) {
      EXPECT_EQ(cells.size(), 2u) << "nearest-node cells split the run";
    } else {
      EXPECT_EQ(cells.size(), 1u) << "the sticky rule keeps the run in one cell";
    }
  }
}

TEST(DciTreeStickyTest, ValidationAndWireForm) {
  DciParams p = DciParams::Flat();
  p.sticky_margin = -0.1;
  Status s = ValidateDciParams(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sticky_margin"), std::string::npos) << s.ToString();
  p.sticky_margin = NAN;
  EXPECT_EQ(ValidateDciParams(p).code(), StatusCode::kInvalidArgument);
  p.sticky_margin = 0.37;
  auto back = testing::ParamsOverTheWire(p);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->sticky_margin, 0.37);
  WireWriter w;
  SerializeDciParams(p, &w);
  // Truncated before the margin's last byte (the leaf_rank fields, 1 + 3 doubles, the
  // cell_spread byte and the two refine int32s follow it): DATA_LOSS naming it.
  WireReader cut(w.buffer().data(), w.buffer().size() - 1 - (1 + 3 * sizeof(double)) - 1 - 2 * sizeof(int32_t));
  DciParams cut_back;
  Status c = DeserializeDciParams(&cut, &cut_back);
  EXPECT_EQ(c.code(), StatusCode::kDataLoss);
  EXPECT_NE(c.message().find("sticky_margin"), std::string::npos) << c.ToString();
}

}  // namespace
}  // namespace icecache::kvstore
