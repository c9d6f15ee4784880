// End to end through a loopback cluster: router -> prefill worker -> UCX -> decode workers.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "model/dense_kv_cache.h"
#include "model/generator.h"
#include "model/model.h"
#include "model/random_checkpoint.h"
#include "model/tokenizer/tokenizer.h"
#include "icecache/v1/generation.grpc.pb.h"
#include "client/client.h"
#include "router/worker_pool.h"
#include "serving/grpc_util.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "tests/cluster/cluster_fixture.h"

namespace icecache::testing {
namespace {

using router::RemoteChunk;
using router::RemoteGenerateOptions;

std::vector<int32_t> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 300);  // below the special ids
  return ids;
}

struct Result {
  Status status;
  std::vector<int32_t> tokens;
  std::string text;
  RemoteChunk last;
  std::string decode_worker;
};

Result Generate(const std::string& router, RemoteGenerateOptions o) {
  o.router = router;
  Result r;
  r.status = router::RunRemoteGenerate(o, [&](const RemoteChunk& c) {
    r.tokens.insert(r.tokens.end(), c.token_ids.begin(), c.token_ids.end());
    r.text += c.text;
    if (!c.decode_worker.empty()) r.decode_worker = c.decode_worker;
    if (c.last) r.last = c;
    return true;
  });
  return r;
}

// Greedy tokens from the engine in one process (dense KV cache, same page size).

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/icecache_cluster_model");
    cluster_ = LoopbackCluster::Start(*dir_, 1, 2, "tcp,sm,self").release();
    ASSERT_NE(cluster_, nullptr);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static std::string RouterAddress() { return cluster_->router->address(); }

  // Waits until every decode worker holds no pages and no sequences.
  static bool DecodeWorkersIdle(double seconds) {
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      bool idle = true;
      for (auto& d : cluster_->decode) {
        auto s = d->stats();
        idle = idle && s.used_pages == 0 && s.active_sequences == 0 && s.committed_pages == 0;
      }
      if (idle) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static std::string* dir_;
  static LoopbackCluster* cluster_;
};
std::string* ClusterTest::dir_ = nullptr;
LoopbackCluster* ClusterTest::cluster_ = nullptr;

TEST_F(ClusterTest, FullBudgetMatchesSingleProcessGreedy) {
  for (int n : {1, 7, 61}) {
    std::vector<int32_t> prompt = Prompt(n, 100 + n);
    RemoteGenerateOptions o;
    o.prompt_ids = prompt;
    o.max_tokens = 20;
    o.ignore_eos = true;
    o.budget_pages = 0;  // full
    Result r = Generate(RouterAddress(), o);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(r.tokens, SingleProcessGreedy(*dir_, prompt, 20)) << "prompt length " << n;
    EXPECT_EQ(r.last.finish_reason, "length");
    EXPECT_EQ(r.last.prompt_tokens, n);
    EXPECT_EQ(r.last.completion_tokens, 20);
    EXPECT_EQ(r.last.pages_fetched, 0);  // no sparse layers with full attention
  }
  EXPECT_TRUE(DecodeWorkersIdle(5));
}

TEST_F(ClusterTest, BudgetLargerThanSequenceIsExact) {
  // 40 tokens = 10 pages of 4 per head; a budget of 200 pages selects every tree leaf.
  std::vector<int32_t> prompt = Prompt(40, 5);
  RemoteGenerateOptions o;
  o.prompt_ids = prompt;
  o.max_tokens = 12;
  o.ignore_eos = true;
  o.budget_pages = 200;
  Result r = Generate(RouterAddress(), o);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.tokens, SingleProcessGreedy(*dir_, prompt, 12));
  EXPECT_GT(r.last.pages_fetched, 0);
}

TEST_F(ClusterTest, SparseBudgetGenerationCompletes) {
  std::vector<int32_t> prompt = Prompt(400, 9);  // 100 pages per head, budget 6
  RemoteGenerateOptions o;
  o.prompt_ids = prompt;
  o.max_tokens = 24;  // crosses window pages: the window's oldest page moves into the tree
  o.ignore_eos = true;
  o.budget_pages = 6;
  Result r = Generate(RouterAddress(), o);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.tokens.size(), 24u);
  EXPECT_EQ(r.last.completion_tokens, 24);
  // 2 sparse layers x 2 kv heads x 23 decode steps, at most 6 pages each, and more than sink+window.
  EXPECT_LE(r.last.pages_fetched, 2 * 2 * 23 * 6);
  EXPECT_GT(r.last.pages_fetched, 2 * 2 * 23 * 3);
  EXPECT_GT(r.last.transfer_bytes, 0);
  for (int32_t t : r.tokens) EXPECT_TRUE(t >= 0 && t < 320);
  EXPECT_TRUE(DecodeWorkersIdle(5));
}

TEST_F(ClusterTest, TextPromptStreamsText) {
  RemoteGenerateOptions o;
  o.prompt = "hello world, this is a test";
  o.max_tokens = 10;
  o.ignore_eos = true;
  Result r = Generate(RouterAddress(), o);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.tokens.size(), 10u);
  EXPECT_GT(r.last.prompt_tokens, 1);
}

TEST_F(ClusterTest, ConcurrentStreamsCompleteAndShareTheDecodeWorkers) {
  constexpr int kStreams = 16;
  std::vector<Result> results(kStreams);
  std::vector<int> max_tokens(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    max_tokens[i] = 4 + (i * 7) % 17;
    threads.emplace_back([&, i] {
      RemoteGenerateOptions o;
      o.prompt_ids = Prompt(3 + (i * 37) % 250, 1000 + i);
      o.max_tokens = max_tokens[i];
      o.ignore_eos = true;
      o.budget_pages = (i % 2) ? 0 : 6;
      results[i] = Generate(RouterAddress(), o);
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::string> workers;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.ToString();
    EXPECT_EQ(static_cast<int>(results[i].tokens.size()), max_tokens[i]) << i;
    workers.insert(results[i].decode_worker);
  }
  EXPECT_EQ(workers.size(), 2u) << "both decode workers should have served streams";
  EXPECT_TRUE(DecodeWorkersIdle(5));
}

TEST_F(ClusterTest, CancelMidStreamFreesPages) {
  RemoteGenerateOptions o;
  o.prompt_ids = Prompt(120, 77);
  o.max_tokens = 4000;
  o.ignore_eos = true;
  o.router = RouterAddress();
  int chunks = 0;
  bool saw_pages = false;
  Status s = router::RunRemoteGenerate(o, [&](const RemoteChunk& c) {
    if (++chunks == 3) {
      for (auto& d : cluster_->decode) saw_pages = saw_pages || d->stats().used_pages > 0;
    }
    return chunks < 5;  // cancel after a few chunks
  });
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  EXPECT_TRUE(saw_pages);
  EXPECT_TRUE(DecodeWorkersIdle(10)) << "pool accounting did not return to zero after the cancel";
}

TEST_F(ClusterTest, DeadlinePropagates) {
  RemoteGenerateOptions o;
  o.prompt_ids = Prompt(30, 3);
  o.max_tokens = 4000;
  o.ignore_eos = true;
  o.timeout_seconds = 0.5;
  Result r = Generate(RouterAddress(), o);
  EXPECT_EQ(r.status.code(), StatusCode::kDeadlineExceeded) << r.status.ToString();
  EXPECT_TRUE(DecodeWorkersIdle(10));
}

TEST_F(ClusterTest, BadRequestsGetInvalidArgument) {
  auto expect_invalid = [&](RemoteGenerateOptions o, const std::string& needle) {
    Result r = Generate(RouterAddress(), o);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.ToString();
    EXPECT_NE(r.status.message().find(needle), std::string::npos) << r.status.message();
  };
  RemoteGenerateOptions o;
  o.prompt_ids = {};
  expect_invalid(o, "empty");
  o.prompt = "";
  expect_invalid(o, "empty");
  o = RemoteGenerateOptions{};
  o.prompt_ids = {1, 2, 3};
  o.max_tokens = 0;
  expect_invalid(o, "max_tokens");
  o.max_tokens = 5000;
  expect_invalid(o, "max_tokens");
  o.max_tokens = 4;
  o.prompt_ids = {1, 320, 3};
  expect_invalid(o, "token_ids[1] = 320");
  o.prompt_ids = {1, -1};
  expect_invalid(o, "outside the vocabulary");
  o.prompt_ids = {1, 2};
  o.budget_pages = 3;  // sink 1 + window 2 + at least 1 retrieved
  expect_invalid(o, "budget_pages");
  o.budget_pages = -1;
  o.temperature = -1;
  expect_invalid(o, "temperature");
}

// Penalties, logprobs and n over the gRPC API, against the engine in one process with the same
// sampling parameters: greedy with full attention is exact (f32 KV), so the tokens must be equal
// and the logprobs equal within 1e-4 (the same fp32 logits; the bound allows for summation order).
TEST_F(ClusterTest, PenaltiesLogprobsAndChoicesOverGrpcMatchSingleProcess) {
  const std::vector<int32_t> prompt = Prompt(9, 7);
  v1::GenerateRequest req;
  req.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  req.set_max_tokens(12);
  req.set_ignore_eos(true);
  req.mutable_cache()->set_full(true);
  req.set_n(2);
  auto* sp = req.mutable_sampling();
  sp->set_frequency_penalty(0.8f);
  sp->set_presence_penalty(0.3f);
  sp->set_logprobs(true);
  sp->set_top_logprobs(3);
  auto stub = v1::Generation::NewStub(cluster::MakeChannel(RouterAddress()));
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, std::vector<v1::TokenLogprob>> logprobs;
  std::map<int, int> finished;
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
    ASSERT_EQ(r.logprobs_size(), r.token_ids_size());
    tokens[r.index()].insert(tokens[r.index()].end(), r.token_ids().begin(), r.token_ids().end());
    logprobs[r.index()].insert(logprobs[r.index()].end(), r.logprobs().begin(), r.logprobs().end());
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      ++finished[r.index()];
      EXPECT_EQ(r.usage().completion_tokens(), 12);
    }
  }
  grpc::Status st = reader->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(finished, (std::map<int, int>{{0, 1}, {1, 1}}));

  auto m = model::Model::Load(*dir_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  model::DenseKvCacheOptions o;
  o.page_size = 4;
  model::DenseKvCache cache((*m)->attention_shape(), o);
  model::Generator gen(**m, cache);
  model::SamplingParams p;
  p.max_tokens = 12;
  p.ignore_eos = true;
  p.frequency_penalty = 0.8f;
  p.presence_penalty = 0.3f;
  p.logprobs = 3;
  ASSERT_TRUE(gen.Add(prompt, p).ok());
  std::vector<int32_t> want;
  std::vector<model::TokenLogprobs> want_lp;
  while (!gen.idle()) {
    std::vector<model::GenerationEvent> ev;
    ASSERT_TRUE(gen.Step(&ev).ok());
    for (auto& e : ev) {
      want.push_back(e.token);
      want_lp.push_back(*e.logprobs);
    }
  }
  // The penalties matter here: without them the greedy run differs.
  EXPECT_NE(want, SingleProcessGreedy(*dir_, prompt, 12));
  for (int i : {0, 1}) {
    ASSERT_EQ(tokens[i], want) << "choice " << i;
    ASSERT_EQ(logprobs[i].size(), want_lp.size());
    for (size_t t = 0; t < want_lp.size(); ++t) {
      EXPECT_NEAR(logprobs[i][t].logprob(), want_lp[t].logprob, 1e-4) << "choice " << i << " token " << t;
      ASSERT_EQ(logprobs[i][t].top_ids_size(), 3);
      for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(logprobs[i][t].top_ids(k), want_lp[t].top_ids[k]);
        EXPECT_NEAR(logprobs[i][t].top_logprobs(k), want_lp[t].top_logprobs[k], 1e-4);
      }
    }
  }
  // Out of range: INVALID_ARGUMENT naming the field.
  for (auto [field, mutate] : std::vector<std::pair<std::string, std::function<void(v1::GenerateRequest&)>>>{
           {"presence_penalty", [](v1::GenerateRequest& q) { q.mutable_sampling()->set_presence_penalty(2.5f); }},
           {"frequency_penalty", [](v1::GenerateRequest& q) { q.mutable_sampling()->set_frequency_penalty(-3.f); }},
           {"top_logprobs", [](v1::GenerateRequest& q) { q.mutable_sampling()->set_top_logprobs(21); }},
           {"n = 17", [](v1::GenerateRequest& q) { q.set_n(17); }}}) {
    v1::GenerateRequest bad = req;
    mutate(bad);
    grpc::ClientContext c;
    auto rd = stub->Generate(&c, bad);
    while (rd->Read(&r)) {
    }
    grpc::Status s = rd->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_NE(s.error_message().find(field), std::string::npos) << s.error_message();
  }
  EXPECT_TRUE(DecodeWorkersIdle(5));
}

TEST_F(ClusterTest, EveryServerIsHealthy) {
  EXPECT_TRUE(router::CheckHealth(RouterAddress(), "", 5).ok());
  EXPECT_TRUE(router::CheckHealth(RouterAddress(), "icecache.v1.Generation", 5).ok());
  EXPECT_TRUE(router::CheckHealth(cluster_->prefill[0]->address(), "icecache.v1.PrefillWorker", 5).ok());
  for (auto& d : cluster_->decode) EXPECT_TRUE(router::CheckHealth(d->address(), "", 5).ok());
  EXPECT_FALSE(router::CheckHealth(RouterAddress(), "no.such.Service", 5).ok());
}

TEST(ClusterNoTokenizer, TextToModelWithoutTokenizerIsRejected) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_notok", 1, 1, "tcp",
                                  /*with_tokenizer=*/false);
  ASSERT_NE(c, nullptr);
  RemoteGenerateOptions o;
  o.prompt = "hello";
  Result r = Generate(c->router->address(), o);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("no tokenizer"), std::string::npos) << r.status.message();
  // Token ids work, here over UCX tcp alone.
  o.prompt.reset();
  o.prompt_ids = Prompt(50, 1);
  o.max_tokens = 8;
  o.ignore_eos = true;
  o.budget_pages = 5;
  r = Generate(c->router->address(), o);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.tokens.size(), 8u);
}

// Chat over the gRPC API: the router formats GenerateRequest.messages with the model's chat
// template and tokenizes without an extra bos; a model without a template is FAILED_PRECONDITION.
TEST_F(ClusterTest, ChatToModelWithoutTemplateIsFailedPrecondition) {
  RemoteGenerateOptions o;
  o.prompt = "hello";
  o.chat = true;
  Result r = Generate(RouterAddress(), o);
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition) << r.status.ToString();
  EXPECT_NE(r.status.message().find("chat template"), std::string::npos) << r.status.message();
}

TEST(ClusterChat, MessagesAreFormattedWithTheChatTemplate) {
  const std::string dir = ::testing::TempDir() + "/icecache_cluster_model_chat";
  model::RandomModelSpec spec;
  spec.hidden = 64;
  spec.layers = 3;
  spec.vocab = 320;
  spec.dtype = kernels::DType::kF32;
  spec.seed = 11;
  spec.chat_template = true;
  ASSERT_TRUE(model::EnsureRandomCheckpoint(dir, spec).ok());
  auto c = LoopbackCluster::Start(dir, 1, 1, "tcp,sm,self");
  ASSERT_NE(c, nullptr);
  auto tok = tokenizer::Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  ASSERT_EQ((*tok)->chat_format(), tokenizer::ChatFormat::kChatMl);
  auto text = (*tok)->ApplyChatTemplate({{"user", "What is a cache?"}}, /*add_generation_prompt=*/true);
  ASSERT_TRUE(text.ok());
  auto ids = (*tok)->Encode(*text, /*add_special_tokens=*/false);
  ASSERT_TRUE(ids.ok());

  RemoteGenerateOptions o;
  o.prompt = "What is a cache?";
  o.chat = true;
  o.max_tokens = 8;
  o.ignore_eos = true;
  o.budget_pages = 0;  // full: exact, so the two requests below must agree token for token
  Result chat = Generate(c->router->address(), o);
  ASSERT_TRUE(chat.status.ok()) << chat.status.ToString();
  EXPECT_EQ(chat.last.prompt_tokens, static_cast<int>(ids->size()));
  // The same ids sent as a token prompt give the same tokens.
  RemoteGenerateOptions by_ids = o;
  by_ids.prompt.reset();
  by_ids.chat = false;
  by_ids.prompt_ids = *ids;
  Result same = Generate(c->router->address(), by_ids);
  ASSERT_TRUE(same.status.ok()) << same.status.ToString();
  EXPECT_EQ(same.tokens, chat.tokens);
  EXPECT_EQ(chat.tokens.size(), 8u);

  // Bad messages are INVALID_ARGUMENT naming the field, checked before tokenizing.
  auto stub = v1::Generation::NewStub(cluster::MakeChannel(c->router->address()));
  auto call = [&](const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse ignored;
    while (reader->Read(&ignored)) {
    }
    return reader->Finish();
  };
  v1::GenerateRequest req;
  req.set_max_tokens(4);
  req.mutable_messages();
  grpc::Status s = call(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("messages is empty"), std::string::npos) << s.error_message();
  auto* m = req.mutable_messages()->add_messages();
  m->set_role("tool");
  m->set_content("x");
  s = call(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("messages[0].role"), std::string::npos) << s.error_message();
  m->set_role("user");
  m->set_content(std::string("\xff", 1));
  s = call(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("messages[0].content is not valid UTF-8"), std::string::npos) << s.error_message();
}

// A GGUF checkpoint served by the whole cluster: the router reads its config and tokenizer from
// the GGUF metadata (model::LoadModelInfo), the workers load it like Model::Load does.
TEST(ClusterGguf, ServesAGgufFileWithExactFullAttention) {
  const std::string gguf = std::string(ICECACHE_SOURCE_DIR) + "/tests/fixtures/gguf/tiny_llama.gguf";
  auto c = LoopbackCluster::Start(gguf, 1, 1, "tcp,sm,self");
  ASSERT_NE(c, nullptr);
  const std::vector<int32_t> prompt = Prompt(23, 5);
  RemoteGenerateOptions o;
  o.prompt_ids = prompt;
  o.max_tokens = 12;
  o.ignore_eos = true;
  o.budget_pages = 0;  // full
  Result r = Generate(c->router->address(), o);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.tokens, SingleProcessGreedy(gguf, prompt, 12));
}

TEST(ClusterUnavailable, NoReachableDecodeWorker) {
  cluster::ClusterConfig cfg;
  std::string dir = ::testing::TempDir() + "/icecache_cluster_model_unavail";
  model::RandomModelSpec spec;
  spec.layers = 2;
  spec.vocab = 300;
  ASSERT_TRUE(model::WriteRandomCheckpoint(dir, spec).ok());
  cfg.model.dir = dir;
  cfg.router.listen = "127.0.0.1:0";
  cfg.router.prefill.addresses = {"127.0.0.1:1"};
  cfg.router.decode.addresses = {"127.0.0.1:1"};
  cfg.router.retry_wait_seconds = 0.5;  // the retry policy's wait for a worker that never comes
  auto r = router::RouterServer::Start(cfg);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Without any worker answering, the router does not report SERVING.
  EXPECT_FALSE(router::CheckHealth((*r)->address(), "", 5).ok());
  RemoteGenerateOptions o;
  o.prompt_ids = {1, 2, 3};
  o.max_tokens = 2;
  Result res = Generate((*r)->address(), o);
  EXPECT_EQ(res.status.code(), StatusCode::kUnavailable) << res.status.ToString();
  EXPECT_NE(res.status.message().find("no decode worker became ready within 0.5 s"), std::string::npos)
      << res.status.ToString();
}

}  // namespace
}  // namespace icecache::testing

namespace icecache::testing {
namespace {

TEST(ClusterDns, ResolvesEveryAddressOfAName) {
  auto all = router::ResolveAll("localhost:4321");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_NE(std::find(all->begin(), all->end(), "127.0.0.1:4321"), all->end());
  EXPECT_FALSE(router::ResolveAll("no-such-host.invalid:1").ok());
  EXPECT_FALSE(router::ResolveAll("missing-port").ok());
}

TEST(ClusterDns, RouterFindsWorkersThroughDns) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_dns", 1, 1, "tcp,sm,self");
  ASSERT_NE(c, nullptr);
  // A second router that knows the workers only by DNS name ("localhost" resolves to 127.0.0.1,
  // and maybe ::1, where nothing listens: that address is reported unhealthy and ranked last).
  cluster::ClusterConfig cfg = c->config;
  cfg.router.prefill.addresses.clear();
  cfg.router.decode.addresses.clear();
  cfg.router.prefill.dns = "localhost:" + std::to_string(c->prefill[0]->port());
  cfg.router.decode.dns = "localhost:" + std::to_string(c->decode[0]->port());
  cfg.router.dns_refresh_seconds = 0.2;
  auto r = router::RouterServer::Start(cfg);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  RemoteGenerateOptions o;
  o.prompt_ids = Prompt(20, 4);
  o.max_tokens = 5;
  o.ignore_eos = true;
  Result res = Generate((*r)->address(), o);
  ASSERT_TRUE(res.status.ok()) << res.status.ToString();
  EXPECT_EQ(res.tokens.size(), 5u);
  EXPECT_EQ(res.decode_worker, "127.0.0.1:" + std::to_string(c->decode[0]->port()));
}

}  // namespace
}  // namespace icecache::testing

namespace icecache::testing {
namespace {

TEST(ClusterCapacity, RequestLargerThanThePoolIsResourceExhausted) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_small", 1, 1, "tcp,sm,self", true, 0,
                                  /*pool_pages=*/300);
  ASSERT_NE(c, nullptr);
  RemoteGenerateOptions o;
  o.prompt_ids = Prompt(600, 2);  // 150 pages of 4 tokens per (layer, kv head): far more than 300 in all
  o.max_tokens = 4;
  Result r = Generate(c->router->address(), o);
  EXPECT_EQ(r.status.code(), StatusCode::kResourceExhausted) << r.status.ToString();
  EXPECT_NE(r.status.message().find("KV pool cannot hold"), std::string::npos) << r.status.message();
  // A small request still fits.
  o.prompt_ids = Prompt(8, 2);
  r = Generate(c->router->address(), o);
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
}

}  // namespace
}  // namespace icecache::testing

namespace icecache::testing {
namespace {

// The non-reference presets' trees (tuned; flat adds cell summaries to the wire and caps a GQA
// group's cells) through the whole cluster: a sparse budget completes, and a budget larger than
// the sequence selects every leaf, which must give exactly the single-process greedy tokens.
class ClusterPresetTrees : public ::testing::TestWithParam<std::string> {};

TEST_P(ClusterPresetTrees, SparseGenerationAndExactWhenTheBudgetCoversEverything) {
  const std::string dir = ::testing::TempDir() + "/icecache_cluster_model_" + GetParam();
  auto c = LoopbackCluster::Start(dir, 1, 1, "tcp,sm,self", true, 0, 60000, GetParam());
  ASSERT_NE(c, nullptr);
  RemoteGenerateOptions o;
  o.prompt_ids = Prompt(300, 12);
  o.max_tokens = 12;
  o.ignore_eos = true;
  o.budget_pages = 6;
  Result r = Generate(c->router->address(), o);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.tokens.size(), 12u);
  EXPECT_GT(r.last.pages_fetched, 0);

  o.budget_pages = 200;  // 300 + 12 tokens = 78 pages of 4 per head
  r = Generate(c->router->address(), o);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.tokens, SingleProcessGreedy(dir, o.prompt_ids, 12));
}

INSTANTIATE_TEST_SUITE_P(Presets, ClusterPresetTrees, ::testing::Values("tuned", "flat"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// A config built in code (not parsed from YAML, which checks the name) with an unknown preset:
// the prefill worker refuses to start, naming the key, instead of silently using another preset.
TEST(ClusterPresetName, PrefillWorkerRefusesAnUnknownPreset) {
  cluster::ClusterConfig cfg;
  cfg.model.dir = ::testing::TempDir() + "/icecache_no_model_needed";
  cfg.cache.dci_preset = "fast";
  auto p = prefill::PrefillServer::Start(cfg);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("cache.dci_preset"), std::string::npos) << p.status().ToString();
  EXPECT_NE(p.status().message().find("reference, tuned or flat"), std::string::npos) << p.status().ToString();
  // Likewise a tree parameter out of range (the YAML parser would have refused it).
  cfg.cache.dci_preset = "tuned";
  cfg.cache.dci_group_fov = 100;
  p = prefill::PrefillServer::Start(cfg);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("group_fov"), std::string::npos) << p.status().ToString();
}

}  // namespace
}  // namespace icecache::testing

namespace icecache::testing {
namespace {

// A sequence whose KV never arrives (no prefill ever ships it): the decode worker gives up at the
// transfer deadline and frees everything it had reserved.
TEST(ClusterStall, KvThatNeverArrivesTimesOutAndFreesTheReservation) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_stall", 1, 1, "tcp,sm,self");
  ASSERT_NE(c, nullptr);
  auto stub = v1::DecodeWorker::NewStub(cluster::MakeChannel(c->decode[0]->address()));
  v1::ReserveRequest rr;
  rr.set_prompt_tokens(100);
  rr.set_max_tokens(10);
  rr.mutable_cache()->set_budget_pages(6);
  v1::ReserveResponse reserved;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Reserve(&ctx, rr, &reserved).ok());
  }
  EXPECT_GT(c->decode[0]->stats().committed_pages, 0);
  v1::DecodeRequest dr;
  dr.set_sequence_id(reserved.sequence_id());
  dr.set_reservation_token(reserved.reservation_token());
  dr.set_first_token(1);
  dr.set_max_tokens(10);
  dr.set_kv_wait_seconds(0.2);
  grpc::ClientContext ctx;
  auto reader = stub->Decode(&ctx, dr);
  v1::DecodeResponse resp;
  EXPECT_FALSE(reader->Read(&resp));
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_NE(s.error_message().find("end not announced"), std::string::npos) << s.error_message();
  auto stats = c->decode[0]->stats();
  EXPECT_EQ(stats.committed_pages, 0);
  EXPECT_EQ(stats.used_pages, 0);
  EXPECT_EQ(stats.active_sequences, 0);
}

}  // namespace
}  // namespace icecache::testing
