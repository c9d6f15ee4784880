// KV reuse across requests (decode_worker/prefix_cache.h, router/prefix_index.h) on an in-process
// loopback cluster of real gRPC servers over real UCX: a multi-turn conversation, a shared prefix
// taken by parallel branches, reuse after an eviction, the pool full of retained prefixes, and
// isolation by API key and cache_salt. At budget full every answer must equal, token for token,
// the answer of the same cluster shape with reuse off (router.prefix_routing false), the
// reference that prefills every prompt whole.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "tests/cluster/cluster_fixture.h"

namespace icecache::testing {
namespace {

std::string ModelDir() { return ::testing::TempDir() + "/icecache_kv_reuse_model"; }

std::vector<int32_t> Tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 300);
  return ids;
}

std::vector<int32_t> Concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

struct Answer {
  Status status;
  std::vector<int32_t> tokens;
  int cached = 0;
};

struct Ask {
  int max_tokens = 16;
  int budget = 0;  // full
  std::string api_key;
  std::string salt;
};

Answer Generate(const LoopbackCluster& c, const std::vector<int32_t>& prompt, const Ask& a = {}) {
  router::RemoteGenerateOptions o;
  o.router = c.router->address();
  o.prompt_ids = prompt;
  o.max_tokens = a.max_tokens;
  o.ignore_eos = true;
  o.budget_pages = a.budget;
  o.api_key = a.api_key;
  o.cache_salt = a.salt;
  o.timeout_seconds = 120;
  Answer r;
  r.status = router::RunRemoteGenerate(o, [&](const router::RemoteChunk& ch) {
    r.tokens.insert(r.tokens.end(), ch.token_ids.begin(), ch.token_ids.end());
    if (ch.last) r.cached = ch.cached_tokens;
    return true;
  });
  return r;
}

std::unique_ptr<LoopbackCluster> Start(bool reuse, int64_t pool_pages = 60000,
                                       std::function<void(cluster::ClusterConfig&)> tweak = nullptr) {
  return LoopbackCluster::Start(ModelDir(), 1, 1, "tcp,sm,self", true, 0, pool_pages, "reference", "f32",
                                [reuse, tweak](cluster::ClusterConfig& cfg) {
                                  cfg.router.prefix_routing = reuse;
                                  if (tweak) tweak(cfg);
                                });
}

int64_t Stat(const LoopbackCluster& c, int64_t decode::DecodeEngineStats::*field) {
  return c.decode[0]->stats().*field;
}

TEST(KvReuse, MultiTurnComputesOnlyTheNewTokensAndMatchesNoReuse) {
  auto on = Start(true);
  auto off = Start(false);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  std::vector<int32_t> conversation = Tokens(41, 1);
  for (int turn = 0; turn < 4; ++turn) {
    SCOPED_TRACE("turn " + std::to_string(turn));
    Answer got = Generate(*on, conversation);
    Answer want = Generate(*off, conversation);
    ASSERT_TRUE(got.status.ok()) << got.status.ToString();
    ASSERT_TRUE(want.status.ok()) << want.status.ToString();
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(want.cached, 0);
    if (turn == 0) {
      EXPECT_EQ(got.cached, 0);
    } else {
      // The last turn's prompt and every answer token but the last (never fed) were kept.
      EXPECT_EQ(got.cached, static_cast<int>(conversation.size()) - 1 - 7);
    }
    // The next turn resends everything: this answer, then a new question of 7 tokens.
    conversation = Concat({conversation, got.tokens, Tokens(7, 100 + turn)});
  }
  EXPECT_EQ(Stat(*on, &decode::DecodeEngineStats::prefix_hits), 3);
  // Turns 2-4 computed their 8 new tokens each (the last answer token and the question).
  EXPECT_EQ(Stat(*on, &decode::DecodeEngineStats::prefix_computed_tokens), 3 * 8);
  EXPECT_EQ(Stat(*on, &decode::DecodeEngineStats::used_pages), 0);
  EXPECT_GT(Stat(*on, &decode::DecodeEngineStats::retained_pages), 0);
  EXPECT_EQ(Stat(*off, &decode::DecodeEngineStats::prefix_lookups), 0);
}

TEST(KvReuse, SharedPrefixServesParallelBranchesWithoutTouchingEachOther) {
  auto on = Start(true);
  auto off = Start(false);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  const std::vector<int32_t> system = Tokens(48, 2);
  ASSERT_TRUE(Generate(*on, Concat({system, Tokens(9, 50)})).status.ok());  // retains system + ...
  // Four branches at once share the system prompt: each copies it (the entry stays retained, read
  // only) and grows its own copy.
  std::vector<Answer> got(4), want(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { got[i] = Generate(*on, Concat({system, Tokens(9, 60 + i)}), {.max_tokens = 24}); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    want[i] = Generate(*off, Concat({system, Tokens(9, 60 + i)}), {.max_tokens = 24});
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.ToString();
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "branch " << i;
    EXPECT_GE(got[i].cached, 48) << "branch " << i;
  }
  // The same prompts again: each branch finds its own retained sequence (the whole prompt, but
  // the last token).
  for (int i = 0; i < 4; ++i) {
    Answer again = Generate(*on, Concat({system, Tokens(9, 60 + i)}), {.max_tokens = 24});
    EXPECT_EQ(again.tokens, want[i].tokens) << "branch " << i;
    EXPECT_EQ(again.cached, 48 + 9 - 1) << "branch " << i;
  }
  EXPECT_EQ(Stat(*on, &decode::DecodeEngineStats::used_pages), 0);
}

TEST(KvReuse, AFullPoolEvictsRetainedPrefixesAndNothingRunning) {
  // 4 layers x 2 kv heads, pages of 4 tokens: a 100-token prompt + 20 tokens at budget full
  // commits (120 / 4 + 2) * 8 = 256 pages and keeps 30 * 8 = 240 when it ends. With two such
  // sequences retained (480) and one of the same size running (256), an 800-page pool has no
  // room for a third request (256) until the least recently used prefix is evicted.
  auto on = Start(true, /*pool_pages=*/800);
  auto off = Start(false);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  const Ask ask{.max_tokens = 20};
  const std::vector<int32_t> a = Tokens(100, 3), b = Tokens(100, 4), c = Tokens(100, 5);
  ASSERT_TRUE(Generate(*on, a, ask).status.ok());
  ASSERT_TRUE(Generate(*on, b, ask).status.ok());
  EXPECT_EQ(Stat(*on, &decode::DecodeEngineStats::retained_entries), 2);
  // A long stream runs while a request that needs most of the free pool arrives.
  Answer running;
  std::thread t([&] { running = Generate(*on, Tokens(20, 6), {.max_tokens = 100}); });
  Answer third = Generate(*on, c, ask);
  t.join();
  ASSERT_TRUE(third.status.ok()) << third.status.ToString();
  ASSERT_TRUE(running.status.ok()) << running.status.ToString();
  EXPECT_EQ(third.tokens, Generate(*off, c, ask).tokens);
  EXPECT_EQ(running.tokens, Generate(*off, Tokens(20, 6), {.max_tokens = 100}).tokens);
  EXPECT_GE(Stat(*on, &decode::DecodeEngineStats::prefix_evictions), 1);
  // `a` was the least recently used: evicted, so its follow-up is prefilled whole, and exact.
  const std::vector<int32_t> follow = Concat({a, Tokens(5, 7)});
  Answer again = Generate(*on, follow, ask);
  EXPECT_EQ(again.cached, 0);
  EXPECT_EQ(again.tokens, Generate(*off, follow, ask).tokens);
  EXPECT_EQ(Stat(*on, &decode::DecodeEngineStats::used_pages), 0);
}

TEST(KvReuse, DifferentKeysOrSaltsNeverShare) {
  auto keys = [](cluster::ClusterConfig& cfg) { cfg.router.api_keys = {"key-a", "key-b"}; };
  auto on = Start(true, 60000, keys);
  ASSERT_NE(on, nullptr);
  const std::vector<int32_t> prompt = Tokens(40, 8);
  ASSERT_TRUE(Generate(*on, prompt, {.api_key = "key-a"}).status.ok());
  EXPECT_EQ(Generate(*on, prompt, {.api_key = "key-b"}).cached, 0);
  EXPECT_EQ(Generate(*on, prompt, {.api_key = "key-a", .salt = "tenant-1"}).cached, 0);
  EXPECT_EQ(Generate(*on, prompt, {.api_key = "key-a"}).cached, 39);
  EXPECT_EQ(Generate(*on, prompt, {.api_key = "key-a", .salt = "tenant-1"}).cached, 39);
  EXPECT_EQ(Generate(*on, prompt, {.api_key = "key-b", .salt = "tenant-1"}).cached, 0);
}

TEST(KvReuse, SparseBudgetGrowsTheTreesByInsertion) {
  auto on = Start(true);
  ASSERT_NE(on, nullptr);
  std::vector<int32_t> conversation = Tokens(120, 9);
  for (int turn = 0; turn < 3; ++turn) {
    Answer got = Generate(*on, conversation, {.max_tokens = 24, .budget = 8});
    ASSERT_TRUE(got.status.ok()) << got.status.ToString();
    EXPECT_EQ(got.tokens.size(), 24u);
    EXPECT_EQ(got.cached, turn == 0 ? 0 : static_cast<int>(conversation.size()) - 1 - 6);
    conversation = Concat({conversation, got.tokens, Tokens(6, 200 + turn)});
  }
  // A full-budget request does not reuse a sparse sequence (nor the other way round).
  EXPECT_EQ(Generate(*on, conversation, {.max_tokens = 4}).cached, 0);
}

}  // namespace
}  // namespace icecache::testing
