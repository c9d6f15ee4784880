// `icecache cluster`'s own supervision (tools/cli/cluster_command.cc), on real processes: the
// launcher is started as a user starts it, its workers are killed with kill -9 under load, and
// the test checks what a user sees: every request ends with the tokens of an uninterrupted greedy
// run (budget full) or a status with a message, none hangs, the killed worker is restarted on its
// port and serves again (its icecache_worker_restarts_total says so), the decode pools return to
// zero, and the router counts the time the worker was down. A prefill worker killed mid-shipment
// (the test hook ICECACHE_TEST_PREFILL_STALL_AFTER_SEGMENTS, taken by one process only through
// ICECACHE_TEST_PREFILL_STALL_ONCE_FILE) has its prompt prefilled again once it is back. A worker
// killed again and again is given up while the rest keep serving; the router's death stops the
// launcher with exit 1.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "model/random_checkpoint.h"
#include "serving/grpc_util.h"
#include "tests/cluster/free_ports.h"
#include "tests/cluster/process_util.h"
#include "tests/sanitizers.h"

namespace icecache::testing {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kBin = std::string(ICECACHE_BINARY_DIR) + "/bin/";
const double kSlow = sanitizer::kThread ? 5 : 1;  // TSan runs the processes 5-15x slower

std::string ModelDir() { return SmallRandomModel("icecache_supervision_model", 29); }

// Waits up to `seconds` for `done()`.
bool WaitFor(double seconds, const std::function<bool()>& done) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// `icecache cluster --port P` with its output (and its children's) in a log file. Router on P,
// prefill workers on P+1.., decode workers after them; /metrics on another range, in the same order.
class Launcher {
 public:
  Launcher(int num_prefill, int num_decode, std::vector<std::string> extra,
           std::vector<std::pair<std::string, std::string>> env = {})
      : num_prefill_(num_prefill) {
    port_ = FreePortRange(1 + num_prefill + num_decode, 0x5e9 + num_prefill * 7 + num_decode);
    metrics_ = FreePortRange(1 + num_prefill + num_decode, 0x6f1 + num_prefill * 7 + num_decode);
    EXPECT_GT(port_, 0);
    EXPECT_GT(metrics_, 0);
    log_ = ::testing::TempDir() + "/icecache_supervision." + std::to_string(getpid()) + "." + std::to_string(port_) +
           ".log";
    std::vector<std::string> args = {kBin + "icecache", "cluster", "--model", ModelDir(), "--port",
                                     std::to_string(port_), "--prefill", std::to_string(num_prefill), "--decode",
                                     std::to_string(num_decode), "--metrics-port", std::to_string(metrics_),
                                     "--insecure-internal"};
    for (const char* s : {"cache.kv_dtype=f32", "cache.page_size=4", "ucx.net_devices=lo",
                          "ucx.transfer_timeout_seconds=20", "ucx.max_segment_bytes=1024", "prefill.threads=1",
                          "decode.threads=1", "decode.pool_pages=4000", "router.stats_refresh_seconds=0.1",
                          "router.kv_transfer_timeout_seconds=20"}) {
      args.insert(args.end(), {"--set", s});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = Spawn(args, log_, env);
  }

  ~Launcher() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);  // its children are orphaned: stop them by pid
      WaitExit(pid_);
      for (int w = -1; w < 8; ++w) {  // the router (-1: port P), then the workers
        const pid_t p = WorkerPid(w < 0 ? router() : Address(w));
        if (p > 0) kill(p, SIGKILL);
      }
    }
    std::error_code ignored;
    if (!::testing::Test::HasFailure()) std::filesystem::remove(log_, ignored);  // kept for a failure
  }

  std::string router() const { return "127.0.0.1:" + std::to_string(port_); }
  // Worker w: prefill workers first, then decode workers.
  std::string Address(int w) const { return "127.0.0.1:" + std::to_string(port_ + 1 + w); }
  std::string Decode(int i) const { return Address(num_prefill_ + i); }
  int WorkerMetricsPort(int w) const { return metrics_ + 1 + w; }
  int DecodeMetricsPort(int i) const { return WorkerMetricsPort(num_prefill_ + i); }
  int RouterMetricsPort() const { return metrics_; }
  std::string log() const { return ReadFile(log_); }
  pid_t pid() const { return pid_; }

  // The pid the launcher last (re)started the process at `address` with, or -1.
  pid_t WorkerPid(const std::string& address) const {
    const std::string text = log();
    const std::string key = " " + address + " (pid ";
    const size_t at = text.rfind(key);
    return at == std::string::npos ? -1 : std::atoi(text.c_str() + at + key.size());
  }

  bool WaitServing() {
    return WaitFor(60 * kSlow, [&] { return log().find("icecache cluster: serving on") != std::string::npos; });
  }

  // Kills the worker at `address` (kill -9) and returns the pid it had.
  pid_t KillWorker(const std::string& address) {
    const pid_t p = WorkerPid(address);
    EXPECT_GT(p, 0) << address;
    if (p > 0) kill(p, SIGKILL);
    return p;
  }

  // The worker at `address` runs as a new process (not `old_pid`) and answers its health check.
  bool WaitRestarted(const std::string& address, pid_t old_pid, double seconds) {
    return WaitFor(seconds, [&] {
      const pid_t p = WorkerPid(address);
      return p > 0 && p != old_pid && router::CheckHealth(address, "", 1).ok();
    });
  }

  // Both decode pools hold nothing (Stats, then /metrics once refreshed).
  bool DecodeIdle(int num_decode, double seconds) {
    return WaitFor(seconds, [&] {
      for (int i = 0; i < num_decode; ++i) {
        auto stub = v1::DecodeWorker::NewStub(cluster::MakeChannel(Decode(i)));
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        v1::WorkerStats st;
        if (!stub->Stats(&ctx, v1::StatsRequest(), &st).ok()) return false;
        if (st.reserved_pages() != 0 || st.active_sequences() != 0) return false;
        if (MetricValue(Scrape(DecodeMetricsPort(i)), "icecache_kv_host_bytes") != 0) return false;
      }
      return true;
    });
  }

 private:
  int num_prefill_;
  int port_ = -1, metrics_ = -1;
  std::string log_;
  pid_t pid_ = -1;
};

std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> p;
  for (int k = 0; k < 30 + 5 * i; ++k) p.push_back((11 + 37 * k + 13 * i) % 300 + 1);
  return p;
}

struct Result {
  std::vector<int32_t> tokens;
  Status status;
  bool hung = false;
};

// Streams prompts first..first+n-1 at once (greedy, budget full: exact after a migration or a
// re-prefill); `on_token(stream, tokens so far)` after each chunk. A request that does not end
// within its deadline ends DEADLINE_EXCEEDED from the client's own timeout: "hung".
std::vector<Result> Stream(const std::string& router, int n, int max_tokens,
                        const std::function<void(int, size_t)>& on_token = nullptr) {
  std::vector<Result> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      router::RemoteGenerateOptions o;
      o.router = router;
      o.prompt_ids = Prompt(i);
      o.max_tokens = max_tokens;
      o.ignore_eos = true;
      o.budget_pages = 0;
      o.timeout_seconds = 120 * kSlow;
      Result& r = results[i];
      r.status = router::RunRemoteGenerate(o, [&](const router::RemoteChunk& c) {
        r.tokens.insert(r.tokens.end(), c.token_ids.begin(), c.token_ids.end());
        if (on_token) on_token(i, r.tokens.size());
        return true;
      });
      r.hung = r.status.code() == StatusCode::kDeadlineExceeded;
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

constexpr int kStreams = 4;
constexpr int kMaxTokens = 200;

// Every stream ended with the reference tokens, or (at most) a non-hanging error with a message.
void ExpectReferenceOrClearStatus(const std::vector<Result>& got, const std::vector<Result>& ref, const Launcher& c,
                                  int* exact) {
  *exact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_FALSE(got[i].hung) << "stream " << i << " hung\n" << c.log();
    if (got[i].status.ok()) {
      EXPECT_EQ(got[i].tokens, ref[i].tokens) << "stream " << i;
      ++*exact;
    } else {
      EXPECT_FALSE(got[i].status.message().empty()) << "stream " << i;
    }
  }
}

// Kills worker `address` once stream 0 has `at` tokens.
std::function<void(int, size_t)> KillAt(Launcher& c, const std::string& address, size_t at, pid_t* killed) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  return [&c, address, at, killed, done](int stream, size_t tokens) {
    if (stream == 0 && tokens >= at && !done->exchange(true)) *killed = c.KillWorker(address);
  };
}

TEST(ClusterSupervision, RestartsKilledWorkersUnderLoadAndKeepsServing) {
  Launcher c(/*num_prefill=*/2, /*num_decode=*/2, {"--restart-backoff", "0.5"});
  ASSERT_TRUE(c.WaitServing()) << c.log();
  const auto ref = Stream(c.router(), kStreams, kMaxTokens);
  for (const auto& r : ref) ASSERT_TRUE(r.status.ok()) << r.status.ToString() << "\n" << c.log();

  // A decode worker under load: its streams migrate, it comes back on its port.
  for (int w : {2, 0}) {  // decode worker 0, then prefill worker 0
    SCOPED_TRACE("worker " + c.Address(w));
    pid_t killed = -1;
    // A decode worker is killed mid-stream; a prefill worker while new prompts arrive.
    std::vector<Result> got;
    if (w == 2) {
      got = Stream(c.router(), kStreams, kMaxTokens, KillAt(c, c.Address(w), 20, &killed));
    } else {
      killed = c.KillWorker(c.Address(w));
      got = Stream(c.router(), kStreams, kMaxTokens);
    }
    ASSERT_GT(killed, 0);
    int exact = 0;
    ExpectReferenceOrClearStatus(got, ref, c, &exact);
    EXPECT_EQ(exact, kStreams) << c.log();  // the survivors take them all
    ASSERT_TRUE(c.WaitRestarted(c.Address(w), killed, 30 * kSlow)) << c.log();
    EXPECT_NE(c.log().find("icecache cluster: restarted " + std::string(w == 2 ? "decode" : "prefill") + " worker " +
                           c.Address(w)),
              std::string::npos);
    EXPECT_EQ(MetricValue(Scrape(c.WorkerMetricsPort(w)), "icecache_worker_restarts_total"), 1);
  }
  // The restarted workers serve: enough requests that each decode worker takes some.
  const auto after = Stream(c.router(), kStreams, kMaxTokens);
  int exact = 0;
  ExpectReferenceOrClearStatus(after, ref, c, &exact);
  EXPECT_EQ(exact, kStreams);
  EXPECT_TRUE(c.DecodeIdle(2, 20 * kSlow)) << c.log();
  const std::string router_metrics = Scrape(c.RouterMetricsPort());
  EXPECT_GT(MetricValue(router_metrics, "icecache_worker_unavailable_seconds_total"), 0) << router_metrics;
  EXPECT_GE(MetricValue(router_metrics, "icecache_request_migrations_total"), 1);
  // The launcher is still there, and SIGTERM stops everything cleanly.
  kill(c.pid(), SIGTERM);
  EXPECT_EQ(WaitExit(c.pid()), 0) << c.log();
  EXPECT_FALSE(router::CheckHealth(c.router(), "", 0.5).ok());
}

TEST(ClusterSupervision, PrefillKilledMidShipmentIsPrefilledAgain) {
  const std::string once = ::testing::TempDir() + "/icecache_supervision_stall." + std::to_string(getpid());
  std::filesystem::remove(once);
  // One prefill worker, whose first life stalls every shipment after 6 segments (of ~60).
  Launcher c(1, 1, {"--restart-backoff", "0.5"},
             {{"ICECACHE_TEST_PREFILL_STALL_AFTER_SEGMENTS", "6"}, {"ICECACHE_TEST_PREFILL_STALL_ONCE_FILE", once}});
  ASSERT_TRUE(c.WaitServing()) << c.log();
  std::vector<Result> got;
  std::thread request([&] { got = Stream(c.router(), 1, 40); });
  ASSERT_TRUE(WaitFor(60 * kSlow, [&] { return c.log().find("fault injection: transfer") != std::string::npos; }))
      << c.log();
  const pid_t stalled = std::atoi(ReadFile(once).c_str());
  ASSERT_EQ(stalled, c.WorkerPid(c.Address(0)));
  kill(stalled, SIGKILL);
  request.join();
  ASSERT_TRUE(got[0].status.ok()) << got[0].status.ToString() << "\n" << c.log();
  // The same prompt on the restarted worker (no hook now) gives the same tokens.
  const auto ref = Stream(c.router(), 1, 40);
  ASSERT_TRUE(ref[0].status.ok()) << ref[0].status.ToString();
  EXPECT_EQ(got[0].tokens, ref[0].tokens);
  EXPECT_EQ(got[0].tokens.size(), 40u);
  EXPECT_GE(MetricValue(Scrape(c.RouterMetricsPort()), "icecache_request_prefill_retries_total"), 1);
  EXPECT_TRUE(c.DecodeIdle(1, 20 * kSlow)) << c.log();
  std::filesystem::remove(once);
}

TEST(ClusterSupervision, GivesUpOnAWorkerThatKeepsFailingAndStopsWithTheRouter) {
  Launcher c(1, 2, {"--restart-backoff", "0.2", "--max-restarts", "1"});
  ASSERT_TRUE(c.WaitServing()) << c.log();
  const std::string victim = c.Decode(0);
  const pid_t first = c.KillWorker(victim);
  ASSERT_TRUE(c.WaitRestarted(victim, first, 30 * kSlow)) << c.log();
  const pid_t second = c.KillWorker(victim);  // the second failure within 60 s of its start: > --max-restarts 1
  ASSERT_TRUE(WaitFor(10 * kSlow, [&] {
    return c.log().find("icecache cluster: giving up on decode worker " + victim) != std::string::npos;
  })) << c.log();
  // The other decode worker serves every request.
  const auto ref = Stream(c.router(), kStreams, 30);
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(ref[i].status.ok()) << i << ": " << ref[i].status.ToString() << "\n" << c.log();
    EXPECT_EQ(ref[i].tokens.size(), 30u);
  }
  EXPECT_EQ(c.WorkerPid(victim), second);  // not started again
  EXPECT_FALSE(router::CheckHealth(victim, "", 0.5).ok());
  // The router is the front door: its death stops the launcher, exit 1.
  const pid_t router_pid = c.WorkerPid(c.router());
  ASSERT_GT(router_pid, 0);
  kill(router_pid, SIGKILL);
  EXPECT_EQ(WaitExit(c.pid()), 1);
  EXPECT_NE(c.log().find("(the router is its front door)"), std::string::npos) << c.log();
  EXPECT_FALSE(router::CheckHealth(c.Decode(1), "", 0.5).ok());  // the rest were stopped
}

TEST(ClusterSupervision, RefusesBadRestartOptions) {
  for (std::vector<std::string> bad : {std::vector<std::string>{"--restart", "sometimes"},
                                       {"--max-restarts", "-1"}, {"--restart-backoff", "0"}}) {
    std::vector<std::string> args = {kBin + "icecache", "cluster", "--model", "/nonexistent", "--port", "20000"};
    args.insert(args.end(), bad.begin(), bad.end());
    EXPECT_EQ(WaitExit(Spawn(args, "/dev/null")), 2) << bad[0] << " " << bad[1];
  }
}

}  // namespace
}  // namespace icecache::testing
