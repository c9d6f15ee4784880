// Decode-worker failure on a cluster of real processes (icecache-router, icecache-prefill and
// icecache-decode, fork/exec'd on loopback): kill -9 of a decode worker mid-stream migrates its
// streams to another prefill/decode pair with exactly the tokens of an uninterrupted greedy run;
// with no decode worker left they end with UNAVAILABLE once router.retry_wait_seconds has passed,
// and a decode or prefill worker restarted within that wait carries them on (the retry policy);
// a client's cancel ends that wait; SIGTERM drains a decode worker (its streams finish there),
// and a drain that outlasts decode.drain_seconds hands the rest over by migration.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "icecache/v1/generation.grpc.pb.h"
#include "model/random_checkpoint.h"
#include "tests/cluster/free_ports.h"
#include "serving/grpc_util.h"
#include "tests/cluster/process_util.h"
#include "tests/sanitizers.h"

namespace icecache::testing {
namespace {

const std::string kBin = std::string(ICECACHE_BINARY_DIR) + "/bin/";

// model::FailureTestModelSpec: a stream is still running when the test kills its worker.
std::string ModelDir() {
  const std::string dir = ::testing::TempDir() + "/icecache_migration_model";
  EXPECT_TRUE(model::EnsureRandomCheckpoint(dir, model::FailureTestModelSpec()).ok());
  return dir;
}

struct Process {
  std::string name;
  std::string address;
  pid_t pid = -1;
  std::vector<std::string> args;  // to start it again
  std::string log;
};

// 1 prefill + `num_decode` decode workers + a router as separate processes on loopback.
class ProcessCluster {
 public:
  ProcessCluster(int num_decode, const std::vector<std::string>& decode_sets,
                 const std::vector<std::string>& router_sets = {}) {
    const int base = testing::FreePortRange(3 + num_decode, 0x5eed + num_decode);
    EXPECT_GT(base, 0);
    model_ = ModelDir();
    log_dir_ = ::testing::TempDir() + "/icecache_migration_logs." + std::to_string(getpid());
    std::filesystem::create_directories(log_dir_);
    const std::vector<std::string> common = {"--model", model_, "--set", "cache.kv_dtype=f32", "--set",
                                             "cache.page_size=4", "--set", "ucx.net_devices=lo", "--set",
                                             "ucx.transfer_timeout_seconds=20"};
    auto start = [&](const std::string& binary, const std::string& name, int port,
                     std::vector<std::string> extra) {
      Process p;
      p.name = name;
      p.address = "127.0.0.1:" + std::to_string(port);
      std::vector<std::string> args = {kBin + binary, "--listen", p.address};
      args.insert(args.end(), common.begin(), common.end());
      args.insert(args.end(), extra.begin(), extra.end());
      p.args = args;
      p.log = log_dir_ + "/" + name + ".log";
      p.pid = Spawn(args, p.log);
      return p;
    };
    prefill_ = start("icecache-prefill", "prefill", base + 1, {"--set", "prefill.threads=1"});
    std::string decode_list;
    for (int i = 0; i < num_decode; ++i) {
      std::vector<std::string> extra = {"--set", "decode.threads=1", "--set", "decode.pool_pages=20000"};
      extra.insert(extra.end(), decode_sets.begin(), decode_sets.end());
      decode_.push_back(start("icecache-decode", "decode" + std::to_string(i), base + 2 + i, extra));
      decode_list += (i ? "," : "") + decode_.back().address;
    }
    metrics_port_ = base + 2 + num_decode;
    std::vector<std::string> router_args = {"--metrics-port", std::to_string(metrics_port_), "--set",
                                            "router.prefill.addresses=" + prefill_.address, "--set",
                                            "router.decode.addresses=" + decode_list, "--set",
                                            "router.stats_refresh_seconds=0.1", "--set",
                                            "router.kv_transfer_timeout_seconds=20"};
    for (const auto& kv : router_sets) {
      router_args.push_back("--set");
      router_args.push_back(kv);
    }
    router_ = start("icecache-router", "router", base, router_args);
  }

  ~ProcessCluster() {
    for (Process* p : all()) {
      if (p->pid > 0) kill(p->pid, SIGKILL);
    }
    for (Process* p : all()) {
      if (p->pid > 0) WaitExit(p->pid);
    }
    std::error_code ignored;
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(log_dir_, ignored);  // kept for a failure
  }

  // Every process answers its health check (the router's needs its workers).
  bool WaitHealthy() {
    for (int i = 0; i < 600; ++i) {  // up to 60 s on a loaded machine
      if (router::CheckHealth(router_.address, "", 1).ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // kill -9 `p` (if it runs) and start it again on its port, its log going on in "<name>.N.log".
  void Restart(Process* p) {
    if (p->pid > 0) {
      kill(p->pid, SIGKILL);
      WaitExit(p->pid);
    }
    p->pid = Spawn(p->args, p->log + "." + std::to_string(++restarts_) + ".log");
  }
  Process* prefill() { return &prefill_; }

  std::vector<Process*> all() {
    std::vector<Process*> v = {&router_, &prefill_};
    for (auto& d : decode_) v.push_back(&d);
    return v;
  }
  Process* decode_at(const std::string& address) {
    for (auto& d : decode_) {
      if (d.address == address) return &d;
    }
    return nullptr;
  }
  const std::string& router_address() const { return router_.address; }
  double Metric(const std::string& name) const { return MetricValue(Scrape(metrics_port_), name); }
  std::string logs() const {
    std::string out;
    for (const auto& e : std::filesystem::directory_iterator(log_dir_)) {
      std::string cmd = "tail -n 15 " + e.path().string();
      FILE* f = popen(cmd.c_str(), "r");
      char buf[4096];
      size_t n;
      out += "---- " + e.path().filename().string() + "\n";
      while (f && (n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
      if (f) pclose(f);
    }
    return out;
  }

 private:
  std::string model_, log_dir_;
  Process router_, prefill_;
  std::vector<Process> decode_;
  int metrics_port_ = 0;
  int restarts_ = 0;
};

struct StreamResult {
  std::vector<int32_t> tokens;
  std::string decode_worker;  // where it started
  std::string finish_reason;
  int completion_tokens = 0;
  Status status;
};

std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> p;
  for (int k = 0; k < 9 + 3 * i; ++k) p.push_back((17 + 31 * k + 7 * i) % 300 + 1);
  return p;
}

router::RemoteGenerateOptions Options(const std::string& router, int i, int max_tokens) {
  router::RemoteGenerateOptions o;
  o.router = router;
  o.prompt_ids = Prompt(i);
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  o.budget_pages = 0;  // full attention: migration is exact (see docs/cluster.md)
  o.timeout_seconds = sanitizer::kThread ? 900 : 120;  // TSan runs the processes 5-15x slower
  return o;
}

// Runs `n` streams at once; `on_token(stream, tokens so far, decode worker)` runs after each chunk.
std::vector<StreamResult> RunStreams(const std::string& router, int n, int max_tokens,
                                     const std::function<void(int, size_t, const std::string&)>& on_token = nullptr,
                                     const std::function<void(router::RemoteGenerateOptions&)>& tweak = nullptr) {
  std::vector<StreamResult> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto o = Options(router, i, max_tokens);
      if (tweak) tweak(o);
      StreamResult& r = results[i];
      r.status = router::RunRemoteGenerate(o, [&](const router::RemoteChunk& c) {
        if (!c.decode_worker.empty()) r.decode_worker = c.decode_worker;
        r.tokens.insert(r.tokens.end(), c.token_ids.begin(), c.token_ids.end());
        if (c.last) {
          r.finish_reason = c.finish_reason;
          r.completion_tokens = c.completion_tokens;
        }
        if (on_token) on_token(i, r.tokens.size(), r.decode_worker);
        return true;
      });
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

constexpr int kStreams = 4;
// Under TSan (processes 5-15x slower) shorter streams, the same checks: 400-token references
// ran past their deadline on a loaded 2-core machine.
constexpr int kMaxTokens = sanitizer::kThread ? 160 : 400;
constexpr size_t kKillAt = 40;  // tokens stream 0 has received when its decode worker is stopped

// The tokens of uninterrupted greedy runs of the same prompts on the same cluster.
std::vector<std::vector<int32_t>> Reference(const std::string& router) {
  std::vector<std::vector<int32_t>> ref;
  for (auto& r : RunStreams(router, kStreams, kMaxTokens)) {
    EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_EQ(r.tokens.size(), static_cast<size_t>(kMaxTokens));
    ref.push_back(r.tokens);
  }
  return ref;
}

// Stops (signal `sig`) the decode worker of stream 0 once it has received kKillAt tokens; returns
// the worker's address through `victim`.
std::function<void(int, size_t, const std::string&)> StopWorkerOfStream0(ProcessCluster& c, int sig,
                                                                          std::string* victim, size_t* tokens_then) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  return [&c, sig, victim, tokens_then, done](int stream, size_t tokens, const std::string& worker) {
    if (stream != 0 || tokens < kKillAt || done->load()) return;
    Process* p = c.decode_at(worker);
    if (p == nullptr) return;  // not known yet: the next chunk tries again
    if (done->exchange(true)) return;
    *victim = worker;
    *tokens_then = tokens;
    kill(p->pid, sig);
  };
}

TEST(ClusterMigration, KillNineMidStreamMigratesWithTheGreedyTokens) {
  ProcessCluster c(/*num_decode=*/2, {});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  const auto ref = Reference(c.router_address());
  ASSERT_EQ(ref.size(), static_cast<size_t>(kStreams));
  std::string victim;
  size_t tokens_then = 0;
  auto results = RunStreams(c.router_address(), kStreams, kMaxTokens,
                            StopWorkerOfStream0(c, SIGKILL, &victim, &tokens_then));
  ASSERT_FALSE(victim.empty()) << "the decode worker was never killed";
  EXPECT_LT(tokens_then, static_cast<size_t>(kMaxTokens)) << "killed after the stream ended: proves nothing";
  int on_victim = 0;
  for (int i = 0; i < kStreams; ++i) {
    const auto& r = results[i];
    EXPECT_TRUE(r.status.ok()) << "stream " << i << ": " << r.status.ToString() << "\n" << c.logs();
    EXPECT_EQ(r.tokens, ref[i]) << "stream " << i << " (started on " << r.decode_worker << ")";
    EXPECT_EQ(r.completion_tokens, kMaxTokens) << i;
    EXPECT_EQ(r.finish_reason, "length") << i;
    on_victim += r.decode_worker == victim;
  }
  EXPECT_GE(on_victim, 1);
  // Every stream that was on the killed worker moved once (streams that had ended did not).
  const double migrations = c.Metric("icecache_request_migrations_total");
  EXPECT_GE(migrations, 1);
  EXPECT_LE(migrations, on_victim);
  EXPECT_EQ(WaitExit(c.decode_at(victim)->pid), 128 + SIGKILL);
  c.decode_at(victim)->pid = -1;
  // The survivor serves new requests alone.
  auto after = RunStreams(c.router_address(), 1, 20);
  EXPECT_TRUE(after[0].status.ok()) << after[0].status.ToString();
  EXPECT_EQ(after[0].tokens, std::vector<int32_t>(ref[0].begin(), ref[0].begin() + 20));
}

// Seeded sampling: the migrated stream skips the random draws its tokens used (DecodeRequest
// sampler_draws_done), so it has its full length; its tokens equal the uninterrupted run's unless
// the recomputed logits move a draw across a candidate boundary (counted, not asserted).
TEST(ClusterMigration, SeededSamplingContinuesWithItsFullLength) {
  ProcessCluster c(/*num_decode=*/2, {});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  auto sampled = [](router::RemoteGenerateOptions& o) {
    o.temperature = 0.8f;
    o.seed = 1234 + o.prompt_ids.size();
  };
  auto ref = RunStreams(c.router_address(), kStreams, kMaxTokens, nullptr, sampled);
  std::string victim;
  size_t tokens_then = 0;
  auto results = RunStreams(c.router_address(), kStreams, kMaxTokens,
                            StopWorkerOfStream0(c, SIGKILL, &victim, &tokens_then), sampled);
  ASSERT_FALSE(victim.empty());
  int same = 0;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(ref[i].status.ok()) << ref[i].status.ToString();
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.ToString() << "\n" << c.logs();
    EXPECT_EQ(results[i].tokens.size(), static_cast<size_t>(kMaxTokens)) << i;
    // Up to the kill both runs drew the same tokens from the same seed.
    if (results[i].decode_worker == victim && i == 0) {
      EXPECT_TRUE(std::equal(ref[i].tokens.begin(), ref[i].tokens.begin() + static_cast<long>(tokens_then),
                             results[i].tokens.begin()));
    }
    same += results[i].tokens == ref[i].tokens;
  }
  std::printf("seeded streams identical to the uninterrupted run: %d of %d\n", same, kStreams);
}

// Greedy with a frequency penalty: the new decode worker counts the tokens generated before the
// move (DecodeRequest.prior_tokens), so the migrated streams equal the uninterrupted run.
TEST(ClusterMigration, PenaltiesCountTheTokensGeneratedBeforeTheMove) {
  ProcessCluster c(/*num_decode=*/2, {});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  auto penalised = [](router::RemoteGenerateOptions& o) {
    o.frequency_penalty = 0.7f;
    o.presence_penalty = 0.3f;
  };
  constexpr int kTokens = 120;
  auto ref = RunStreams(c.router_address(), kStreams, kTokens, nullptr, penalised);
  std::string victim;
  size_t tokens_then = 0;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(ref[i].status.ok()) << i << ": " << ref[i].status.ToString() << "\n" << c.logs();
    ASSERT_EQ(ref[i].tokens.size(), static_cast<size_t>(kTokens)) << i;
  }
  auto results = RunStreams(c.router_address(), kStreams, kTokens,
                            StopWorkerOfStream0(c, SIGKILL, &victim, &tokens_then), penalised);
  ASSERT_FALSE(victim.empty()) << "the decode worker was never killed: stream 0 ended with "
                               << results[0].tokens.size() << " tokens, " << results[0].status.ToString()
                               << " (worker '" << results[0].decode_worker << "')\n"
                               << c.logs();
  EXPECT_LT(tokens_then, static_cast<size_t>(kTokens)) << "killed after the stream ended: proves nothing";
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.ToString() << "\n" << c.logs();
    EXPECT_EQ(results[i].tokens, ref[i].tokens) << "stream " << i << " (started on " << results[i].decode_worker << ")";
  }
  EXPECT_GE(c.Metric("icecache_request_migrations_total"), 1);
}

// The only decode worker killed and not back within router.retry_wait_seconds (1 s here): its
// streams end with UNAVAILABLE saying so, after a prefix of the reference; once the worker is
// started again the router serves with it.
TEST(ClusterMigration, KillingTheOnlyDecodeWorkerEndsStreamsWithUnavailable) {
  ProcessCluster c(/*num_decode=*/1, {}, {"router.retry_wait_seconds=1"});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  const auto ref = Reference(c.router_address());
  std::string victim;
  size_t tokens_then = 0;
  auto results = RunStreams(c.router_address(), kStreams, kMaxTokens,
                            StopWorkerOfStream0(c, SIGKILL, &victim, &tokens_then));
  ASSERT_FALSE(victim.empty());
  for (int i = 0; i < kStreams; ++i) {
    const auto& r = results[i];
    if (r.status.ok()) {  // a stream that had ended before the kill
      EXPECT_EQ(r.tokens, ref[i]) << i;
      continue;
    }
    EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << i << ": " << r.status.ToString();
    // A stream that was decoding could not migrate; one whose KV was still being shipped (the
    // other streams on a slow machine, e.g. under ASan) could not be placed again. Both say why.
    const bool was_decoding = r.status.message().find("no other decode worker") != std::string::npos;
    const bool was_shipping = r.status.message().find("no decode worker took the retry") != std::string::npos;
    EXPECT_TRUE(was_decoding || was_shipping) << r.status.ToString();
    if (i == 0) {
      EXPECT_TRUE(was_decoding) << r.status.ToString();
    }
    EXPECT_NE(r.status.message().find("no decode worker became ready within 1 s (router.retry_wait_seconds)"),
              std::string::npos)
        << r.status.ToString();
    // What was sent before the end is the uninterrupted run's beginning: nothing wrong, nothing twice.
    ASSERT_LE(r.tokens.size(), ref[i].size());
    EXPECT_TRUE(std::equal(r.tokens.begin(), r.tokens.end(), ref[i].begin())) << i;
  }
  EXPECT_FALSE(results[0].status.ok()) << "stream 0 was running when its only decode worker was killed";
  EXPECT_EQ(c.Metric("icecache_request_migrations_total"), 0);
  // Back (a fresh process on the same port): served again, with the same greedy tokens.
  c.Restart(c.decode_at(victim));
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  auto after = RunStreams(c.router_address(), 1, 20);
  EXPECT_TRUE(after[0].status.ok()) << after[0].status.ToString() << "\n" << c.logs();
  EXPECT_EQ(after[0].tokens, std::vector<int32_t>(ref[0].begin(), ref[0].begin() + 20));
}

// The only decode worker killed mid-stream and started again 1.5 s later, within
// router.retry_wait_seconds: the streams wait for it and migrate onto the restarted process,
// with exactly the tokens of an uninterrupted greedy run.
TEST(ClusterRetryWait, OnlyDecodeWorkerRestartedWithinTheWaitCarriesTheStreamsOn) {
  ProcessCluster c(/*num_decode=*/1, {}, {"router.retry_wait_seconds=50"});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  const auto ref = Reference(c.router_address());
  std::thread restarter;
  std::atomic<bool> killed{false};
  size_t tokens_then = 0;
  auto results = RunStreams(c.router_address(), kStreams, kMaxTokens, [&](int stream, size_t tokens, const std::string&) {
    if (stream != 0 || tokens < kKillAt || killed.exchange(true)) return;
    tokens_then = tokens;
    Process* p = c.all()[2];
    kill(p->pid, SIGKILL);
    restarter = std::thread([&c, p] {
      WaitExit(p->pid);
      p->pid = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      c.Restart(p);
    });
  });
  ASSERT_TRUE(killed.load()) << "the decode worker was never killed";
  restarter.join();
  EXPECT_LT(tokens_then, static_cast<size_t>(kMaxTokens)) << "killed after the stream ended: proves nothing";
  for (int i = 0; i < kStreams; ++i) {
    const auto& r = results[i];
    EXPECT_TRUE(r.status.ok()) << "stream " << i << ": " << r.status.ToString() << "\n" << c.logs();
    EXPECT_EQ(r.tokens, ref[i]) << "stream " << i;
    EXPECT_EQ(r.completion_tokens, kMaxTokens) << i;
  }
  EXPECT_GE(c.Metric("icecache_request_migrations_total"), 1);
}

// The only prefill worker down when a request comes and started again 1.5 s later, within
// router.retry_wait_seconds: the request waits for it (a fresh reservation) and gets the greedy
// tokens.
TEST(ClusterRetryWait, OnlyPrefillWorkerRestartedWithinTheWaitServesTheRequest) {
  // The prefill path itself: with KV reuse the repeated prompt would not need the prefill worker.
  ProcessCluster c(/*num_decode=*/1, {}, {"router.retry_wait_seconds=50", "router.prefix_routing=false"});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  const auto ref = RunStreams(c.router_address(), 1, 30);
  ASSERT_TRUE(ref[0].status.ok()) << ref[0].status.ToString();
  Process* p = c.prefill();
  kill(p->pid, SIGKILL);
  WaitExit(p->pid);
  p->pid = -1;
  std::thread restarter([&c, p] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    c.Restart(p);
  });
  auto r = RunStreams(c.router_address(), 1, 30);
  restarter.join();
  EXPECT_TRUE(r[0].status.ok()) << r[0].status.ToString() << "\n" << c.logs();
  EXPECT_EQ(r[0].tokens, ref[0].tokens);
  EXPECT_GE(c.Metric("icecache_request_prefill_retries_total"), 1);
}

// A request waiting for a decode worker to come back (none is, router.retry_wait_seconds 120)
// ends as soon as its client cancels: CANCELLED, and the router no longer counts it waiting.
TEST(ClusterRetryWait, ClientCancelEndsTheWaitAtOnce) {
  ProcessCluster c(/*num_decode=*/1, {}, {"router.retry_wait_seconds=120"});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  Process* d = c.all()[2];
  kill(d->pid, SIGKILL);
  WaitExit(d->pid);
  d->pid = -1;
  auto stub = v1::Generation::NewStub(cluster::MakeChannel(c.router_address()));
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  for (int32_t t : Prompt(0)) req.mutable_token_ids()->add_ids(t);
  req.set_max_tokens(20);
  req.mutable_cache()->set_full(true);
  auto reader = stub->Generate(&ctx, req);
  auto poll = [&](double want) {
    double v = -1;
    for (int i = 0; i < 200 && v != want; ++i) {  // up to 20 s
      v = c.Metric("icecache_requests_waiting");
      if (v != want) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return v;
  };
  EXPECT_EQ(poll(1), 1) << "the request never waited";
  ctx.TryCancel();
  v1::GenerateResponse ignored;
  EXPECT_FALSE(reader->Read(&ignored));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Well within the 120 s wait: the cancel ended it.
  EXPECT_EQ(poll(0), 0) << c.logs();
}

TEST(ClusterMigration, SigtermDrainLetsStreamsFinishOnTheirWorker) {
  // A grace period longer than the streams take, also under TSan (the default 30 s is not: the
  // drain then ends them and they migrate, which the next case checks on purpose).
  ProcessCluster c(/*num_decode=*/2, {"--set", "decode.drain_seconds=600"});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  const auto ref = Reference(c.router_address());
  std::string victim;
  size_t tokens_then = 0;
  auto results = RunStreams(c.router_address(), kStreams, kMaxTokens,
                            StopWorkerOfStream0(c, SIGTERM, &victim, &tokens_then));
  ASSERT_FALSE(victim.empty());
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.ToString() << "\n" << c.logs();
    EXPECT_EQ(results[i].tokens, ref[i]) << i;
  }
  // The drained worker finished its streams itself (none moved), then exited cleanly.
  EXPECT_EQ(c.Metric("icecache_request_migrations_total"), 0);
  EXPECT_EQ(WaitExit(c.decode_at(victim)->pid), 0);
  c.decode_at(victim)->pid = -1;
}

TEST(ClusterMigration, DrainPastItsGracePeriodHandsStreamsOverByMigration) {
  ProcessCluster c(/*num_decode=*/2, {"--set", "decode.drain_seconds=0.05"});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  const auto ref = Reference(c.router_address());
  std::string victim;
  size_t tokens_then = 0;
  auto results = RunStreams(c.router_address(), kStreams, kMaxTokens,
                            StopWorkerOfStream0(c, SIGTERM, &victim, &tokens_then));
  ASSERT_FALSE(victim.empty());
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.ToString() << "\n" << c.logs();
    EXPECT_EQ(results[i].tokens, ref[i]) << i;
  }
  EXPECT_GE(c.Metric("icecache_request_migrations_total"), 1) << c.logs();
  EXPECT_EQ(WaitExit(c.decode_at(victim)->pid), 0);
  c.decode_at(victim)->pid = -1;
}

}  // namespace
}  // namespace icecache::testing
