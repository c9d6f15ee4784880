// `icecache cluster`: a local cluster on loopback. Starts icecache-prefill x N, icecache-decode x M
// and icecache-router (found next to this binary) as separate processes, waits until the router is
// healthy, and supervises them: a worker that dies after the cluster first served is restarted on
// its port with exponential backoff (--restart on-failure, the default) while the router routes
// around it; one that keeps failing soon after each start is given up, the rest keep serving. The
// router's death, or any child's before the cluster first served (a setup error), stops all with
// exit 1. SIGINT/SIGTERM drain and stop all (exit 0). With --once it stops everything as soon as
// the router serves.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "kernels/backend.h"
#include "serving/cluster_config.h"
#include "serving/internal_tls.h"
#include "common/subprocess.h"
#include "serving/metric_families.h"
#include "tools/cli/command.h"

namespace icecache::cli {
namespace {

constexpr const char* kUsage =
    "usage: icecache cluster --model DIR --port P [--prefill N] [--decode M] [--config FILE]\n"
    "                        [--metrics-port BASE] [--http-port H] [--api-key KEY] [--device auto|cpu|cuda] [--set SECTION.KEY=VALUE ...] [--once]\n"
    "                        [--tensor-parallel N] [--prefill-tp N] [--decode-tp N]\n"
    "                        [--restart on-failure|never] [--max-restarts N] [--restart-backoff SECONDS]\n"
    "  Router on 127.0.0.1:P; prefill workers on P+1..P+N, decode workers on P+N+1..P+N+M.\n"
    "  --metrics-port BASE: /metrics of the router on BASE, prefill workers on BASE+1.., decode\n"
    "  workers after them (monitoring/prometheus.yml scrapes 9400-9402).\n"
    "  --http-port H: the router's OpenAI-compatible HTTP API on 127.0.0.1:H (docs/openai_api.md).\n"
    "  --api-key KEY: the router asks for it on both APIs (repeatable; router.api_keys).\n"
    "  --config/--set are passed to every process (keys: docs/config.md).\n"
    "  --device: auto (default) puts the workers on the visible GPUs round-robin (prefill workers\n"
    "    first: cuda:0, cuda:1, ...; CUDA_VISIBLE_DEVICES decides what is visible), or all on the\n"
    "    CPU when there is none; cpu forces the CPU; cuda or cuda:N round-robin from N.\n"
    "  --tensor-parallel N: every worker runs the model split over N ranks (threads of the worker;\n"
    "    on GPUs N consecutive GPUs per worker, placed as above); --prefill-tp / --decode-tp set it\n"
    "    per role (parallel.tensor_parallel_size, prefill.devices / decode.devices; docs/parallel.md).\n"
    "  --once: exit 0 as soon as the router serves (a smoke test), stopping everything.\n"
    "  --restart on-failure (default): a prefill or decode worker that dies (a signal or a non-zero\n"
    "    exit) after the cluster first served is restarted on its port after --restart-backoff\n"
    "    seconds (default 1), doubling for each failure in a row up to 30 s; a failure counts as in a\n"
    "    row when the worker ran less than 60 s. After --max-restarts failures in a row (default 5)\n"
    "    it is given up and the other workers keep serving. never: a dead worker stays down. Either\n"
    "    way the router routes around a worker that is down. The router's death stops the cluster\n"
    "    (exit 1), as does any child's before the cluster first served.\n"
    "  The internal plane (router -> workers) uses mutual TLS: with internal_tls.* in the config those\n"
    "    certificates, otherwise a throwaway CA made for this run (removed on exit);\n"
    "    --insecure-internal turns it off (plaintext, as before).\n";

using Clock = std::chrono::steady_clock;

// A failure counts as "in a row" (towards --max-restarts, and doubling the backoff) when the
// worker ran less than this since its start.
constexpr auto kStableRun = std::chrono::seconds(60);
constexpr double kMaxBackoffSeconds = 30;

struct Child {
  std::string name;  // "decode worker 127.0.0.1:P"
  bool is_router = false;
  std::string binary;
  std::vector<std::string> args;
  pid_t pid = -1;
  int restarts = 0;         // restarts so far (the worker's icecache_worker_restarts_total)
  int failures_in_row = 0;  // failures each within kStableRun of their start
  Clock::time_point started_at{};
  Clock::time_point restart_at{};  // when it is to be started again
  bool awaiting_restart = false;
  bool given_up = false;
};

struct RestartPolicy {
  bool on_failure = true;
  int max_restarts = 5;          // failures in a row before a worker is given up
  double backoff_seconds = 1;    // before the first restart; doubles per failure in a row
};

// Prints one launcher line to `f` at once (stdout is a file or a pipe under a supervisor).
void Say(FILE* f, const std::string& line) {
  std::fprintf(f, "icecache cluster: %s\n", line.c_str());
  std::fflush(f);
}

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// -1 when it cannot start (the reason on stderr); when exec fails the child says so in its stderr
// and exits 127, which the supervision loop reports. `restarts` > 0 is passed to the worker as
// cluster::kWorkerRestartsEnv (its icecache_worker_restarts_total).
pid_t Spawn(const std::string& binary, const std::vector<std::string>& args, int restarts = 0) {
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions options;
  if (restarts > 0) options.env.emplace_back(cluster::kWorkerRestartsEnv, std::to_string(restarts));
  StatusOr<pid_t> pid = SpawnProcess(argv, options);
  if (!pid.ok()) {
    Say(stderr, pid.status().ToString());
    return -1;
  }
  return *pid;
}

void Start(Child& c) {
  c.pid = Spawn(c.binary, c.args, c.restarts);
  c.started_at = Clock::now();
  c.awaiting_restart = false;
  if (c.pid > 0) {
    Say(stdout, (c.restarts > 0 ? "restarted " : "started ") + c.name + " (pid " + std::to_string(c.pid) +
                    (c.restarts > 0 ? "; restart " + std::to_string(c.restarts) : "") + ")");
  }
}

// A worker that died (or could not be started again) while the cluster serves: schedules its
// restart with backoff, or gives it up. `how` says how it ended.
void OnWorkerDown(Child& c, const std::string& how, bool clean_exit, const RestartPolicy& policy) {
  const auto now = Clock::now();
  if (!policy.on_failure) {
    Say(stderr, c.name + " " + how + "; not restarting it (--restart never): the other workers keep serving");
    c.given_up = true;
    return;
  }
  if (clean_exit) {
    Say(stderr, c.name + " " + how + "; it stopped by itself, so it is not restarted (--restart on-failure)");
    c.given_up = true;
    return;
  }
  c.failures_in_row = now - c.started_at < kStableRun ? c.failures_in_row + 1 : 1;
  if (c.failures_in_row > policy.max_restarts) {
    Say(stderr, "giving up on " + c.name + ": it failed " + std::to_string(c.failures_in_row) +
                    " times in a row, each within " + std::to_string(kStableRun.count()) + " s of its start (last: " +
                    how + "; --max-restarts " + std::to_string(policy.max_restarts) +
                    "); the other workers keep serving");
    c.given_up = true;
    return;
  }
  double backoff = policy.backoff_seconds;
  for (int i = 1; i < c.failures_in_row && backoff < kMaxBackoffSeconds; ++i) backoff *= 2;
  backoff = std::min(backoff, kMaxBackoffSeconds);
  c.awaiting_restart = true;
  c.restart_at = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(backoff));
  char when[32];
  std::snprintf(when, sizeof(when), "%.1f", backoff);
  Say(stderr, c.name + " " + how + "; restarting it in " + when + " s (failure " + std::to_string(c.failures_in_row) +
                  " in a row; --max-restarts " + std::to_string(policy.max_restarts) + ")");
}

// SIGTERM to every child (each drains for its *.drain_seconds), SIGKILL to those still there after
// `grace_seconds`.
void StopAll(std::vector<Child>& children, double grace_seconds) {
  for (auto& c : children) {
    if (c.pid > 0) kill(c.pid, SIGTERM);
  }
  auto until = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(grace_seconds));
  for (auto& c : children) {
    while (c.pid > 0) {
      int status = 0;
      pid_t r = waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid || r < 0) {
        c.pid = -1;
        break;
      }
      if (std::chrono::steady_clock::now() > until) {
        std::fprintf(stderr, "icecache cluster: %s did not stop; killing it\n", c.name.c_str());
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        c.pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

// Returns the child that exited (and how; *clean when it exited 0), or nullptr.
Child* Reap(std::vector<Child>& children, std::string* how, bool* clean) {
  int status = 0;
  pid_t pid = waitpid(-1, &status, WNOHANG);
  if (pid <= 0) return nullptr;
  for (auto& c : children) {
    if (c.pid != pid) continue;
    c.pid = -1;
    *clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    *how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                             : "was killed by signal " + std::to_string(WTERMSIG(status));
    return &c;
  }
  return nullptr;
}

int RunCluster(int argc, char** argv) {
  std::string model, config;
  int port = 0, num_prefill = 1, num_decode = 1, metrics_base = 0, http_port = 0, prefill_tp = 0, decode_tp = 0;
  kernels::Device device;
  bool once = false, insecure_internal = false;
  RestartPolicy restart;
  std::vector<std::string> sets, api_keys;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--model" && (v = next())) {
      model = v;
    } else if (a == "--port" && (v = next())) {
      port = std::atoi(v);
    } else if (a == "--prefill" && (v = next())) {
      num_prefill = std::atoi(v);
    } else if (a == "--decode" && (v = next())) {
      num_decode = std::atoi(v);
    } else if ((a == "--tensor-parallel" || a == "--prefill-tp" || a == "--decode-tp") && (v = next())) {
      const int n = std::atoi(v);
      if (n < 1 || n > 1024) {
        std::fprintf(stderr, "icecache cluster: %s %s: the rank count must be in [1, 1024]\n", a.c_str(), v);
        return 2;
      }
      if (a != "--decode-tp") prefill_tp = n;
      if (a != "--prefill-tp") decode_tp = n;
    } else if (a == "--metrics-port" && (v = next())) {
      metrics_base = std::atoi(v);
    } else if (a == "--http-port" && (v = next())) {
      http_port = std::atoi(v);
      if (http_port <= 0 || http_port > 65535) {
        std::fprintf(stderr, "icecache cluster: --http-port %s is not a port (1-65535)\n", v);
        return 2;
      }
    } else if (a == "--api-key" && (v = next())) {
      api_keys.push_back(v);
    } else if (a == "--config" && (v = next())) {
      config = v;
    } else if (a == "--set" && (v = next())) {
      sets.push_back(v);
    } else if (a == "--device" && (v = next())) {
      auto d = kernels::ParseDevice(v);
      if (!d.ok()) {
        std::fprintf(stderr, "icecache cluster: %s\n", d.status().message().c_str());
        return 2;
      }
      device = *d;
    } else if (a == "--restart" && (v = next())) {
      if (std::string(v) != "on-failure" && std::string(v) != "never") {
        std::fprintf(stderr, "icecache cluster: --restart %s: use on-failure or never\n", v);
        return 2;
      }
      restart.on_failure = std::string(v) == "on-failure";
    } else if (a == "--max-restarts" && (v = next())) {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (end == v || *end != '\0' || n < 0 || n > 1000000) {
        std::fprintf(stderr, "icecache cluster: --max-restarts %s: a count in [0, 1000000]\n", v);
        return 2;
      }
      restart.max_restarts = static_cast<int>(n);
    } else if (a == "--restart-backoff" && (v = next())) {
      char* end = nullptr;
      const double b = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(b >= 0.01 && b <= kMaxBackoffSeconds)) {
        std::fprintf(stderr, "icecache cluster: --restart-backoff %s: seconds in [0.01, %.0f]\n", v,
                     kMaxBackoffSeconds);
        return 2;
      }
      restart.backoff_seconds = b;
    } else if (a == "--once") {
      once = true;
    } else if (a == "--insecure-internal") {
      insecure_internal = true;
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "icecache cluster: unknown or incomplete option '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (model.empty() || port <= 0 || port + num_prefill + num_decode > 65535 || num_prefill < 1 || num_decode < 1) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::filesystem::path bin = self.parent_path();
  for (const char* b : {"icecache-router", "icecache-prefill", "icecache-decode"}) {
    if (!std::filesystem::exists(bin / b)) {
      std::fprintf(stderr, "icecache cluster: %s not found next to %s\n", b, self.c_str());
      return 1;
    }
  }
  // Mutual TLS on the internal plane: the config's certificates, or a throwaway CA for this run.
  auto parsed = cluster::LoadClusterConfig(config, sets);
  if (!parsed.ok()) {
    std::fprintf(stderr, "icecache cluster: %s\n", parsed.status().message().c_str());
    return 2;
  }
  std::filesystem::path cert_dir;
  struct RemoveDir {
    std::filesystem::path* dir;
    ~RemoveDir() {
      std::error_code ignored;
      if (!dir->empty()) std::filesystem::remove_all(*dir, ignored);
    }
  } remove_cert_dir{&cert_dir};
  if (!insecure_internal && !parsed->internal_tls.enabled()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "icecache-certs-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::fprintf(stderr, "icecache cluster: cannot make a directory for certificates: %s\n", std::strerror(errno));
      return 1;
    }
    cert_dir = tmpl;
    auto tls = cluster::WriteThrowawayCertificates(cert_dir.string());
    if (!tls.ok()) {
      std::fprintf(stderr, "icecache cluster: %s\n", tls.status().message().c_str());
      return 1;
    }
    sets.insert(sets.end(), {"internal_tls.ca_file=" + tls->ca_file, "internal_tls.cert_file=" + tls->cert_file,
                             "internal_tls.key_file=" + tls->key_file});
    std::printf("icecache cluster: internal plane on mutual TLS (throwaway CA in %s)\n", cert_dir.c_str());
  } else if (insecure_internal) {
    std::printf("icecache cluster: internal plane in plaintext (--insecure-internal)\n");
  } else {
    std::printf("icecache cluster: internal plane on mutual TLS (%s)\n", parsed->internal_tls.ca_file.c_str());
  }
  if (insecure_internal) {
    sets.insert(sets.end(), {"internal_tls.ca_file=", "internal_tls.cert_file=", "internal_tls.key_file="});
  }

  int next_metrics = metrics_base;
  auto common = [&](const std::string& listen) {
    std::vector<std::string> args;
    if (!config.empty()) args.insert(args.end(), {"--config", config});
    args.insert(args.end(), {"--model", model, "--listen", listen});
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    if (metrics_base > 0) args.insert(args.end(), {"--metrics-port", std::to_string(next_metrics++)});
    return args;
  };
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // Placement: worker w (prefill workers first) on GPU (first + w) % G, or on the CPU.
  const kernels::Device resolved = kernels::ResolveDevice(device);
  const int gpus = resolved.backend == kernels::Backend::kCuda ? kernels::DeviceCount(kernels::Backend::kCuda) : 0;
  if (device.backend == kernels::Backend::kCuda && gpus == 0) {
    std::fprintf(stderr, "icecache cluster: --device %s, but no CUDA device is usable\n",
                 kernels::DeviceName(device).c_str());
    return 1;
  }
  // With tensor parallelism a worker takes `tp` consecutive GPUs (its ranks' devices).
  if (prefill_tp == 0) prefill_tp = parsed->parallel.tensor_parallel_size;
  if (decode_tp == 0) decode_tp = parsed->parallel.tensor_parallel_size;
  if (gpus > 0 && std::max(prefill_tp, decode_tp) > gpus) {
    std::fprintf(stderr, "icecache cluster: %d tensor-parallel ranks per worker, but only %d GPUs are visible\n",
                 std::max(prefill_tp, decode_tp), gpus);
    return 1;
  }
  int gpu = 0;  // next GPU, counted from resolved.index
  auto placed = [&](std::vector<std::string> args, const std::string& what, const std::string& role, int tp) {
    std::string d = "cpu", list;
    if (gpus > 0) {
      for (int r = 0; r < tp; ++r) {
        const std::string g = "cuda:" + std::to_string((resolved.index + gpu++) % gpus);
        if (r == 0) d = g;
        list += (list.empty() ? "" : ",") + g;
      }
    }
    if (tp > 1) {
      std::printf("icecache cluster: %s on %s (%d tensor-parallel ranks%s%s)\n", what.c_str(), d.c_str(), tp,
                  list.empty() ? "" : ": ", list.c_str());
      args.insert(args.end(), {"--set", "parallel.tensor_parallel_size=" + std::to_string(tp)});
      if (!list.empty()) args.insert(args.end(), {"--set", role + ".devices=" + list});
    } else {
      std::printf("icecache cluster: %s on %s\n", what.c_str(), d.c_str());
      args.insert(args.end(), {"--set", "parallel.tensor_parallel_size=1"});
    }
    args.insert(args.end(), {"--device", d});
    return args;
  };

  std::vector<Child> children;
  std::string prefill_list, decode_list;
  next_metrics = metrics_base + 1;  // the router (started last) takes BASE itself
  int next_port = port + 1;
  auto add_worker = [&](const std::string& role, int tp) {
    const std::string listen = "127.0.0.1:" + std::to_string(next_port++);
    std::string& list = role == "prefill" ? prefill_list : decode_list;
    list += (list.empty() ? "" : ",") + listen;
    Child c;
    c.name = role + " worker " + listen;
    c.binary = (bin / ("icecache-" + role)).string();
    c.args = placed(common(listen), c.name, role, tp);
    children.push_back(std::move(c));
  };
  for (int i = 0; i < num_prefill; ++i) add_worker("prefill", prefill_tp);
  for (int i = 0; i < num_decode; ++i) add_worker("decode", decode_tp);
  std::string router = "127.0.0.1:" + std::to_string(port);
  next_metrics = metrics_base;
  Child r;
  r.name = "router " + router;
  r.is_router = true;
  r.binary = (bin / "icecache-router").string();
  r.args = common(router);
  r.args.insert(r.args.end(), {"--set", "router.prefill.addresses=" + prefill_list, "--set",
                               "router.decode.addresses=" + decode_list});
  if (http_port > 0) r.args.insert(r.args.end(), {"--http-port", std::to_string(http_port)});
  for (const auto& k : api_keys) r.args.insert(r.args.end(), {"--api-key", k});
  children.push_back(std::move(r));

  bool serving = false;
  int exit_code = 0;
  for (auto& c : children) {
    Start(c);
    if (c.pid < 0) {  // Spawn said why
      Say(stderr, c.name + " did not start; stopping the cluster");
      exit_code = 1;
      g_stop = 1;
      break;
    }
  }
  const auto started = Clock::now();
  while (!g_stop) {
    std::string how;
    bool clean = false;
    Child* dead = nullptr;
    while (!g_stop && (dead = Reap(children, &how, &clean)) != nullptr) {
      if (dead->is_router) {
        Say(stderr, dead->name + " " + how + "; stopping the cluster (the router is its front door)");
        exit_code = 1;
        g_stop = 1;
      } else if (!serving) {
        Say(stderr, dead->name + " " + how + " before the cluster served; stopping the cluster (its log above says why)");
        exit_code = 1;
        g_stop = 1;
      } else {
        OnWorkerDown(*dead, how, clean, restart);
      }
    }
    if (g_stop) break;
    for (auto& c : children) {
      if (!c.awaiting_restart || Clock::now() < c.restart_at) continue;
      ++c.restarts;
      Start(c);
      if (c.pid < 0) OnWorkerDown(c, "could not be started again", /*clean_exit=*/false, restart);
    }
    if (!serving) {
      serving = router::CheckHealth(router, "", 1).ok();
      if (serving) {
        Say(stdout, "serving on " + router + " (" + std::to_string(num_prefill) + " prefill, " +
                        std::to_string(num_decode) + " decode workers)");
        if (once) break;
      } else if (Clock::now() - started > std::chrono::seconds(120)) {
        Say(stderr, "router " + router + " not healthy after 120 s");
        exit_code = 1;
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(serving ? 100 : 50));
  }
  // The longest drain of any child, plus time to stop after it (the chart's
  // terminationGracePeriodSeconds follows the same rule).
  StopAll(children, std::max({parsed->router.drain_seconds, parsed->prefill.drain_seconds,
                              parsed->decode.drain_seconds}) + 10);
  return exit_code;
}

}  // namespace
ICE_CLI_COMMAND("cluster", "run a local cluster (router + prefill + decode workers) on loopback", RunCluster);
}  // namespace icecache::cli
