// Structure-aware fuzzing of SequenceCache::Deserialize (the wire form a decode worker receives
// from the network): valid wire forms of several layouts are mutated — bit flips, words set to
// edge values, truncation, page lists one longer or shorter, and "consistent-looking" edits of
// the token counts and per-head page counts with the page list resized to match — and every
// result must either be refused or be a cache that decodes a few tokens, locates every position
// and releases exactly the pages it was given. Deterministic (fixed seeds) and bounded; meant to
// run under `scripts/test.sh --sanitize address` as well (where it found a tree that freed its
// caller's pages on a refused form and unchecked upper-level node ids).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "kvstore/sequence_cache.h"
#include "tests/kvstore/kv_test_util.h"

namespace icecache::kvstore {
namespace {

struct Layout {
  int layers, nkv, dense, sink, window, ice;
  int64_t n;
};

struct Sample {
  Layout layout;
  SequenceWire wire;
  size_t counts_at = 0;  // offset of num_tokens (int64), followed by sink_tokens and window_start
};

constexpr int kDim = 8;
constexpr int kPageSize = 4;

Sample MakeSample(const Layout& l, uint64_t seed) {
  auto pool = testing::MakePool(kDim, 4000, kernels::DType::kF32, kPageSize);
  SequenceCacheOptions o;
  o.num_layers = l.layers;
  o.num_kv_heads = l.nkv;
  o.dense_layers = l.dense;
  o.sink_pages = l.sink;
  o.window_pages = l.window;
  o.ice_group = l.ice;
  auto cache = SequenceCache::Create(o, pool.get()).value();
  auto m = testing::RandomKv(l.layers, l.nkv, kDim, l.n, seed);
  EXPECT_TRUE(cache->Build(m.kp.data(), m.vp.data(), m.n).ok());
  Sample s{l, cache->Serialize().value(), 0};
  // Find the token counts: page_size, head_dim, dtype (int32 each) then num_tokens (int64).
  uint8_t pattern[20];
  const int32_t geometry[3] = {kPageSize, kDim, static_cast<int32_t>(kernels::DType::kF32)};
  std::memcpy(pattern, geometry, 12);
  std::memcpy(pattern + 12, &l.n, 8);
  const auto& md = s.wire.metadata;
  for (size_t i = 0; i + sizeof(pattern) <= md.size(); ++i) {
    if (std::memcmp(md.data() + i, pattern, sizeof(pattern)) == 0) {
      s.counts_at = i + 12;
      break;
    }
  }
  EXPECT_GT(s.counts_at, 0u);
  return s;
}

template <typename T>
void Poke(std::vector<uint8_t>* md, size_t at, T value) {
  if (at + sizeof(T) <= md->size()) std::memcpy(md->data() + at, &value, sizeof(T));
}
template <typename T>
T Peek(const std::vector<uint8_t>& md, size_t at) {
  T v{};
  if (at + sizeof(T) <= md.size()) std::memcpy(&v, md.data() + at, sizeof(T));
  return v;
}

// One mutated wire form: metadata and the number of pages handed to Deserialize.
void Mutate(const Sample& s, std::mt19937_64& rng, std::vector<uint8_t>* md, int64_t* pages) {
  *md = s.wire.metadata;
  *pages = static_cast<int64_t>(s.wire.pages.size());
  auto pick = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
  const int64_t edges[] = {0, 1, -1, 2, kPageSize - 1, kPageSize, kPageSize + 1, INT32_MAX, INT64_MAX, INT64_MIN};
  const size_t heads_at = s.counts_at + 24;  // first head's sink/window/dense page counts
  switch (pick(7)) {
    case 0:  // bit flips anywhere
      for (int k = 1 + static_cast<int>(pick(4)); k > 0; --k) (*md)[pick(md->size())] ^= 1u << pick(8);
      break;
    case 1:  // an aligned word set to an edge value
      Poke<int64_t>(md, pick(md->size() / 4) * 4, edges[pick(std::size(edges))]);
      break;
    case 2:  // truncation
      md->resize(pick(md->size()));
      break;
    case 3:  // page list longer or shorter than described
      *pages += static_cast<int64_t>(pick(7)) - 3;
      break;
    case 4: {  // token counts nudged, pages unchanged
      const size_t at = s.counts_at + 8 * pick(3);
      Poke<int64_t>(md, at, Peek<int64_t>(*md, at) + static_cast<int64_t>(pick(2 * kPageSize + 1)) - kPageSize);
      break;
    }
    case 5: {  // the first head's page counts edited and the page list resized to match
      const size_t at = heads_at + 8 * pick(3);
      const int64_t delta = static_cast<int64_t>(pick(5)) - 2;
      const uint64_t count = Peek<uint64_t>(*md, at);
      if (delta < 0 && count < static_cast<uint64_t>(-delta)) break;
      Poke<uint64_t>(md, at, count + delta);
      *pages += delta;
      break;
    }
    case 6:  // the first head's tree flag flipped
      (*md)[std::min(md->size() - 1, heads_at + 24)] ^= 1;
      break;
  }
  if (*pages < 0) *pages = 0;
}

// Uses a cache that Deserialize accepted the way the decode worker would.
void Exercise(SequenceCache& c, std::mt19937_64& rng) {
  const auto& o = c.options();
  for (int l = 0; l < o.num_layers; ++l) {
    for (int h = 0; h < o.num_kv_heads; ++h) {
      for (int64_t pos = 0; pos < c.num_tokens(); ++pos) {
        int32_t page = -1;
        (void)c.LocateToken(l, h, pos, &page);
      }
    }
  }
  std::vector<float> k(static_cast<size_t>(o.num_kv_heads) * kDim), v(k.size());
  std::normal_distribution<float> g;
  for (int t = 0; t < 2 * kPageSize + 1; ++t) {
    for (auto& x : k) x = g(rng);
    for (auto& x : v) x = g(rng);
    std::vector<const float*> kp(o.num_layers, k.data()), vp(o.num_layers, v.data());
    if (!c.Append(kp.data(), vp.data()).ok()) break;
  }
}

TEST(SequenceWireFuzz, MutatedWireFormsAreRefusedOrSafe) {
  const Layout layouts[] = {
      {4, 2, 2, 1, 2, 1, 37},  // sparse, tree + window
      {4, 1, 1, 2, 1, 3, 50},  // ICE(3) group over the sparse layers
      {3, 2, 3, 1, 2, 1, 13},  // every layer dense (a `full` request)
      {4, 1, 2, 2, 2, 1, 5},   // sink not full: no tree yet
      {4, 1, 2, 1, 0, 1, 30},  // window_pages 0: tokens go straight into the tree
  };
  // ICECACHE_FUZZ_SEED / ICECACHE_FUZZ_ITERATIONS explore further (defaults: fixed, 1500 per layout).
  const char* seed_env = std::getenv("ICECACHE_FUZZ_SEED");
  const char* iter_env = std::getenv("ICECACHE_FUZZ_ITERATIONS");
  const int iterations = iter_env ? std::atoi(iter_env) : 1500;
  std::mt19937_64 rng(seed_env ? std::strtoull(seed_env, nullptr, 10) : 20261201);
  auto pool = testing::MakePool(kDim, 20000, kernels::DType::kF32, kPageSize);
  int accepted = 0, refused = 0;
  for (const Layout& l : layouts) {
    const Sample s = MakeSample(l, rng());
    // The unmutated form must round-trip.
    {
      std::vector<int32_t> ids;
      ASSERT_TRUE(pool->AllocateMany(static_cast<int64_t>(s.wire.pages.size()), &ids).ok());
      auto c = SequenceCache::Deserialize(s.wire.metadata.data(), s.wire.metadata.size(), ids.data(), ids.size(),
                                          pool.get());
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      Exercise(**c, rng);
    }
    ASSERT_EQ(pool->used_pages(), 0);
    for (int iter = 0; iter < iterations; ++iter) {
      std::vector<uint8_t> md;
      int64_t pages = 0;
      Mutate(s, rng, &md, &pages);
      std::vector<int32_t> ids;
      ASSERT_TRUE(pool->AllocateMany(pages, &ids).ok());
      auto c = SequenceCache::Deserialize(md.data(), md.size(), ids.data(), ids.size(), pool.get());
      if (c.ok()) {
        ++accepted;
        Exercise(**c, rng);
        c->reset();  // frees what it owns: the pages given plus any it allocated while decoding
      } else {
        ++refused;
        EXPECT_TRUE(c.status().code() == StatusCode::kDataLoss || c.status().code() == StatusCode::kInvalidArgument)
            << c.status().ToString();
        ASSERT_TRUE(pool->FreeMany(ids).ok()) << "layout " << (&l - layouts) << " iteration " << iter << ": " << c.status().ToString() << " used " << pool->used_pages() << " of " << ids.size();
      }
      ASSERT_EQ(pool->used_pages(), 0) << "layout " << (&l - layouts) << " iteration " << iter;
    }
  }
  // Both outcomes occur (some mutations leave a valid form, e.g. a flip in a float of the tree
  // metadata), so the accepting path is exercised too.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace icecache::kvstore
