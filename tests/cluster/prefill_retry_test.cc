// Prefill-worker failure mid-shipment on a cluster of real processes (icecache-router, two
// icecache-prefill, two icecache-decode, fork/exec'd on loopback): a prefill worker whose
// shipment stalls after part of the KV has landed in the decode worker's pool (the test-only
// hook ICECACHE_TEST_PREFILL_STALL_AFTER_SEGMENTS, prefill_worker/prefill_server.cc) is killed
// with kill -9. The router releases the half-filled reservation, reserves again and prefills on
// the other prefill worker: the request completes with the tokens of an uninterrupted greedy run
// and both decode pools return to zero. With every prefill worker killed that way the request
// ends UNAVAILABLE once router.retry_wait_seconds has passed with none back, again with both
// pools at zero.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "serving/grpc_util.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/cluster/free_ports.h"
#include "tests/cluster/process_util.h"

namespace icecache::testing {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kBin = std::string(ICECACHE_BINARY_DIR) + "/bin/";
constexpr const char* kStallEnv = "ICECACHE_TEST_PREFILL_STALL_AFTER_SEGMENTS";
// The start notice, the metadata segment and 4 runs of 2 pages reach the decode worker, then the
// shipment stalls (a 40-token prompt ships 80 pages in 40 runs with ucx.max_segment_bytes 1024).
constexpr int kStallAfter = 6;

std::string ModelDir() { return SmallRandomModel("icecache_prefill_retry_model", 23); }

struct Process {
  std::string name, address, log;
  pid_t pid = -1;
  int metrics_port = 0;
};

// Router + 2 prefill + 2 decode workers as processes; prefill worker i stalls its shipments when
// faulty[i]. Prefill 0 sorts first among equally loaded workers (the lower port), so an idle
// cluster sends the first prompt to it.
class RetryCluster {
 public:
  explicit RetryCluster(std::vector<bool> faulty) {
    const int base = FreePortRange(8, 0x7e7 + (faulty[1] ? 1 : 0));
    EXPECT_GT(base, 0);
    model_ = ModelDir();
    log_dir_ = ::testing::TempDir() + "/icecache_prefill_retry_logs." + std::to_string(getpid());
    std::filesystem::create_directories(log_dir_);
    const std::vector<std::string> common = {
        "--model", model_, "--set", "cache.kv_dtype=f32", "--set", "cache.page_size=4", "--set",
        "ucx.net_devices=lo", "--set", "ucx.transfer_timeout_seconds=20", "--set", "ucx.max_segment_bytes=1024"};
    auto start = [&](const std::string& binary, const std::string& name, int port, std::vector<std::string> extra,
                     std::vector<std::pair<std::string, std::string>> env = {}) {
      Process p;
      p.name = name;
      p.address = "127.0.0.1:" + std::to_string(port);
      p.log = log_dir_ + "/" + name + ".log";
      std::vector<std::string> args = {kBin + binary, "--listen", p.address};
      args.insert(args.end(), common.begin(), common.end());
      args.insert(args.end(), extra.begin(), extra.end());
      p.pid = Spawn(args, p.log, env);
      return p;
    };
    for (int i = 0; i < 2; ++i) {
      std::vector<std::pair<std::string, std::string>> env;
      if (faulty[i]) env.emplace_back(kStallEnv, std::to_string(kStallAfter));
      prefill_.push_back(start("icecache-prefill", "prefill" + std::to_string(i), base + 1 + i,
                               {"--set", "prefill.threads=1"}, env));
    }
    for (int i = 0; i < 2; ++i) {
      const int metrics = base + 6 + i;
      decode_.push_back(start("icecache-decode", "decode" + std::to_string(i), base + 3 + i,
                              {"--set", "decode.threads=1", "--set", "decode.pool_pages=4000", "--metrics-port",
                               std::to_string(metrics)}));
      decode_.back().metrics_port = metrics;
    }
    router_ = start("icecache-router", "router", base,
                    {"--metrics-port", std::to_string(base + 5), "--set",
                     "router.prefill.addresses=" + prefill_[0].address + "," + prefill_[1].address, "--set",
                     "router.decode.addresses=" + decode_[0].address + "," + decode_[1].address, "--set",
                     "router.stats_refresh_seconds=0.1", "--set", "router.kv_transfer_timeout_seconds=20",
                     "--set", "router.retry_wait_seconds=2"});
    router_.metrics_port = base + 5;
  }

  ~RetryCluster() {
    for (Process* p : all()) {
      if (p->pid > 0) kill(p->pid, SIGKILL);
    }
    for (Process* p : all()) {
      if (p->pid > 0) WaitExit(p->pid);
    }
    std::error_code ignored;
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(log_dir_, ignored);  // kept for a failure
  }

  // Every process answers its health check, and the router has seen both prefill workers healthy
  // (it polls them every 0.1 s), so that ranking falls to the tie-break.
  bool WaitHealthy() {
    for (int i = 0; i < 600; ++i) {  // up to 60 s on a loaded machine
      bool all_up = true;
      for (Process* p : all()) all_up = all_up && router::CheckHealth(p->address, "", 1).ok();
      if (all_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  std::vector<Process*> all() {
    std::vector<Process*> v = {&router_};
    for (auto& p : prefill_) v.push_back(&p);
    for (auto& d : decode_) v.push_back(&d);
    return v;
  }

  // The prefill worker whose shipment stalls now (its log says so), or null after `seconds`.
  Process* WaitForStall(double seconds) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    while (Clock::now() < until) {
      for (auto& p : prefill_) {
        if (p.pid > 0 && ReadFile(p.log).find("fault injection: transfer") != std::string::npos) return &p;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return nullptr;
  }

  // kill -9, reaped: the exit status says it died of SIGKILL.
  int KillNine(Process* p) {
    kill(p->pid, SIGKILL);
    const int status = WaitExit(p->pid);
    p->pid = -1;
    return status;
  }

  // KV bytes in use in both decode pools, as their /metrics say (refreshed every 0.5 s).
  double DecodeKvBytes() {
    double sum = 0;
    for (auto& d : decode_) sum += std::max(0.0, MetricValue(Scrape(d.metrics_port), "icecache_kv_host_bytes"));
    return sum;
  }

  // Both decode workers hold nothing: no pages in use, no admission estimate, no live sequence
  // (Stats, immediate; then /metrics once it has refreshed). Waits up to `seconds` for it.
  bool DecodeIdle(double seconds, std::string* why) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    for (;;) {
      std::string state;
      bool idle = true;
      for (auto& d : decode_) {
        auto stub = v1::DecodeWorker::NewStub(cluster::MakeChannel(d.address));
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        v1::WorkerStats st;
        grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &st);
        const std::string m = Scrape(d.metrics_port);
        const double bytes = MetricValue(m, "icecache_kv_host_bytes");
        const double running = MetricValue(m, "icecache_decode_sequences_running");
        state += d.name + ": stats " + (s.ok() ? "ok" : s.error_message()) + ", reserved_pages " +
                 std::to_string(st.reserved_pages()) + ", active " + std::to_string(st.active_sequences()) +
                 ", kv bytes " + std::to_string(bytes) + ", running " + std::to_string(running) + "; ";
        idle = idle && s.ok() && st.reserved_pages() == 0 && st.active_sequences() == 0 && bytes == 0 && running == 0;
      }
      if (idle) return true;
      if (Clock::now() > until) {
        *why = state;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  double RouterMetric(const std::string& name) { return MetricValue(Scrape(router_.metrics_port), name); }
  const std::string& router_address() const { return router_.address; }
  const std::string& model_dir() const { return model_; }
  Process& prefill(int i) { return prefill_[i]; }

  std::string logs() const {
    std::string out;
    for (const auto& e : std::filesystem::directory_iterator(log_dir_)) {
      const std::string text = ReadFile(e.path().string());
      out += "---- " + e.path().filename().string() + "\n" + text.substr(text.size() > 3000 ? text.size() - 3000 : 0);
    }
    return out;
  }

 private:
  std::string model_, log_dir_;
  Process router_;
  std::vector<Process> prefill_, decode_;
};

std::vector<int32_t> Prompt() {
  std::vector<int32_t> p;
  for (int k = 0; k < 40; ++k) p.push_back((13 + 29 * k) % 300 + 1);
  return p;
}

constexpr int kMaxTokens = 16;

struct Outcome {
  Status status;
  std::vector<int32_t> tokens;
};

// Starts the request on its own thread.
std::thread Request(const std::string& router, Outcome* out) {
  return std::thread([router, out] {
    router::RemoteGenerateOptions o;
    o.router = router;
    o.prompt_ids = Prompt();
    o.max_tokens = kMaxTokens;
    o.ignore_eos = true;
    o.budget_pages = 0;  // full attention: the retried prefill recomputes the same KV
    o.timeout_seconds = 120;
    out->status = router::RunRemoteGenerate(o, [&](const router::RemoteChunk& c) {
      out->tokens.insert(out->tokens.end(), c.token_ids.begin(), c.token_ids.end());
      return true;
    });
  });
}

// Waits (bounded) until part of the stalled shipment is in a decode pool: the kill then really
// happens mid-shipment.
bool PagesLanded(RetryCluster& c) {
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < until) {
    if (c.DecodeKvBytes() > 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(ClusterPrefillRetry, PrefillWorkerKilledMidShipmentIsRetriedOnAnother) {
  RetryCluster c({true, false});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  // The uninterrupted greedy run: one process, a dense f32 cache of the same page size.
  const std::vector<int32_t> reference = SingleProcessGreedy(c.model_dir(), Prompt(), kMaxTokens);
  ASSERT_EQ(reference.size(), static_cast<size_t>(kMaxTokens));

  Outcome out;
  std::thread request = Request(c.router_address(), &out);
  Process* stalled = c.WaitForStall(60);
  if (stalled == nullptr) {
    request.join();
    FAIL() << "no prefill worker stalled: the request never reached the faulty worker (" << out.status.ToString()
           << ")\n" << c.logs();
  }
  EXPECT_EQ(stalled, &c.prefill(0));
  EXPECT_TRUE(PagesLanded(c)) << "no KV of the stalled shipment reached a decode pool: the kill proves nothing\n"
                              << c.logs();
  EXPECT_EQ(c.KillNine(stalled), 128 + SIGKILL);
  request.join();

  ASSERT_TRUE(out.status.ok()) << out.status.ToString() << "\n" << c.logs();
  EXPECT_EQ(out.tokens, reference);
  EXPECT_EQ(c.RouterMetric("icecache_request_prefill_retries_total"), 1);
  std::string why;
  EXPECT_TRUE(c.DecodeIdle(30, &why)) << why;
  // The survivors serve the next request alone, with the same tokens.
  Outcome again;
  Request(c.router_address(), &again).join();
  ASSERT_TRUE(again.status.ok()) << again.status.ToString();
  EXPECT_EQ(again.tokens, reference);
  EXPECT_TRUE(c.DecodeIdle(30, &why)) << why;
}

TEST(ClusterPrefillRetry, EveryPrefillWorkerKilledMidShipmentIsUnavailable) {
  RetryCluster c({true, true});
  ASSERT_TRUE(c.WaitHealthy()) << c.logs();
  Outcome out;
  std::thread request = Request(c.router_address(), &out);
  for (int k = 0; k < 2; ++k) {
    Process* stalled = c.WaitForStall(60);
    if (stalled == nullptr) {
      request.join();
      FAIL() << "prefill attempt " << k << " never stalled (" << out.status.ToString() << ")\n" << c.logs();
    }
    EXPECT_TRUE(PagesLanded(c)) << "attempt " << k << ": no KV reached a decode pool\n" << c.logs();
    EXPECT_EQ(c.KillNine(stalled), 128 + SIGKILL);
  }
  request.join();
  EXPECT_EQ(out.status.code(), StatusCode::kUnavailable) << out.status.ToString();
  // Both gone: the retry policy waited router.retry_wait_seconds for one to come back.
  EXPECT_NE(out.status.message().find("no prefill worker became ready within 2 s (router.retry_wait_seconds)"),
            std::string::npos)
      << out.status.ToString();
  EXPECT_TRUE(out.tokens.empty());
  EXPECT_EQ(c.RouterMetric("icecache_request_prefill_retries_total"), 1);
  std::string why;
  EXPECT_TRUE(c.DecodeIdle(30, &why)) << why << "\n" << c.logs();
}

}  // namespace
}  // namespace icecache::testing
