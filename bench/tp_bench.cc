// icecache-bench tp: tensor parallelism on CPU ranks (model/tensor_parallel.h), decode at batch
// 1: per-layer step time split into compute and collective (the all-reduces, waits included)
// for TP = 1 and TP = N in one run, and the ratio of TP = N's step time to TP = 1's. The group
// is the one `icecache generate --tensor-parallel N` runs (its per-rank CPU threads, the dense
// cache with its default options).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/workload.h"
#include "kernels/backend.h"
#include "model/tensor_parallel.h"
#include "parallel/communicator.h"

namespace icecache::bench {
namespace {

constexpr const char* kUsage =
    "usage: icecache-bench tp --model DIR [--tp N (2)] [--context C (128)] [--steps S (32)] [--threads T]\n"
    "                         [--json]\n";

struct TpRun {
  int tp = 1;
  double step_s = 0;                   // median decode step
  std::vector<double> collective_s;    // per rank, per step (mean)
};

StatusOr<TpRun> TimeTp(const std::string& dir, int tp, int context, int steps) {
  model::TpGroupOptions o;
  o.size = tp;
  o.device = {kernels::Backend::kCpu, 0};
  ICE_ASSIGN_OR_RETURN(std::unique_ptr<model::TpGroup> g, model::TpGroup::Load(dir, o));
  auto cache = g->NewDenseKvCache({});
  ICE_RETURN_IF_ERROR(cache->AddSequence(1));
  const int vocab = g->config().vocab_size;
  std::vector<int32_t> prompt(context);
  for (int i = 0; i < context; ++i) prompt[i] = (i * 37 + 11) % vocab;
  model::SequenceInput in{1, prompt};
  ICE_RETURN_IF_ERROR(g->Forward({&in, 1}, *cache, model::LogitsMode::kLastToken));
  const int warmup = 3;
  std::vector<double> times;
  std::vector<double> coll0(tp);
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) {
      for (int r = 0; r < tp; ++r) coll0[r] = g->collective_seconds(r);
    }
    const int32_t tok = (s * 13 + 5) % vocab;
    model::SequenceInput d{1, {&tok, 1}};
    const auto t0 = std::chrono::steady_clock::now();
    ICE_RETURN_IF_ERROR(g->Forward({&d, 1}, *cache, model::LogitsMode::kLastToken));
    if (s >= warmup) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  TpRun r;
  r.tp = tp;
  r.step_s = times[times.size() / 2];
  for (int k = 0; k < tp; ++k) r.collective_s.push_back((g->collective_seconds(k) - coll0[k]) / steps);
  return r;
}

// The CPU all-reduce alone: `tp` threads all-reducing `count` floats back to back; seconds per
// call (median of 5 rounds of `iters`). What a layer's collective costs without waiting for a
// slower rank.
StatusOr<double> TimeAllReduce(int tp, size_t count, int iters) {
  ICE_ASSIGN_OR_RETURN(auto comms, parallel::CreateCpuCommunicators(tp));
  std::vector<double> rounds;
  for (int round = 0; round < 5; ++round) {
    std::vector<Status> st(tp);
    std::vector<std::thread> th;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < tp; ++r) {
      th.emplace_back([&, r] {
        std::vector<float> buf(count, 1.f);
        for (int i = 0; i < iters && st[r].ok(); ++i) st[r] = comms[r]->AllReduceSum(buf.data(), count, kernels::DType::kF32);
      });
    }
    for (auto& t : th) t.join();
    for (const Status& s : st) ICE_RETURN_IF_ERROR(s);
    rounds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

int RunTp(int argc, char** argv) {
  std::string dir;
  int tp = 2, context = 128, steps = 32, threads = 0;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next_int = [&](int* v) {
      if (i + 1 >= argc) return false;
      *v = std::atoi(argv[++i]);
      return true;
    };
    bool ok = true;
    if (f == "--model" && i + 1 < argc) dir = argv[++i];
    else if (f == "--tp") ok = next_int(&tp) && tp >= 2;
    else if (f == "--context") ok = next_int(&context) && context >= 1;
    else if (f == "--steps") ok = next_int(&steps) && steps >= 1;
    else if (f == "--threads") ok = next_int(&threads) && threads >= 0;
    else if (f == "--json") json = true;
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "icecache-bench tp: bad option '%s'\n%s", f.c_str(), kUsage);
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "icecache-bench tp: --model is required (make one with icecache make-model)\n%s", kUsage);
    return 2;
  }
  if (threads > 0) kernels::SetCpuThreads(threads);
  std::vector<TpRun> runs;
  int layers = 0;
  for (int n : {1, tp}) {
    auto r = TimeTp(dir, n, context, steps);
    if (!r.ok()) {
      std::fprintf(stderr, "icecache-bench tp: TP=%d: %s\n", n, r.status().ToString().c_str());
      return 1;
    }
    runs.push_back(*r);
  }
  {
    auto cfg = model::TpGroup::Load(dir, {.size = 1, .devices = {}, .device = {kernels::Backend::kCpu, 0}});
    if (!cfg.ok()) return 1;
    layers = (*cfg)->config().num_layers;
  }
  int hidden = 0;
  {
    auto cfg = model::TpGroup::Load(dir, {.size = 1, .devices = {}, .device = {kernels::Backend::kCpu, 0}});
    if (cfg.ok()) hidden = (*cfg)->config().hidden_size;
  }
  auto alone = TimeAllReduce(tp, static_cast<size_t>(hidden), 2000);
  if (!alone.ok()) {
    std::fprintf(stderr, "icecache-bench tp: %s\n", alone.status().ToString().c_str());
    return 1;
  }
  nlohmann::json out = {{"workload", "tp"}, {"model", dir}, {"context", context}, {"steps", steps},
                        {"cpu_threads", kernels::CpuThreads()}, {"layers", layers},
                        {"allreduce_alone_us", *alone * 1e6}, {"hidden", hidden}, {"runs", nlohmann::json::array()}};
  const double base = runs[0].step_s;
  if (!json) {
    std::printf("decode batch 1, context %d, %d steps (median), %d layers, %d CPU threads in all\n", context, steps,
                layers, kernels::CpuThreads());
    std::printf("%4s %10s %12s %14s %14s %10s %12s\n", "TP", "step ms", "layer ms", "compute/layer", "collect/layer",
                "coll %", "step / TP1");
  }
  for (const TpRun& r : runs) {
    const double coll = *std::max_element(r.collective_s.begin(), r.collective_s.end());
    const double coll0 = r.collective_s[0];
    const double layer = r.step_s / layers;
    out["runs"].push_back({{"tp", r.tp},
                           {"step_ms", r.step_s * 1e3},
                           {"layer_ms", layer * 1e3},
                           {"collective_per_layer_ms_rank0", coll0 / layers * 1e3},
                           {"collective_per_layer_ms_max", coll / layers * 1e3},
                           {"compute_per_layer_ms", (r.step_s - coll0) / layers * 1e3},
                           {"collective_fraction_rank0", coll0 / r.step_s},
                           {"step_ratio_vs_tp1", r.step_s / base}});
    if (!json) {
      std::printf("%4d %10.3f %12.4f %14.4f %14.4f %9.1f%% %12.2f\n", r.tp, r.step_s * 1e3, layer * 1e3,
                  (r.step_s - coll0) / layers * 1e3, coll0 / layers * 1e3, 100 * coll0 / r.step_s, r.step_s / base);
    }
  }
  if (!json) {
    std::printf("all-reduce of %d floats over %d CPU ranks alone: %.2f us per call (2 per layer)\n", hidden, tp,
                *alone * 1e6);
  }
  if (json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("tp", "tensor parallelism on CPU ranks: per-layer compute vs collective, TP=1 vs TP=N", RunTp);

}  // namespace icecache::bench
