// `icecache-bench soak`: a bounded chaos run of `icecache cluster` (found next to itself) on
// loopback: router, 2 prefill and 2 decode workers as real processes under the launcher's own
// supervision. The bench kill -9s a decode or a prefill worker every --kill-every seconds (0:
// never, a pure load run) and leaves the restart to the launcher, while --clients threads stream
// greedy requests (budget full) of random lengths, a share of them cancelled by the client
// mid-stream. Every request is then accounted for against the uninterrupted greedy reference of
// its prompt (taken before the first kill): completed with exactly the reference tokens,
// cancelled by the client, or ended with a clear error (a non-empty message) after a prefix of the
// reference. Wrong, lost or duplicated tokens, a success without a final response, a worker the
// launcher did not bring back, pools not back to zero or router fds/threads growing make the exit
// code 1.
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/workload.h"
#include "client/client.h"
#include "common/subprocess.h"
#include "model/random_checkpoint.h"

namespace icecache::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The launcher's output (and its children's) goes to `log`.
pid_t SpawnLauncher(const std::vector<std::string>& argv, const std::string& log) {
  SpawnOptions o;
  o.log_path = log;
  o.env = {{"OMP_WAIT_POLICY", "passive"}};
  StatusOr<pid_t> pid = SpawnProcess(argv, o);
  if (!pid.ok()) std::fprintf(stderr, "soak: %s\n", pid.status().ToString().c_str());
  return pid.ok() ? *pid : -1;
}

std::string ReadAll(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[8192];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

// The pid `icecache cluster` last (re)started the process at `address` with ("... ADDRESS (pid
// N"), or -1.
pid_t PidFromLog(const std::string& log, const std::string& address) {
  const std::string text = ReadAll(log), key = " " + address + " (pid ";
  const size_t at = text.rfind(key);
  return at == std::string::npos ? -1 : static_cast<pid_t>(std::atoi(text.c_str() + at + key.size()));
}

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

// Sum over the lines of metric `name` (any labels); -1 when absent.
double Metric(int port, const std::string& name) {
  const std::string text = HttpGet(port, "/metrics");
  double sum = -1;
  size_t at = 0;
  while ((at = text.find(name, at)) != std::string::npos) {
    const size_t after = at + name.size();
    if ((at == 0 || text[at - 1] == '\n') && after < text.size() && (text[after] == '{' || text[after] == ' ')) {
      const size_t end = text.find('\n', after);
      const std::string line = text.substr(after, end - after);
      sum = std::max(sum, 0.0) + std::atof(line.substr(line.rfind(' ') + 1).c_str());
    }
    at = after;
  }
  return sum;
}

// Ports base + kPortOffsets: listen ports of router, 2 prefill, 2 decode workers, then their
// metrics ports in the same order (`icecache cluster --metrics-port base + 10`).
constexpr int kPortOffsets[] = {0, 1, 2, 3, 4, 10, 11, 12, 13, 14};

bool PortFree(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// A random base whose ports are all free now, so that two runs on one machine do not collide
// (a clash makes the second run's workers fail to bind and its counts meaningless). 0: none found.
int FreePortBase() {
  std::mt19937 rng(static_cast<uint32_t>(getpid()) ^ static_cast<uint32_t>(Clock::now().time_since_epoch().count()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int base = 20000 + static_cast<int>(rng() % 12000);  // below the ephemeral range (32768..)
    bool all = true;
    for (int off : kPortOffsets) all = all && PortFree(base + off);
    if (all) return base;
  }
  return 0;
}

int CountEntries(const std::string& dir) {
  std::error_code ec;
  int n = 0;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) ++n;
  return n;
}

struct Counts {
  int64_t completed = 0;       // OK with exactly the reference tokens
  int64_t cancelled = 0;       // cancelled by the client, prefix of the reference
  int64_t clear_errors = 0;    // a non-OK status with a message, prefix of the reference
  int64_t wrong_tokens = 0;    // a token differs from the reference
  int64_t lost_or_dup = 0;     // OK with more or fewer tokens than asked
  int64_t no_final = 0;        // OK without a final response
  int64_t tokens = 0;
  std::map<std::string, int64_t> error_codes;
  // Clear errors by cause: the message with addresses and numbers masked ("#"), with the
  // seconds since the last kill (and its worker) of the first and last one seen.
  struct Cause {
    int64_t n = 0;
    std::string example;
    double first_after_kill = -1, last_after_kill = -1;
    std::string first_killed, last_killed;
  };
  std::map<std::string, Cause> causes;
};

// `message` with every run of digits (addresses, ports, counts, times) replaced by "#", so that
// errors of one cause group together.
std::string MessageShape(const std::string& message) {
  std::string out;
  for (size_t i = 0; i < message.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(message[i]))) {
      while (i + 1 < message.size() && (std::isdigit(static_cast<unsigned char>(message[i + 1])) || message[i + 1] == '.'))
        ++i;
      out += '#';
    } else {
      out += message[i];
    }
  }
  return out;
}

int RunSoak(int argc, char** argv) {
  double seconds = 60, kill_every = 8;
  int clients = 6, max_tokens = 300, prompts = 8;
  double cancel_share = 0.15;
  int port = 0;
  std::string model;
  std::vector<std::string> worker_sets;  // --worker-set KEY=VALUE: after the bench's own settings
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--seconds") seconds = std::atof(next());
    else if (a == "--clients") clients = std::atoi(next());
    else if (a == "--kill-every") kill_every = std::atof(next());
    else if (a == "--max-tokens") max_tokens = std::atoi(next());
    else if (a == "--cancel-share") cancel_share = std::atof(next());
    else if (a == "--port") port = std::atoi(next());
    else if (a == "--model") model = next();
    else if (a == "--worker-set") worker_sets.push_back(next());
    else {
      std::fprintf(stderr,
                   "usage: icecache-bench soak [--seconds S (60)] [--clients C (6)] [--kill-every S (8)]\n"
                   "         [--max-tokens N (300)] [--cancel-share F (0.15)] [--port BASE (a free random one)] [--model DIR|FILE.gguf]\n"
                   "         [--worker-set KEY=VALUE ...]  (--kill-every 0: no kills; --worker-set: a setting of every\n"
                   "         prefill and decode worker, after the bench's own, e.g. cache.page_size=16 for a real model)\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (port == 0) port = FreePortBase();
  if (port == 0) {
    std::fprintf(stderr, "soak: no free base port found; pass --port BASE (ports BASE..BASE+14)\n");
    return 1;
  }
  std::printf("soak: ports %d..%d\n", port, port + 14);
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  const std::string work = fs::temp_directory_path() / ("icecache-soak-" + std::to_string(getpid()));
  fs::create_directories(work);
  if (model.empty()) {
    model = work + "/model";
    if (Status s = model::WriteRandomCheckpoint(model, model::FailureTestModelSpec()); !s.ok()) {
      std::fprintf(stderr, "soak: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  // Kills are chaos from outside, not a crash loop: the launcher never gives a worker up here.
  std::vector<std::string> cmd = {(bin / "icecache").string(), "cluster", "--model", model, "--port",
                                   std::to_string(port), "--prefill", "2", "--decode", "2", "--metrics-port",
                                   std::to_string(port + 10), "--restart-backoff", "0.5", "--max-restarts",
                                   "1000000", "--insecure-internal"};
  for (const char* kv : {"cache.kv_dtype=f32", "cache.page_size=4", "ucx.net_devices=lo",
                         "ucx.transfer_timeout_seconds=10", "prefill.threads=1", "decode.threads=1",
                         "decode.pool_pages=30000", "router.stats_refresh_seconds=0.1"}) {
    cmd.insert(cmd.end(), {"--set", kv});
  }
  for (const std::string& kv : worker_sets) cmd.insert(cmd.end(), {"--set", kv});  // last: they win
  const std::string log = work + "/cluster.log";
  const pid_t launcher = SpawnLauncher(cmd, log);
  const std::string router = "127.0.0.1:" + std::to_string(port);
  // Listen addresses: prefill0, prefill1, decode0, decode1.
  const std::vector<std::string> names = {"prefill0", "prefill1", "decode0", "decode1"};
  auto address = [&](int w) { return "127.0.0.1:" + std::to_string(port + 1 + w); };
  const int router_metrics = port + 10;
  auto stop_all = [&] {  // SIGTERM: the launcher drains and stops its children
    if (launcher > 0) {
      kill(launcher, SIGTERM);
      waitpid(launcher, nullptr, 0);
    }
  };
  bool healthy = false;
  for (int i = 0; i < 600 && !healthy && launcher > 0; ++i) {
    healthy = router::CheckHealth(router, "", 1).ok();
    if (!healthy) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!healthy) {
    std::fprintf(stderr, "soak: the cluster did not become healthy (log: %s)\n", log.c_str());
    stop_all();
    return 1;
  }
  const pid_t router_pid = PidFromLog(log, router);

  auto prompt_of = [](int p) {
    std::vector<int32_t> ids;
    for (int k = 0; k < 6 + 5 * p; ++k) ids.push_back((13 + 29 * k + 11 * p) % 300 + 1);
    return ids;
  };
  auto request = [&](int p, int n) {
    router::RemoteGenerateOptions o;
    o.router = router;
    o.prompt_ids = prompt_of(p);
    o.max_tokens = n;
    o.ignore_eos = true;
    o.budget_pages = 0;
    o.timeout_seconds = 300;
    return o;
  };
  // References: each prompt once, uninterrupted, at the longest length (greedy: every shorter
  // request's tokens are a prefix).
  std::vector<std::vector<int32_t>> reference(prompts);
  for (int p = 0; p < prompts; ++p) {
    Status s = router::RunRemoteGenerate(request(p, max_tokens), [&](const router::RemoteChunk& c) {
      reference[p].insert(reference[p].end(), c.token_ids.begin(), c.token_ids.end());
      return true;
    });
    if (!s.ok() || static_cast<int>(reference[p].size()) != max_tokens) {
      std::fprintf(stderr, "soak: reference run failed: %s\n", s.ToString().c_str());
      stop_all();
      return 1;
    }
  }
  const int fds_before = CountEntries("/proc/" + std::to_string(router_pid) + "/fd");
  const int threads_before = CountEntries("/proc/" + std::to_string(router_pid) + "/task");

  std::mutex mu;
  Counts counts;
  Clock::time_point last_kill{};  // guarded by mu
  std::string last_killed;        // guarded by mu
  std::atomic<bool> stop{false};
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      while (Clock::now() < end) {
        const int p = static_cast<int>(rng() % prompts);
        const int n = 16 + static_cast<int>(rng() % (max_tokens - 15));
        const bool cancel = std::uniform_real_distribution<double>(0, 1)(rng) < cancel_share;
        const size_t cancel_at = 1 + rng() % n;
        std::vector<int32_t> got;
        bool final_seen = false;
        Status s = router::RunRemoteGenerate(request(p, n), [&](const router::RemoteChunk& c) {
          got.insert(got.end(), c.token_ids.begin(), c.token_ids.end());
          final_seen = final_seen || c.last;
          return !(cancel && got.size() >= cancel_at);
        });
        const bool prefix = got.size() <= reference[p].size() && std::equal(got.begin(), got.end(), reference[p].begin());
        std::lock_guard<std::mutex> lock(mu);
        counts.tokens += static_cast<int64_t>(got.size());
        if (!prefix) {
          ++counts.wrong_tokens;
        } else if (s.ok() && !final_seen) {
          ++counts.no_final;
        } else if (s.ok()) {
          if (static_cast<int>(got.size()) == n) {
            ++counts.completed;
          } else {
            ++counts.lost_or_dup;
          }
        } else if (s.code() == StatusCode::kCancelled && cancel) {
          ++counts.cancelled;
        } else if (!s.message().empty()) {
          ++counts.clear_errors;
          ++counts.error_codes[std::string(StatusCodeName(s.code()))];
          auto& cause = counts.causes[std::string(StatusCodeName(s.code())) + ": " + MessageShape(s.message())];
          const double after = last_killed.empty() ? -1 : std::chrono::duration<double>(Clock::now() - last_kill).count();
          if (cause.n++ == 0) {
            cause.example = s.message();
            cause.first_after_kill = after;
            cause.first_killed = last_killed;
          }
          cause.last_after_kill = after;
          cause.last_killed = last_killed;
        } else {
          ++counts.no_final;
        }
      }
    });
  }
  // The chaos: alternately a decode and a prefill worker, kill -9; the launcher starts it again.
  int kills_decode = 0, kills_prefill = 0;
  std::thread killer([&] {
    const int order[] = {2, 0, 3, 1};  // decode0, prefill0, decode1, prefill1
    for (int k = 0; !stop && kill_every > 0; ++k) {
      const auto at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kill_every));
      while (!stop && Clock::now() < at) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (stop || Clock::now() >= end) break;
      const int w = order[k % 4];
      const pid_t victim = PidFromLog(log, address(w));
      if (victim <= 0 || kill(victim, SIGKILL) != 0) {
        std::fprintf(stderr, "soak: %s is not running (pid %d); not killed\n", names[w].c_str(), victim);
        continue;
      }
      (w >= 2 ? kills_decode : kills_prefill)++;
      {
        std::lock_guard<std::mutex> lock(mu);
        last_kill = Clock::now();
        last_killed = names[w];
      }
      std::fprintf(stderr, "soak: kill -9 %s at %.1f s\n", names[w].c_str(),
                   std::chrono::duration<double>(Clock::now() - (end - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)))).count());
    }
  });
  for (auto& th : threads) th.join();
  stop = true;
  killer.join();

  // Afterwards: pools back to zero, nothing running at the router, fds and threads bounded.
  auto settled = [&](int metrics_port, const std::string& name) {
    double v = -1;
    for (int i = 0; i < 100; ++i) {
      v = Metric(metrics_port, name);
      if (v == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return v;
  };
  // Every worker back: healthy, and the launcher counted as many restarts as there were kills.
  bool all_back = true;
  double restarts = 0;
  for (int w = 0; w < 4; ++w) {
    bool up = false;
    for (int i = 0; i < 300 && !up; ++i) {
      up = router::CheckHealth(address(w), "", 1).ok();
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    all_back = all_back && up;
    restarts += std::max(0.0, Metric(port + 11 + w, "icecache_worker_restarts_total"));
  }
  all_back = all_back && static_cast<int>(restarts) == kills_decode + kills_prefill;
  const double usage0 = settled(port + 13, "icecache_kv_cache_usage_ratio");
  const double usage1 = settled(port + 14, "icecache_kv_cache_usage_ratio");
  const double running = settled(router_metrics, "icecache_requests_running");
  const double migrations = Metric(router_metrics, "icecache_request_migrations_total");
  const int fds_after = CountEntries("/proc/" + std::to_string(router_pid) + "/fd");
  const int threads_after = CountEntries("/proc/" + std::to_string(router_pid) + "/task");
  const bool serving = router::CheckHealth(router, "", 5).ok();
  stop_all();

  const int64_t total = counts.completed + counts.cancelled + counts.clear_errors + counts.wrong_tokens +
                        counts.lost_or_dup + counts.no_final;
  std::printf("soak: %.0f s, %d clients, max_tokens %d, kill -9 every %.0f s (%d decode, %d prefill kills)\n", seconds,
              clients, max_tokens, kill_every, kills_decode, kills_prefill);
  std::printf("| requests | completed = reference | cancelled by client | clear errors | wrong tokens | lost/dup "
              "| no final status | migrations | tokens |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::printf("| %lld | %lld | %lld | %lld | %lld | %lld | %lld | %.0f | %lld |\n", static_cast<long long>(total),
              static_cast<long long>(counts.completed), static_cast<long long>(counts.cancelled),
              static_cast<long long>(counts.clear_errors), static_cast<long long>(counts.wrong_tokens),
              static_cast<long long>(counts.lost_or_dup), static_cast<long long>(counts.no_final), migrations,
              static_cast<long long>(counts.tokens));
  for (auto& [code, n] : counts.error_codes) std::printf("soak: errors %s: %lld\n", code.c_str(), static_cast<long long>(n));
  for (auto& [shape, c] : counts.causes) {
    std::printf("soak: %lld x %s\n      first %.1f s after killing %s, last %.1f s after killing %s; e.g. \"%s\"\n",
                static_cast<long long>(c.n), shape.c_str(), c.first_after_kill, c.first_killed.c_str(),
                c.last_after_kill, c.last_killed.c_str(), c.example.c_str());
  }
  std::printf("soak: decode pools usage after: %g, %g; router requests running: %g; router fds %d -> %d, threads %d -> %d; "
              "router %s; workers restarted by icecache cluster: %.0f, all %s\n",
              usage0, usage1, running, fds_before, fds_after, threads_before, threads_after,
              serving ? "SERVING" : "NOT serving", restarts, all_back ? "back and healthy" : "NOT back");
  const bool ok = counts.wrong_tokens == 0 && counts.lost_or_dup == 0 && counts.no_final == 0 && usage0 == 0 &&
                  usage1 == 0 && running == 0 && serving && counts.completed > 0 && fds_after <= fds_before + 16 &&
                  threads_after <= threads_before + 16 && all_back;
  if (ok) {
    std::error_code ignored;
    fs::remove_all(work, ignored);
  } else {
    std::printf("soak: FAILED (log: %s)\n", log.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace

ICE_BENCH_WORKLOAD("soak", "chaos on real processes: kill -9 workers mid-stream, every request accounted for", RunSoak);

}  // namespace icecache::bench
