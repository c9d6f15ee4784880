// kv_dtype end to end: a bf16 / f16 loopback cluster (pages built, shipped and decoded in that
// dtype) gives exactly the greedy tokens of one process whose DenseKvCache has the same dtype; a
// decode worker whose pool has another dtype refuses the shipped KV with an error naming
// kv_dtype. Also runs the old schedule (no per-layer overlap, one page per segment) to check it
// gives the same tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "model/dense_kv_cache.h"
#include "model/generator.h"
#include "model/model.h"
#include "client/client.h"
#include "tests/cluster/cluster_fixture.h"

namespace icecache::testing {
namespace {

std::vector<int32_t> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 300);
  return ids;
}


struct Generated {
  Status status;
  std::vector<int32_t> tokens;
  router::RemoteChunk last;
};

Generated Generate(const std::string& router, const std::vector<int32_t>& prompt, int max_tokens, int budget) {
  router::RemoteGenerateOptions o;
  o.router = router;
  o.prompt_ids = prompt;
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  o.budget_pages = budget;
  Generated g;
  g.status = router::RunRemoteGenerate(o, [&](const router::RemoteChunk& c) {
    g.tokens.insert(g.tokens.end(), c.token_ids.begin(), c.token_ids.end());
    if (c.last) g.last = c;
    return true;
  });
  return g;
}

std::string ModelDir() { return ::testing::TempDir() + "/icecache_cluster_model"; }

// A bf16 (or f16) cluster with full attention equals one process whose dense cache has that dtype.
class ClusterKvDtypeExact : public ::testing::TestWithParam<const char*> {};

TEST_P(ClusterKvDtypeExact, FullBudgetMatchesSingleProcessGreedyOfTheSameDtype) {
  const std::string name = GetParam();
  const kernels::DType dtype = name == "f16" ? kernels::DType::kF16 : kernels::DType::kBF16;
  auto c = LoopbackCluster::Start(ModelDir(), 1, 1, "tcp,sm,self", true, 0, 60000, "reference", name);
  ASSERT_NE(c, nullptr);
  for (int n : {1, 7, 61}) {
    std::vector<int32_t> prompt = Prompt(n, 100 + n);
    Generated r = Generate(c->router->address(), prompt, 20, 0);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(r.tokens, SingleProcessGreedy(ModelDir(), prompt, 20, dtype)) << name << ", prompt length " << n;
    if (n == 61) {
      // 2-byte pages: 61 tokens in pages of 4 = 16 pages per (layer, kv head), 4 layers x 2 heads,
      // each page 2 * 4 * 16 (head_dim) * 2 bytes; plus the metadata.
      EXPECT_GE(r.last.transfer_bytes, 16 * 8 * 256);
      EXPECT_LT(r.last.transfer_bytes, 16 * 8 * 256 + 64 * 1024);
    }
  }
  // A sparse budget completes too (trees built layer by layer).
  Generated r = Generate(c->router->address(), Prompt(300, 9), 12, 6);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.tokens.size(), 12u);
  auto stats = c->prefill[0]->engine_stats();
  EXPECT_EQ(stats.completed, 4);
  // Far fewer segments than pages (16 * 8 pages for 61 tokens alone): runs travel together.
  EXPECT_LT(stats.segments_shipped, 4 * 10);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ClusterKvDtypeExact, ::testing::Values("bf16", "f16"));

TEST(ClusterKvDtype, OldScheduleGivesTheSameTokens) {
  // Baseline of the benchmarks: trees built after the forward pass, one page per segment.
  const std::string dir = ModelDir();
  auto fast = LoopbackCluster::Start(dir, 1, 1, "tcp,sm,self", true, 0, 60000, "reference", "bf16");
  ASSERT_NE(fast, nullptr);
  cluster::ClusterConfig cfg = fast->config;
  cfg.prefill.overlap_tree_build = false;
  cfg.ucx.max_segment_bytes = 1;
  cfg.router.prefill.addresses.clear();
  cfg.router.decode.addresses = {fast->decode[0]->address()};
  auto slow_prefill = prefill::PrefillServer::Start(cfg);
  ASSERT_TRUE(slow_prefill.ok()) << slow_prefill.status().ToString();
  cfg.router.prefill.addresses = {(*slow_prefill)->address()};
  cfg.router.prefix_routing = false;  // the same prompt again must be prefilled, not reused
  auto slow_router = router::RouterServer::Start(cfg);
  ASSERT_TRUE(slow_router.ok()) << slow_router.status().ToString();
  std::vector<int32_t> prompt = Prompt(200, 21);
  Generated a = Generate(fast->router->address(), prompt, 10, 6);
  Generated b = Generate((*slow_router)->address(), prompt, 10, 6);
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.last.transfer_bytes, b.last.transfer_bytes);
  auto slow = (*slow_prefill)->engine_stats();
  EXPECT_EQ(slow.completed, 1);
  auto fast_stats = fast->prefill[0]->engine_stats();
  EXPECT_LT(fast_stats.segments_shipped, slow.segments_shipped);  // one segment per page + metadata
  (*slow_router)->Shutdown();
  (*slow_prefill)->Shutdown();
}

// parallel.tensor_parallel_size > 1 starts both workers over a TpGroup (docs/parallel.md; served
// end to end in tensor_parallel_cluster_test.cc); what they cannot serve is refused at start with
// the counts named: a device list of another length, and a size that neither divides the heads
// nor is a multiple of the kv heads. More decode ranks than kv heads start (replicated kv heads).
TEST(ClusterConfigChecks, WorkersStartTensorParallelAndRefuseWhatTheyCannotServe) {
  cluster::ClusterConfig cfg;
  cfg.model.dir = std::string(ICECACHE_SOURCE_DIR) + "/tests/fixtures/models/llama_gqa_f32";  // 2 kv heads
  cfg.prefill.listen = cfg.decode.listen = "127.0.0.1:0";
  cfg.prefill.device = cfg.decode.device = "cpu";
  cfg.ucx.net_devices = "lo";
  cfg.parallel.tensor_parallel_size = 2;
  auto decode = decode::DecodeServer::Start(cfg);
  ASSERT_TRUE(decode.ok()) << decode.status().ToString();
  auto prefill = prefill::PrefillServer::Start(cfg);
  ASSERT_TRUE(prefill.ok()) << prefill.status().ToString();
  (*prefill)->Shutdown();
  (*decode)->Shutdown();

  cluster::ClusterConfig devices = cfg;
  devices.decode.devices = {"cpu", "cpu", "cpu"};
  auto bad = decode::DecodeServer::Start(devices);
  ASSERT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("decode.devices lists 3 devices"), std::string::npos) << bad.status().ToString();
  devices.prefill.devices = {"cpu"};
  auto bad_prefill = prefill::PrefillServer::Start(devices);
  ASSERT_EQ(bad_prefill.status().code(), StatusCode::kInvalidArgument) << bad_prefill.status().ToString();
  EXPECT_NE(bad_prefill.status().message().find("prefill.devices"), std::string::npos);

  cluster::ClusterConfig replicated = cfg;
  replicated.parallel.tensor_parallel_size = 4;  // 4 q heads over 2 kv heads: each kv head on 2 ranks
  auto four = decode::DecodeServer::Start(replicated);
  ASSERT_TRUE(four.ok()) << four.status().ToString();  // replicated kv heads (docs/parallel.md)
  (*four)->Shutdown();
  cluster::ClusterConfig three = cfg;
  three.parallel.tensor_parallel_size = 3;
  auto indivisible = prefill::PrefillServer::Start(three);
  ASSERT_EQ(indivisible.status().code(), StatusCode::kInvalidArgument) << indivisible.status().ToString();
  EXPECT_NE(indivisible.status().message().find("tensor_parallel_size 3"), std::string::npos);
  auto indivisible_decode = decode::DecodeServer::Start(three);
  ASSERT_EQ(indivisible_decode.status().code(), StatusCode::kInvalidArgument) << indivisible_decode.status().ToString();
  EXPECT_NE(indivisible_decode.status().message().find("3"), std::string::npos) << indivisible_decode.status().ToString();
}

TEST(ClusterKvDtype, DecodeWorkerRefusesPagesOfAnotherDtype) {
  // Prefill builds bf16 pages; the decode worker's pool is f32.
  auto c = LoopbackCluster::Start(ModelDir(), 1, 1, "tcp,sm,self", true, 0, 60000, "reference", "bf16");
  ASSERT_NE(c, nullptr);
  cluster::ClusterConfig cfg = c->config;
  cfg.cache.kv_dtype = "f32";
  auto decode = decode::DecodeServer::Start(cfg);
  ASSERT_TRUE(decode.ok()) << decode.status().ToString();
  cfg.router.decode.addresses = {(*decode)->address()};  // the bf16 prefill worker, the f32 decode worker
  auto router = router::RouterServer::Start(cfg);
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  Generated r = Generate((*router)->address(), Prompt(30, 3), 4, 0);
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("kv_dtype"), std::string::npos) << r.status.ToString();
  // Nothing stays allocated on the decode side.
  bool idle = false;
  for (int i = 0; i < 250 && !idle; ++i) {
    auto s = (*decode)->stats();
    idle = s.used_pages == 0 && s.active_sequences == 0 && s.committed_pages == 0;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(idle);
  (*router)->Shutdown();
  (*decode)->Shutdown();
}

}  // namespace
}  // namespace icecache::testing
