#include "kvstore/sequence_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "kvstore/retriever.h"
#include "tests/kvstore/kv_test_util.h"

namespace icecache::kvstore {
namespace {

using testing::MakePool;
using testing::ModelKv;
using testing::RandomKv;
using testing::ReadRow;
using testing::Rounded;

// Every position of every (layer, head) is where LocateToken says, with the right K and V.
void ExpectAllTokens(const SequenceCache& seq, const PagePool& pool, const ModelKv& m) {
  const auto& o = seq.options();
  for (int l = 0; l < o.num_layers; ++l)
    for (int h = 0; h < o.num_kv_heads; ++h) {
      if (const DciTree* t = seq.tree(l, h)) {
        ASSERT_TRUE(t->CheckInvariants().ok()) << t->CheckInvariants().ToString();
      }
      for (int64_t pos = 0; pos < seq.num_tokens(); ++pos) {
        int32_t page = -1;
        const TokenLocation loc = seq.LocateToken(l, h, pos, &page);
        ASSERT_EQ(ReadRow(pool, pool.KRow(page, loc.slot), m.dim), Rounded(pool, m.K(l, pos, h), m.dim))
            << "layer " << l << " head " << h << " pos " << pos;
        ASSERT_EQ(ReadRow(pool, pool.VRow(page, loc.slot), m.dim), Rounded(pool, m.V(l, pos, h), m.dim));
      }
    }
}

void AppendRange(SequenceCache* seq, const ModelKv& m, int64_t from, int64_t to) {
  std::vector<const float*> kr(m.layers), vr(m.layers);
  for (int64_t t = from; t < to; ++t) {
    for (int l = 0; l < m.layers; ++l) {
      kr[l] = m.K(l, t, 0);
      vr[l] = m.V(l, t, 0);
    }
    ASSERT_TRUE(seq->Append(kr.data(), vr.data()).ok()) << "position " << t;
  }
}

SequenceCacheOptions Opts(int layers, int nkv) {
  SequenceCacheOptions o;
  o.num_layers = layers;
  o.num_kv_heads = nkv;
  return o;
}

struct Shape {
  int64_t prefill, total;
  int sink, window, ice;
};

class SequenceCacheShapeTest : public ::testing::TestWithParam<Shape> {};

TEST_P(SequenceCacheShapeTest, BuildAppendEvictRelease) {
  const Shape sh = GetParam();
  const int layers = 5, nkv = 2, dim = 16;
  auto pool = MakePool(dim, 6000, kernels::DType::kBF16);
  ModelKv m = RandomKv(layers, nkv, dim, sh.total, 11);
  SequenceCacheOptions o = Opts(layers, nkv);
  o.sink_pages = sh.sink;
  o.window_pages = sh.window;
  o.ice_group = sh.ice;
  auto seq = SequenceCache::Create(o, pool.get()).value();
  ThreadPool threads(2);
  ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), sh.prefill, &threads).ok());
  ExpectAllTokens(*seq, *pool, m);
  AppendRange(seq.get(), m, sh.prefill, sh.total);
  EXPECT_EQ(seq->num_tokens(), sh.total);
  ExpectAllTokens(*seq, *pool, m);
  EXPECT_LE(seq->window_pages(3, 1).size(), static_cast<size_t>(sh.window));
  EXPECT_EQ(seq->pages_held(), pool->used_pages());
  seq->Release();
  EXPECT_EQ(pool->used_pages(), 0);
}

// NextTokenLocation before each append names the page and slot LocateToken finds after it,
// whenever it names one; it names one for every append that does not open a page.
TEST_P(SequenceCacheShapeTest, NextTokenLocationPredictsAppend) {
  const Shape sh = GetParam();
  const int layers = 5, nkv = 2, dim = 16;
  auto pool = MakePool(dim, 6000, kernels::DType::kBF16);
  ModelKv m = RandomKv(layers, nkv, dim, sh.total, 11);
  for (SparseLayout layout : {SparseLayout::kDciTree, SparseLayout::kTokenOrder}) {
    SequenceCacheOptions o = Opts(layers, nkv);
    o.sink_pages = sh.sink;
    o.window_pages = sh.window;
    o.ice_group = layout == SparseLayout::kDciTree ? sh.ice : 1;
    o.layout = layout;
    auto seq = SequenceCache::Create(o, pool.get()).value();
    ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), sh.prefill).ok());
    std::vector<const float*> kr(layers), vr(layers);
    int64_t predicted = 0, in_place = 0;
    for (int64_t t = sh.prefill; t < sh.total; ++t) {
      std::vector<int32_t> next(layers * nkv);
      std::vector<TokenLocation> loc(layers * nkv);
      for (int l = 0; l < layers; ++l)
        for (int h = 0; h < nkv; ++h) loc[l * nkv + h] = seq->NextTokenLocation(l, h, &next[l * nkv + h]);
      for (int l = 0; l < layers; ++l) {
        kr[l] = m.K(l, t, 0);
        vr[l] = m.V(l, t, 0);
      }
      ASSERT_TRUE(seq->Append(kr.data(), vr.data()).ok());
      for (int l = 0; l < layers; ++l)
        for (int h = 0; h < nkv; ++h) {
          int32_t page = -1;
          const TokenLocation after = seq->LocateToken(l, h, t, &page);
          const bool dense_or_window = l < o.dense_layers || t < o.sink_pages * 16 || o.window_pages > 0;
          if (dense_or_window && after.slot != 0) ++in_place;  // landed in a page that already existed
          if (next[l * nkv + h] < 0) continue;
          ++predicted;
          ASSERT_EQ(next[l * nkv + h], page) << "layer " << l << " head " << h << " pos " << t;
          ASSERT_EQ(loc[l * nkv + h].slot, after.slot) << "layer " << l << " head " << h << " pos " << t;
        }
    }
    EXPECT_EQ(predicted, in_place);
    EXPECT_GT(predicted, 0);
  }
}

// pages_changed() after each Append lists every page whose bytes changed other than the pages
// that took the new token (compared over the whole pool), and the window pages freed by a push;
// with window pushes and direct tree inserts (window 0) and ICE groups.
TEST_P(SequenceCacheShapeTest, PagesChangedCoversEveryRewrittenPage) {
  const Shape sh = GetParam();
  const int layers = 5, nkv = 2, dim = 16;
  auto pool = MakePool(dim, 6000, kernels::DType::kBF16);
  ModelKv m = RandomKv(layers, nkv, dim, sh.total, 13);
  SequenceCacheOptions o = Opts(layers, nkv);
  o.sink_pages = sh.sink;
  o.window_pages = sh.window;
  o.ice_group = sh.ice;
  auto seq = SequenceCache::Create(o, pool.get()).value();
  ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), sh.prefill).ok());
  const size_t pb = pool->page_bytes();
  const int64_t pages = static_cast<int64_t>(pool->capacity_bytes() / pb);
  const auto* base = static_cast<const uint8_t*>(pool->base());
  std::vector<const float*> kr(layers), vr(layers);
  int64_t listed = 0, pushes = 0;
  for (int64_t t = sh.prefill; t < sh.total; ++t) {
    std::vector<uint8_t> before(base, base + pool->capacity_bytes());
    std::vector<bool> held_before(pages);
    for (int64_t p = 0; p < pages; ++p) held_before[p] = pool->IsAllocated(static_cast<int32_t>(p));
    const int64_t window_start = seq->window_start();
    for (int l = 0; l < layers; ++l) {
      kr[l] = m.K(l, t, 0);
      vr[l] = m.V(l, t, 0);
    }
    ASSERT_TRUE(seq->Append(kr.data(), vr.data()).ok());
    const std::vector<int32_t>& changed = seq->pages_changed();
    ASSERT_TRUE(std::is_sorted(changed.begin(), changed.end()));
    std::vector<bool> token_page(pages, false), opened_reused(pages, false);
    for (int l = 0; l < layers; ++l)
      for (int h = 0; h < nkv; ++h) {
        int32_t page = -1;
        const TokenLocation loc = seq->LocateToken(l, h, t, &page);
        // A token inserted into a tree (window 0) may also move rows: only list pages count there.
        if (l < o.dense_layers || t < o.sink_pages * 16 || o.window_pages > 0) {
          token_page[page] = true;
          // A page opened by this append that was held before was freed by it and taken again.
          if (loc.slot == 0 && held_before[page]) opened_reused[page] = true;
        }
      }
    for (int64_t p = 0; p < pages; ++p) {
      const bool listed_p = std::binary_search(changed.begin(), changed.end(), static_cast<int32_t>(p));
      const bool bytes_changed = std::memcmp(before.data() + p * pb, base + p * pb, pb) != 0;
      if (bytes_changed && !token_page[p]) {
        ASSERT_TRUE(listed_p) << "page " << p << " changed at position " << t;
      }
      // A page the append freed (it may be allocated again at once, as a new window page).
      if (held_before[p] && (!pool->IsAllocated(static_cast<int32_t>(p)) || opened_reused[p])) {
        ASSERT_TRUE(listed_p) << "freed page " << p << " at position " << t;
      }
    }
    listed += static_cast<int64_t>(changed.size());
    if (seq->window_start() != window_start && o.window_pages > 0) ++pushes;
    if (o.window_pages > 0 && seq->window_start() == window_start) {
      ASSERT_TRUE(changed.empty()) << "position " << t;
    }
  }
  if (o.window_pages > 0 && sh.total - sh.prefill >= 16 * (o.window_pages + 1)) {
    EXPECT_GT(pushes, 0);
  }
  if (pushes > 0 || o.window_pages == 0) {
    EXPECT_GT(listed, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SequenceCacheShapeTest,
                         ::testing::Values(Shape{500, 700, 2, 2, 1}, Shape{10, 300, 2, 2, 1}, Shape{0, 200, 2, 2, 3},
                                           Shape{400, 520, 1, 0, 1}, Shape{1000, 1100, 0, 3, 3}));

TEST(SequenceCacheTest, LayerByLayerDecodeEqualsAppend) {
  const int layers = 5, nkv = 2, dim = 16;
  auto pool = MakePool(dim, 4000);
  ModelKv m = RandomKv(layers, nkv, dim, 400, 16);
  SequenceCacheOptions o = Opts(layers, nkv);
  o.ice_group = 3;
  auto a = SequenceCache::Create(o, pool.get()).value();
  auto b = SequenceCache::Create(o, pool.get()).value();
  ASSERT_TRUE(a->Build(m.kp.data(), m.vp.data(), 10).ok());
  ASSERT_TRUE(b->Build(m.kp.data(), m.vp.data(), 10).ok());
  AppendRange(a.get(), m, 10, 400);
  std::vector<float> kt(nkv * dim), vt(nkv * dim);
  for (int64_t t = 10; t < 400; ++t) {
    ASSERT_TRUE(b->BeginToken().ok());
    EXPECT_EQ(b->num_tokens(), t + 1);
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < nkv; ++h) {
        std::copy_n(m.K(l, t, h), dim, kt.data() + h * dim);
        std::copy_n(m.V(l, t, h), dim, vt.data() + h * dim);
      }
      ASSERT_TRUE(b->WriteLayer(l, kt.data(), vt.data()).ok());
    }
  }
  EXPECT_EQ(a->Serialize().value().metadata, b->Serialize().value().metadata);
  ExpectAllTokens(*b, *pool, m);
  EXPECT_EQ(b->WriteLayer(layers, kt.data(), vt.data()).code(), StatusCode::kInvalidArgument);
}

TEST(SequenceCacheTest, ParallelBuildEqualsSerialBuild) {
  const int layers = 4, nkv = 3, dim = 16;
  auto pool = MakePool(dim, 4000);
  ModelKv m = RandomKv(layers, nkv, dim, 900, 12);
  auto a = SequenceCache::Create(Opts(layers, nkv), pool.get()).value();
  auto b = SequenceCache::Create(Opts(layers, nkv), pool.get()).value();
  ThreadPool threads(2);
  ASSERT_TRUE(a->Build(m.kp.data(), m.vp.data(), m.n).ok());
  ASSERT_TRUE(b->Build(m.kp.data(), m.vp.data(), m.n, &threads).ok());
  auto wa = a->Serialize().value(), wb = b->Serialize().value();
  EXPECT_EQ(wa.metadata, wb.metadata);  // page ids differ, structure must not
}

TEST(SequenceCacheTest, SerializeRoundTripIntoAnotherPool) {
  const int layers = 5, nkv = 2, dim = 16, nq = 4;
  auto src = MakePool(dim, 4000, kernels::DType::kBF16);
  auto dst = MakePool(dim, 5000, kernels::DType::kBF16);
  ModelKv m = RandomKv(layers, nkv, dim, 1300, 13);
  SequenceCacheOptions o = Opts(layers, nkv);
  o.ice_group = 3;
  auto seq = SequenceCache::Create(o, src.get()).value();
  ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), 1200).ok());
  AppendRange(seq.get(), m, 1200, 1250);
  auto wire = seq->Serialize().value();
  EXPECT_EQ(static_cast<int64_t>(wire.pages.size()), seq->pages_held());
  // "Ship" the pages into the destination pool, which hands out different ids.
  std::vector<int32_t> burn, pages;
  ASSERT_TRUE(dst->AllocateMany(37, &burn).ok());
  ASSERT_TRUE(dst->AllocateMany(wire.pages.size(), &pages).ok());
  ASSERT_TRUE(CopyPages(*src, wire.pages, dst.get(), pages).ok());
  auto copy = SequenceCache::Deserialize(wire.metadata.data(), wire.metadata.size(), pages.data(), pages.size(), dst.get());
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ((*copy)->Serialize().value().metadata, wire.metadata);
  EXPECT_EQ((*copy)->num_tokens(), 1250);
  ExpectAllTokens(**copy, *dst, m);
  // Both continue identically.
  AppendRange(seq.get(), m, 1250, 1300);
  AppendRange(copy->get(), m, 1250, 1300);
  EXPECT_EQ(seq->Serialize().value().metadata, (*copy)->Serialize().value().metadata);
  ExpectAllTokens(**copy, *dst, m);
  std::vector<float> q(nq * dim, 0.25f);
  Retriever r(RetrievalPolicy{16, RetrievalMode::kSparse});
  for (int layer = 0; layer < layers; ++layer) {
    if (seq->LeaderOf(layer) != layer) continue;
    PageSelection a, b;
    ASSERT_TRUE(r.Select({seq.get()}, layer, q.data(), nq, &a).ok());
    ASSERT_TRUE(r.Select({copy->get()}, layer, q.data(), nq, &b).ok());
    EXPECT_EQ(a.tree_leaf, b.tree_leaf);
    EXPECT_EQ(a.page_valid, b.page_valid);
  }
  copy->reset();
  EXPECT_EQ(dst->used_pages(), 37);
}

// The heads [first, first + count) of m as a ModelKv of their own.
ModelKv HeadsOf(const ModelKv& m, int first, int count) {
  ModelKv out{m.layers, count, m.dim, m.n, {}, {}, {}, {}};
  for (int l = 0; l < m.layers; ++l) {
    out.k.emplace_back();
    out.v.emplace_back();
    for (int64_t t = 0; t < m.n; ++t) {
      out.k[l].insert(out.k[l].end(), m.K(l, t, first), m.K(l, t, first) + count * m.dim);
      out.v[l].insert(out.v[l].end(), m.V(l, t, first), m.V(l, t, first) + count * m.dim);
    }
  }
  for (int l = 0; l < m.layers; ++l) {
    out.kp.push_back(out.k[l].data());
    out.vp.push_back(out.v[l].data());
  }
  return out;
}

// A tensor-parallel decode rank's part of a shipped sequence: splitting by head gives, per part,
// the cache that building those heads alone gives (same structure, same selections, same pages'
// contents), moves every page (none copied or lost) and keeps decoding the same way.
TEST(SequenceCacheTest, SplitByHeadEqualsBuildingEachPartsHeads) {
  const int layers = 5, nkv = 4, dim = 16, nq = 2, parts = 2;
  auto pool = MakePool(dim, 8000);
  ModelKv m = RandomKv(layers, nkv, dim, 1300, 21);
  SequenceCacheOptions o = Opts(layers, nkv);
  o.ice_group = 3;
  auto whole = SequenceCache::Create(o, pool.get()).value();
  ASSERT_TRUE(whole->Build(m.kp.data(), m.vp.data(), 1200).ok());
  AppendRange(whole.get(), m, 1200, 1230);
  const int64_t held = whole->pages_held();
  const int64_t used = pool->used_pages();

  EXPECT_EQ(SequenceCache::SplitByHead(nullptr, 2).status().code(), StatusCode::kInvalidArgument);
  auto odd = SequenceCache::Create(Opts(layers, 3), pool.get()).value();
  auto refused = SequenceCache::SplitByHead(std::move(odd), 2);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("3 kv heads neither split into nor replicate onto 2"), std::string::npos);

  auto split = SequenceCache::SplitByHead(std::move(whole), parts);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  ASSERT_EQ(split->size(), static_cast<size_t>(parts));
  EXPECT_EQ(pool->used_pages(), used);  // moved, not copied
  int64_t sum = 0;
  for (int p = 0; p < parts; ++p) {
    SequenceCache& part = *(*split)[p];
    sum += part.pages_held();
    EXPECT_EQ(part.options().num_kv_heads, nkv / parts);
    EXPECT_EQ(part.num_tokens(), 1230);
    ModelKv mine = HeadsOf(m, p * (nkv / parts), nkv / parts);
    SequenceCacheOptions ro = Opts(layers, nkv / parts);
    ro.ice_group = 3;
    auto ref = SequenceCache::Create(ro, pool.get()).value();
    ASSERT_TRUE(ref->Build(mine.kp.data(), mine.vp.data(), 1200).ok());
    AppendRange(ref.get(), mine, 1200, 1230);
    EXPECT_EQ(part.Serialize().value().metadata, ref->Serialize().value().metadata) << "part " << p;
    ExpectAllTokens(part, *pool, mine);
    AppendRange(&part, mine, 1230, 1300);
    AppendRange(ref.get(), mine, 1230, 1300);
    EXPECT_EQ(part.Serialize().value().metadata, ref->Serialize().value().metadata) << "part " << p;
    std::vector<float> q(nq * dim, 0.25f);
    Retriever r(RetrievalPolicy{16, RetrievalMode::kSparse});
    for (int layer = 0; layer < layers; ++layer) {
      if (part.LeaderOf(layer) != layer) continue;
      PageSelection a, b;
      ASSERT_TRUE(r.Select({&part}, layer, q.data(), nq, &a).ok());
      ASSERT_TRUE(r.Select({ref.get()}, layer, q.data(), nq, &b).ok());
      EXPECT_EQ(a.tree_leaf, b.tree_leaf);
      EXPECT_EQ(a.page_valid, b.page_valid);
    }
  }
  EXPECT_EQ(sum, held);  // each part counted before its own appends
  split->clear();
  EXPECT_EQ(pool->used_pages(), 0);
}

// More tensor-parallel ranks than kv heads: each part is one head's cache, as building that head
// alone gives; the two parts of a head are independent copies (appending to one leaves the
// other as it was), the pool holds the pages once per copy, and a pool too small for the copies
// refuses with RESOURCE_EXHAUSTED and leaks nothing.
TEST(SequenceCacheTest, SplitByHeadReplicatesKvHeadsOntoMoreParts) {
  const int layers = 4, nkv = 2, dim = 16, nq = 1, parts = 4, rep = parts / nkv;
  ModelKv m = RandomKv(layers, nkv, dim, 700, 33);
  SequenceCacheOptions o = Opts(layers, nkv);
  o.ice_group = 2;
  {
    auto small = MakePool(dim, 500);  // room for the sequence, not for a second copy
    auto whole = SequenceCache::Create(o, small.get()).value();
    ASSERT_TRUE(whole->Build(m.kp.data(), m.vp.data(), 600).ok());
    const int64_t used = small->used_pages();
    ASSERT_GT(2 * used, small->capacity_pages());
    auto full = SequenceCache::SplitByHead(std::move(whole), parts);
    EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted) << full.status().ToString();
    EXPECT_EQ(small->used_pages(), 0) << used << " pages were held";  // the sequence and its partial copies freed
  }
  auto pool = MakePool(dim, 8000);
  auto three = SequenceCache::Create(o, pool.get()).value();
  EXPECT_EQ(SequenceCache::SplitByHead(std::move(three), 3).status().code(), StatusCode::kInvalidArgument);

  auto whole = SequenceCache::Create(o, pool.get()).value();
  ASSERT_TRUE(whole->Build(m.kp.data(), m.vp.data(), 600).ok());
  AppendRange(whole.get(), m, 600, 630);
  const int64_t used = pool->used_pages();
  auto split = SequenceCache::SplitByHead(std::move(whole), parts);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  ASSERT_EQ(split->size(), static_cast<size_t>(parts));
  EXPECT_EQ(pool->used_pages(), rep * used);  // one copy of every page per replica

  std::vector<std::unique_ptr<SequenceCache>> refs;
  std::vector<ModelKv> heads;
  for (int h = 0; h < nkv; ++h) {
    heads.push_back(HeadsOf(m, h, 1));
    SequenceCacheOptions ro = Opts(layers, 1);
    ro.ice_group = 2;
    refs.push_back(SequenceCache::Create(ro, pool.get()).value());
    ASSERT_TRUE(refs[h]->Build(heads[h].kp.data(), heads[h].vp.data(), 600).ok());
    AppendRange(refs[h].get(), heads[h], 600, 630);
  }
  for (int p = 0; p < parts; ++p) {
    SequenceCache& part = *(*split)[p];
    const int h = p / rep;
    EXPECT_EQ(part.options().num_kv_heads, 1);
    EXPECT_EQ(part.num_tokens(), 630);
    EXPECT_EQ(part.Serialize().value().metadata, refs[h]->Serialize().value().metadata) << "part " << p;
    ExpectAllTokens(part, *pool, heads[h]);
  }
  // The first copy of head 0 decodes on; its sibling (part 1) is untouched and still equals the
  // reference before those tokens, page for page.
  const std::vector<uint8_t> before = (*split)[1]->Serialize().value().metadata;
  AppendRange((*split)[0].get(), heads[0], 630, 700);
  AppendRange(refs[0].get(), heads[0], 630, 700);
  EXPECT_EQ((*split)[0]->Serialize().value().metadata, refs[0]->Serialize().value().metadata);
  EXPECT_EQ((*split)[1]->Serialize().value().metadata, before);
  EXPECT_EQ((*split)[1]->num_tokens(), 630);
  std::vector<float> q(nq * dim, 0.25f);
  Retriever r(RetrievalPolicy{16, RetrievalMode::kSparse});
  for (int layer = 0; layer < layers; ++layer) {
    if ((*split)[0]->LeaderOf(layer) != layer) continue;
    PageSelection a, b;
    ASSERT_TRUE(r.Select({(*split)[0].get()}, layer, q.data(), nq, &a).ok());
    ASSERT_TRUE(r.Select({refs[0].get()}, layer, q.data(), nq, &b).ok());
    EXPECT_EQ(a.tree_leaf, b.tree_leaf);
    EXPECT_EQ(a.page_valid, b.page_valid);
  }
  split->clear();
  refs.clear();
  EXPECT_EQ(pool->used_pages(), 0);
}

TEST(SequenceCacheTest, CorruptWireIsRejectedAndPagesStayWithCaller) {
  const int layers = 3, nkv = 1, dim = 16;
  auto pool = MakePool(dim, 3000);
  ModelKv m = RandomKv(layers, nkv, dim, 600, 14);
  auto seq = SequenceCache::Create(Opts(layers, nkv), pool.get()).value();
  ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), m.n).ok());
  auto wire = seq->Serialize().value();
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool->AllocateMany(wire.pages.size(), &pages).ok());
  ASSERT_TRUE(CopyPages(*pool, wire.pages, pool.get(), pages).ok());
  const int64_t used = pool->used_pages();
  // Truncations at every length, flipped bytes, wrong page counts: never a crash, always an error.
  for (size_t len = 0; len < wire.metadata.size(); len += 1 + len / 8) {
    auto r = SequenceCache::Deserialize(wire.metadata.data(), len, pages.data(), pages.size(), pool.get());
    ASSERT_FALSE(r.ok()) << len;
  }
  auto bad = wire.metadata;
  bad[0] ^= 0xff;
  EXPECT_EQ(SequenceCache::Deserialize(bad.data(), bad.size(), pages.data(), pages.size(), pool.get()).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(SequenceCache::Deserialize(wire.metadata.data(), wire.metadata.size(), pages.data(), pages.size() - 1, pool.get())
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  auto other = MakePool(32, 10);
  EXPECT_EQ(SequenceCache::Deserialize(wire.metadata.data(), wire.metadata.size(), pages.data(), pages.size(), other.get())
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_LE(pool->used_pages(), used);
  // Flipped bytes: an error, or (for a benign flip such as a float) a valid cache.
  for (size_t i = 200; i < wire.metadata.size(); i += 97) {
    bad = wire.metadata;
    bad[i] ^= 0x5a;
    auto r = SequenceCache::Deserialize(bad.data(), bad.size(), pages.data(), pages.size(), pool.get());
    if (r.ok()) break;  // the cache now owns the pages and frees them on destruction
    EXPECT_EQ(pool->used_pages(), used);
  }
}

TEST(SequenceCacheTest, PoolExhaustionIsAnErrorNotACrash) {
  const int layers = 3, nkv = 2, dim = 16;
  auto pool = MakePool(dim, 100);
  ModelKv m = RandomKv(layers, nkv, dim, 2000, 15);
  auto seq = SequenceCache::Create(Opts(layers, nkv), pool.get()).value();
  Status s = seq->Build(m.kp.data(), m.vp.data(), m.n);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->used_pages(), 0);
  ASSERT_TRUE(seq->Build(m.kp.data(), m.vp.data(), 150).ok());
  std::vector<const float*> kr(layers), vr(layers);
  Status a;
  for (int64_t t = 150; t < m.n && a.ok(); ++t) {
    for (int l = 0; l < layers; ++l) {
      kr[l] = m.K(l, t, 0);
      vr[l] = m.V(l, t, 0);
    }
    a = seq->Append(kr.data(), vr.data());
  }
  EXPECT_EQ(a.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(seq->Append(kr.data(), vr.data()).code(), StatusCode::kFailedPrecondition);
  seq->Release();
  EXPECT_EQ(pool->used_pages(), 0);
}

}  // namespace
}  // namespace icecache::kvstore
