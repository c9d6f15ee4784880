// The flat-cost query options of DciTree (DciParams::fov_sqrt, group_fov, centroid_cells,
// centroid_bonus; the Flat() preset): field of view, the group cap, cell ranking by children's mean
// key and spread, its upkeep through insertions and the wire form, against the exact oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvstore/dci_tree.h"
#include "kvstore/sequence_cache.h"
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

// Share of the oracle's best k leaves (per head) that the group's list of that head holds.
double PageRecall(const DciTree& tree, const float* qs, int nq, int k, const std::vector<std::vector<ScoredLeaf>>& got) {
  double sum = 0;
  for (int j = 0; j < nq; ++j) {
    std::vector<ScoredLeaf> exact;
    tree.Oracle(qs + static_cast<size_t>(j) * tree.pool()->head_dim(), k, &exact);
    std::set<int32_t> mine;
    for (const ScoredLeaf& l : got[j]) mine.insert(l.leaf);
    int hit = 0;
    for (const ScoredLeaf& l : exact) hit += mine.count(l.leaf) ? 1 : 0;
    sum += exact.empty() ? 1.0 : static_cast<double>(hit) / exact.size();
  }
  return sum / nq;
}

TEST(DciTreeFlatTest, FieldOfViewFormula) {
  const int dim = 32, n = 10000;
  auto pool = MakePool(dim, 4000);
  auto data = MakeSyntheticData(n, dim, 1);
  const float *kp, *vp;
  struct Case {
    int fov_min;
    double fraction, sqrt_coeff;
    int64_t want;
  };
  // sqrt(10000) = 100.
  for (const Case& c : {Case{4, 0, 0.5, 50}, Case{4, 1e-2, 0.5, 100}, Case{64, 0, 0.5, 64}, Case{4, 0, 0.123, 13},
                        Case{32, 1e-3, 0, 32}}) {
    DciParams p = DciParams::Tuned();
    p.fov_min = c.fov_min;
    p.fov_fraction = c.fraction;
    p.fov_sqrt = c.sqrt_coeff;
    auto tree = DciTree::Build(p, pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
    EXPECT_EQ(tree->FieldOfView(), c.want) << c.fov_min << " " << c.fraction << " " << c.sqrt_coeff;
  }
  // Flat(): max(32, ceil(0.182 sqrt(n))): 32 up to ~31k tokens, then sqrt growth.
  auto tree = DciTree::Build(DciParams::Flat(), pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
  EXPECT_EQ(tree->FieldOfView(), 32);
}

TEST(DciTreeFlatTest, GroupPathWithFullFieldOfViewReturnsTheOraclesPages) {
  // A field of view and a cap that cover every level-1 cell: every cell is scored, so each head's
  // list must be the oracle's, leaf for leaf, whichever cell ranking is used.
  const int dim = 64, n = 6000, nq = 4, k = 12;
  auto pool = MakePool(dim, 3000, kernels::DType::kBF16);
  auto data = MakeSyntheticData(n, dim, 2 * nq);
  const float *kp, *vp;
  for (bool centroid : {false, true}) {
    DciParams p = DciParams::Flat();
    p.centroid_cells = centroid;
    p.fov_min = n;  // more than there are level-1 nodes
    p.group_fov = 1;
    auto tree = DciTree::Build(p, pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
    for (int grp = 0; grp < 2; ++grp) {
      const float* qs = data.queries.data() + static_cast<size_t>(grp) * nq * dim;
      std::vector<std::vector<ScoredLeaf>> got;
      QueryStats st;
      tree->QueryGroup(qs, nq, k, &got, &st);
      ASSERT_EQ(got.size(), static_cast<size_t>(nq));
      for (int j = 0; j < nq; ++j) {
        std::vector<ScoredLeaf> exact;
        tree->Oracle(qs + static_cast<size_t>(j) * dim, k, &exact);
        ASSERT_EQ(got[j].size(), exact.size()) << "centroid " << centroid << " head " << j;
        for (size_t r = 0; r < exact.size(); ++r) {
          EXPECT_EQ(got[j][r].leaf, exact[r].leaf) << "centroid " << centroid << " head " << j << " rank " << r;
          EXPECT_EQ(got[j][r].score, exact[r].score);  // same rows, same kernel: bit-equal
        }
      }
    }
  }
}

TEST(DciTreeFlatTest, GroupCapBoundsTheExpandedCells) {
  const int dim = 64, n = 20000, nq = 4, k = 12, fov = 10;
  auto pool = MakePool(dim, 6000, kernels::DType::kBF16);
  auto data = MakeSyntheticData(n, dim, 4 * nq);
  const float *kp, *vp;
  DciParams p = DciParams::Tuned();
  p.fov_min = fov;
  p.fov_fraction = 0;
  std::vector<std::vector<ScoredLeaf>> got;
  QueryStats st;
  for (double g : {0.0, 0.5, 1.0, 2.0}) {
    p.group_fov = g;
    auto tree = DciTree::Build(p, pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
    const int64_t cap = g > 0 ? static_cast<int64_t>(std::ceil(g * fov)) : int64_t{nq} * fov;
    int64_t most = 0;
    for (int grp = 0; grp < 4; ++grp) {
      tree->QueryGroup(data.queries.data() + static_cast<size_t>(grp) * nq * dim, nq, k, &got, &st);
      EXPECT_LE(st.cells_expanded, cap) << "group_fov " << g;
      EXPECT_GE(st.cells_expanded, std::min<int64_t>(cap, fov)) << "group_fov " << g;  // at least one head's fov
      most = std::max(most, st.cells_expanded);
    }
    // The synthetic heads ask about different topics: their own choices overlap little, so the
    // cap (not the union) is what binds.
    EXPECT_EQ(most, cap) << "group_fov " << g;
    // Identical heads choose identical cells: the union is one head's fov, under any cap >= fov.
    std::vector<float> same(static_cast<size_t>(nq) * dim);
    for (int j = 0; j < nq; ++j) std::copy_n(data.queries.data(), dim, same.data() + static_cast<size_t>(j) * dim);
    tree->QueryGroup(same.data(), nq, k, &got, &st);
    EXPECT_EQ(st.cells_expanded, std::min<int64_t>(cap, fov)) << "group_fov " << g;
    for (int j = 1; j < nq; ++j) {
      ASSERT_EQ(got[j].size(), got[0].size());
      for (size_t r = 0; r < got[0].size(); ++r) EXPECT_EQ(got[j][r].leaf, got[0][r].leaf);
    }
  }
}

TEST(DciTreeFlatTest, CentroidRankingFindsTheOraclesPagesWithFewerCells) {
  // Structured synthetic keys (topics, RoPE, outliers), GQA-4 groups of independent queries,
  // bf16 pages: page recall against the exact oracle of the same k. Measured at this size (33
  // cells per group): owner ranking 0.920, centroid ranking 0.965, centroid + bonus (Flat()) 0.962;
  // Tuned() (no cap: 124 cells) 0.983. The bounds leave ~0.02-0.03 of room.
  const int dim = 128, n = 32768, nq = 4, k = 12, groups = 12;
  auto pool = MakePool(dim, 2 * n / 16 + 256, kernels::DType::kBF16);
  auto data = MakeSyntheticData(n, dim, groups * nq);
  const float *kp, *vp;
  auto recall_of = [&](const DciParams& p, double* cells) {
    auto tree = DciTree::Build(p, pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
    double recall = 0;
    *cells = 0;
    std::vector<std::vector<ScoredLeaf>> got;
    QueryStats st;
    for (int grp = 0; grp < groups; ++grp) {
      const float* qs = data.queries.data() + static_cast<size_t>(grp) * nq * dim;
      tree->QueryGroup(qs, nq, k, &got, &st);
      recall += PageRecall(*tree, qs, nq, k, got);
      *cells += static_cast<double>(st.cells_expanded);
    }
    *cells /= groups;
    return recall / groups;
  };
  // The cell ranking alone (every leaf of the fov cells scored).
  DciParams owner = DciParams::Flat();
  owner.centroid_cells = false;
  owner.centroid_bonus = 0;
  DciParams centroid = DciParams::Flat();
  centroid.centroid_bonus = 0;
  double c_owner = 0, c_centroid = 0, c_flat = 0, c_tuned = 0;
  const double r_owner = recall_of(owner, &c_owner);
  const double r_centroid = recall_of(centroid, &c_centroid);
  const double r_flat = recall_of(DciParams::Flat(), &c_flat);
  const double r_tuned = recall_of(DciParams::Tuned(), &c_tuned);
  std::printf("page recall (cells per group): owner %.3f (%.0f), centroid %.3f (%.0f), flat %.3f (%.0f), tuned %.3f (%.0f)\n",
              r_owner, c_owner, r_centroid, c_centroid, r_flat, c_flat, r_tuned, c_tuned);
  EXPECT_GE(r_centroid, r_owner + 0.025);  // the ranking is what changed: same cap, same cells
  EXPECT_GE(r_flat, 0.94);
  EXPECT_GE(r_flat, r_tuned - 0.04);       // at about a quarter of Tuned()'s cells
  EXPECT_LE(c_flat, 0.3 * c_tuned);
}

TEST(DciTreeFlatTest, SummariesFollowInsertionsExactly) {
  // Summaries are folded in token order: a tree grown by insertions (caught up by queries between
  // some blocks, not after the last ones) and its wire copy (shipped sums, rows recomputed, the
  // rest folded from the shipped pages) rank cells identically, so their answers are bit-equal.
  // New level-1 nodes appear (promote_fraction).
  const int dim = 64, n0 = 3000, added = 1600, nq = 4, k = 12;
  auto pool = MakePool(dim, 3000, kernels::DType::kBF16);
  auto data = MakeSyntheticData(n0 + added, dim, 3 * nq);
  const float *kp, *vp;
  DciParams p = DciParams::Flat();
  p.promote_fraction = 0.05;
  p.fov_min = 8;
  auto tree = DciTree::Build(p, pool.get(), 1, Block(data, 0, n0, &kp, &vp)).value();
  std::vector<std::vector<ScoredLeaf>> a, b;
  const int64_t level1_before = tree->level_counts()[1];
  for (int off = n0; off < n0 + added; off += 16) {
    ASSERT_TRUE(tree->Insert(Block(data, off, 16, &kp, &vp)).ok());
    if (off % 256 == 0 && off < n0 + added - 300) tree->QueryGroup(data.queries.data(), nq, k, &a);  // catch up part of the way
  }
  ASSERT_TRUE(tree->CheckInvariants().ok());
  EXPECT_GT(tree->level_counts()[1], level1_before);
  auto dst = MakePool(dim, 3000, kernels::DType::kBF16);
  auto copy = testing::ShipTree(*tree, dst.get());
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  for (int grp = 0; grp < 3; ++grp) {
    const float* qs = data.queries.data() + static_cast<size_t>(grp) * nq * dim;
    QueryStats sa, sb;
    tree->QueryGroup(qs, nq, k, &a, &sa);
    (*copy)->QueryGroup(qs, nq, k, &b, &sb);
    EXPECT_EQ(sa.cells_expanded, sb.cells_expanded);
    for (int j = 0; j < nq; ++j) {
      ASSERT_EQ(a[j].size(), b[j].size());
      for (size_t i = 0; i < a[j].size(); ++i) {
        EXPECT_EQ(a[j][i].leaf, b[j][i].leaf);
        EXPECT_EQ(a[j][i].score, b[j][i].score);
      }
    }
    // One head alone (Query) ranks cells the same way.
    std::vector<ScoredLeaf> x, y;
    tree->Query(qs, k, &x);
    (*copy)->Query(qs, k, &y);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i].leaf, y[i].leaf);
  }
}

TEST(DciTreeFlatTest, ConcurrentQueriesAfterAnInsertAgree) {
  // The first queries after an insertion catch the summaries up (under the tree's mutex) while
  // other queries run: every thread must see the same, current ranking as a sequential query.
  const int dim = 64, n0 = 4000, nq = 4, k = 12, threads = 4;
  auto pool = MakePool(dim, 3000, kernels::DType::kBF16);
  auto data = MakeSyntheticData(n0 + 512, dim, nq);
  const float *kp, *vp;
  DciParams p = DciParams::Flat();
  p.promote_fraction = 0.05;
  auto tree = DciTree::Build(p, pool.get(), 1, Block(data, 0, n0, &kp, &vp)).value();
  for (int round = 0; round < 4; ++round) {
    ASSERT_TRUE(tree->Insert(Block(data, n0 + round * 128, 128, &kp, &vp)).ok());
    std::vector<std::vector<std::vector<ScoredLeaf>>> got(threads);
    std::vector<std::thread> pool_threads;
    for (int t = 0; t < threads; ++t)
      pool_threads.emplace_back([&, t] { tree->QueryGroup(data.queries.data(), nq, k, &got[t]); });
    for (auto& th : pool_threads) th.join();
    std::vector<std::vector<ScoredLeaf>> want;
    tree->QueryGroup(data.queries.data(), nq, k, &want);
    for (int t = 0; t < threads; ++t)
      for (int j = 0; j < nq; ++j) {
        ASSERT_EQ(got[t][j].size(), want[j].size());
        for (size_t i = 0; i < want[j].size(); ++i) EXPECT_EQ(got[t][j][i].leaf, want[j][i].leaf) << round << " " << t;
      }
  }
}

TEST(DciTreeFlatTest, WireCarriesTheNewFieldsAndRefusesVersion2) {
  const int dim = 32, n = 2000;
  auto pool = MakePool(dim, 1000);
  auto data = MakeSyntheticData(n, dim, 1);
  const float *kp, *vp;
  DciParams p = DciParams::Flat();
  p.fov_sqrt = 0.25;
  p.group_fov = 1.5;
  p.centroid_bonus = 0.75;
  auto tree = DciTree::Build(p, pool.get(), 1, Block(data, 0, n, &kp, &vp)).value();
  WireWriter w;
  tree->Serialize(&w);
  std::vector<int32_t> pages = tree->AllPages();
  {
    WireReader r(w.buffer().data(), w.buffer().size());
    size_t used = 0;
    auto copy = DciTree::Deserialize(&r, pool.get(), pages.data(), pages.size(), &used);
    ASSERT_TRUE(copy.ok()) << copy.status().ToString();
    const DciParams& q = (*copy)->params();
    EXPECT_EQ(q.fov_sqrt, 0.25);
    EXPECT_EQ(q.group_fov, 1.5);
    EXPECT_TRUE(q.centroid_cells);
    EXPECT_EQ(q.centroid_bonus, 0.75);
    (*copy)->DetachPages();  // the pages stay with `tree`
  }
  // Truncated anywhere (the summaries at the end included): an error, never a crash.
  for (size_t len = 0; len < w.buffer().size(); len += 1 + len / 16) {
    WireReader tr(w.buffer().data(), len);
    size_t u = 0;
    EXPECT_FALSE(DciTree::Deserialize(&tr, pool.get(), pages.data(), pages.size(), &u).ok()) << len;
  }
  // The tree form: magic, then the version.
  std::vector<uint8_t> old = w.buffer();
  const uint32_t v2 = 2;
  std::memcpy(old.data() + 4, &v2, 4);
  WireReader r(old.data(), old.size());
  size_t used = 0;
  auto refused = DciTree::Deserialize(&r, pool.get(), pages.data(), pages.size(), &used);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("tree version 2 not supported"), std::string::npos) << refused.status().ToString();
  // A corrupt flag byte (centroid_cells) is DATA_LOSS.
  WireWriter only;
  SerializeDciParams(p, &only);
  // 2 int32, 2 doubles, 4 int32, 3 doubles, a flag and a double (centroid), a double, 3 flags,
  // 2 doubles, the seed and the leaf_layout byte.
  EXPECT_EQ(only.buffer().size(), 4u * 2 + 8 * 2 + 4 * 4 + 8 * 3 + 1 + 8 + 8 + 3 + 8 * 2 + 8 + 1);
  std::vector<uint8_t> bad = only.buffer();
  const size_t flag_at = 4 * 2 + 8 * 2 + 4 * 4 + 8 * 3;  // num_simple..fov_min, fov_fraction, fov_sqrt, group_fov
  ASSERT_EQ(bad[flag_at], 1);
  bad[flag_at] = 7;
  WireReader br(bad.data(), bad.size());
  DciParams back;
  EXPECT_EQ(DeserializeDciParams(&br, &back).code(), StatusCode::kDataLoss);
}

TEST(DciTreeFlatTest, SequenceWireVersion2IsRefused) {
  const int dim = 16;
  auto pool = MakePool(dim, 400);
  testing::ModelKv m = testing::RandomKv(1, 1, dim, 300, 3);
  SequenceCacheOptions o;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.dense_layers = 0;
  o.dci = DciParams::Flat();
  auto seq = SequenceCache::Create(o, pool.get()).value();
  ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), m.n).ok());
  auto wire = seq->Serialize().value();
  uint32_t version = 0;
  std::memcpy(&version, wire.metadata.data() + 4, 4);
  EXPECT_EQ(version, kKvWireVersion);
  EXPECT_EQ(kKvWireVersion, 9u);  // 9: DciParams without the options no preset served (kvstore/wire.h)
  const uint32_t v2 = 2;
  std::memcpy(wire.metadata.data() + 4, &v2, 4);
  auto r = SequenceCache::Deserialize(wire.metadata.data(), wire.metadata.size(), wire.pages.data(), wire.pages.size(), pool.get());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("version 2 not supported"), std::string::npos) << r.status().ToString();
}

TEST(DciTreeFlatTest, ValidateNamesTheNewFields) {
  struct Case {
    const char* field;
    DciParams p;
  };
  DciParams a = DciParams::Flat(), b = a, c = a, d = a;
  a.fov_sqrt = -1;
  b.group_fov = -0.5;
  c.group_fov = 1000;
  d.centroid_bonus = NAN;
  for (const Case& x : {Case{"fov_sqrt", a}, Case{"group_fov", b}, Case{"group_fov", c}, Case{"centroid_bonus", d}}) {
    Status s = ValidateDciParams(x.p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << x.field;
    EXPECT_NE(s.message().find(std::string("DciParams.") + x.field), std::string::npos) << s.ToString();
  }
  EXPECT_TRUE(ValidateDciParams(DciParams::Flat()).ok());
}

TEST(DciParamsPresetTest, NamesMapToPresetsAndUnknownIsInvalidArgument) {
  auto ref = DciParamsPreset("reference");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EXPECT_EQ(ref.value().p1, DciParams{}.p1);
  EXPECT_FALSE(ref.value().int8_parent_search);
  auto tuned = DciParamsPreset("tuned");
  ASSERT_TRUE(tuned.ok());
  EXPECT_EQ(tuned.value().p1, DciParams::Tuned().p1);
  EXPECT_EQ(tuned.value().fov_sqrt, 0);
  auto flat = DciParamsPreset("flat");
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat.value().fov_sqrt, DciParams::Flat().fov_sqrt);
  EXPECT_TRUE(flat.value().centroid_cells);
  auto bad = DciParamsPreset("fast");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("reference, tuned or flat, got 'fast'"), std::string::npos);
}

}  // namespace
}  // namespace icecache::kvstore
