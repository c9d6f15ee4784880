// `icecache cluster`: a local cluster on loopback. Starts icecache-prefill x N, icecache-decode x M
// and icecache-router (found next to this binary) as separate processes, waits until the router is
// healthy, and supervises them: SIGINT/SIGTERM stops all; a child that dies is reported and the
// rest are stopped (exit 1). With --once it stops everything as soon as the router serves.
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
#include "tools/cli/command.h"

namespace icecache::cli {
namespace {

constexpr const char* kUsage =
    "usage: icecache cluster --model DIR --port P [--prefill N] [--decode M] [--config FILE]\n"
    "                        [--metrics-port BASE] [--http-port H] [--api-key KEY] [--device auto|cpu|cuda] [--set SECTION.KEY=VALUE ...] [--once]\n"
    "                        [--tensor-parallel N] [--prefill-tp N] [--decode-tp N]\n"
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
    "  The internal plane (router -> workers) uses mutual TLS: with internal_tls.* in the config those\n"
    "    certificates, otherwise a throwaway CA made for this run (removed on exit);\n"
    "    --insecure-internal turns it off (plaintext, as before).\n";

struct Child {
  std::string name;
  pid_t pid = -1;
};

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// -1 when it cannot start (the reason on stderr); when exec fails the child says so in its stderr
// and exits 127, which the supervision loop reports.
pid_t Spawn(const std::string& binary, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), args.begin(), args.end());
  StatusOr<pid_t> pid = SpawnProcess(argv);
  if (!pid.ok()) {
    std::fprintf(stderr, "icecache cluster: %s\n", pid.status().ToString().c_str());
    return -1;
  }
  return *pid;
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

// Returns the child that exited (and how), or nullptr.
Child* Reap(std::vector<Child>& children, std::string* how) {
  int status = 0;
  pid_t pid = waitpid(-1, &status, WNOHANG);
  if (pid <= 0) return nullptr;
  for (auto& c : children) {
    if (c.pid != pid) continue;
    c.pid = -1;
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
  for (int i = 0; i < num_prefill; ++i, ++next_port) {
    std::string listen = "127.0.0.1:" + std::to_string(next_port);
    prefill_list += (prefill_list.empty() ? "" : ",") + listen;
    children.push_back({"prefill worker " + listen,
                        Spawn((bin / "icecache-prefill").string(), placed(common(listen), "prefill worker " + listen, "prefill", prefill_tp))});
  }
  for (int i = 0; i < num_decode; ++i, ++next_port) {
    std::string listen = "127.0.0.1:" + std::to_string(next_port);
    decode_list += (decode_list.empty() ? "" : ",") + listen;
    children.push_back({"decode worker " + listen,
                        Spawn((bin / "icecache-decode").string(), placed(common(listen), "decode worker " + listen, "decode", decode_tp))});
  }
  std::string router = "127.0.0.1:" + std::to_string(port);
  next_metrics = metrics_base;
  auto router_args = common(router);
  router_args.insert(router_args.end(), {"--set", "router.prefill.addresses=" + prefill_list, "--set",
                                         "router.decode.addresses=" + decode_list});
  if (http_port > 0) router_args.insert(router_args.end(), {"--http-port", std::to_string(http_port)});
  for (const auto& k : api_keys) router_args.insert(router_args.end(), {"--api-key", k});
  children.push_back({"router " + router, Spawn((bin / "icecache-router").string(), router_args)});

  bool serving = false;
  int exit_code = 0;
  for (const auto& c : children) {
    if (c.pid < 0) {  // Spawn said why
      std::fprintf(stderr, "icecache cluster: %s did not start; stopping the cluster\n", c.name.c_str());
      exit_code = 1;
      g_stop = 1;
    }
  }
  auto started = std::chrono::steady_clock::now();
  while (!g_stop) {
    std::string how;
    if (Child* dead = Reap(children, &how)) {
      std::fprintf(stderr, "icecache cluster: %s %s; stopping the cluster\n", dead->name.c_str(), how.c_str());
      exit_code = 1;
      break;
    }
    if (!serving) {
      serving = router::CheckHealth(router, "", 1).ok();
      if (serving) {
        std::printf("icecache cluster: serving on %s (%d prefill, %d decode workers)\n", router.c_str(), num_prefill,
                    num_decode);
        std::fflush(stdout);
        if (once) break;
      } else if (std::chrono::steady_clock::now() - started > std::chrono::seconds(120)) {
        std::fprintf(stderr, "icecache cluster: router %s not healthy after 120 s\n", router.c_str());
        exit_code = 1;
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(serving ? 200 : 50));
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
