// icecache-bench sampler: the cost of one Sampler::Sample call (the serving sampler, its defaults)
// over a logits row of --vocab entries on --device, for the sampling options of the OpenAI API:
// greedy (the baseline of the ratios), frequency / presence penalties over --generated tokens,
// logprobs with 0 / 5 / 20 top entries, and a seeded temperature + top-p draw with and without
// them. Reports the median wall and thread-CPU microseconds per call of --iters calls and the
// ratios to greedy (CPU time is the figure to trust on a shared machine).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/cpu_time.h"
#include "bench/workload.h"
#include "kernels/backend.h"
#include "kernels/device_buffer.h"
#include "kernels/simd_target.h"
#include "model/sampler.h"

namespace icecache::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: icecache-bench sampler [--vocab V (49152)] [--generated G (256)] [--iters N (2000)]\n"
    "                              [--device auto|cpu|cuda:N] [--json]\n";

struct Case {
  const char* name;
  model::SamplingParams params;
};

int RunSampler(int argc, char** argv) {
  int vocab = 49152, generated = 256, iters = 2000;
  bool json = false;
  kernels::Device device{kernels::Backend::kAuto, 0};
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next_int = [&](int* out) {
      if (i + 1 >= argc) return false;
      *out = std::atoi(argv[++i]);
      return true;
    };
    bool ok = true;
    if (f == "--vocab") ok = next_int(&vocab) && vocab >= 32;
    else if (f == "--generated") ok = next_int(&generated) && generated >= 1;
    else if (f == "--iters") ok = next_int(&iters) && iters >= 10;
    else if (f == "--json") json = true;
    else if (f == "--device" && i + 1 < argc) {
      auto d = kernels::ParseDevice(argv[++i]);
      ok = d.ok();
      if (ok) device = *d;
    } else if (f == "--help" || f == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "icecache-bench sampler: bad option %s\n%s", f.c_str(), kUsage);
      return 2;
    }
  }
  device = kernels::ResolveDevice(device);
  // A logits row shaped like a model's (a few large values over a normal bulk), on the device.
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 3.f);
  std::vector<float> host(vocab);
  for (float& x : host) x = dist(rng);
  auto row = kernels::DeviceBuffer::Upload(device.backend, host.data(), host.size() * sizeof(float));
  if (!row.ok()) {
    std::fprintf(stderr, "icecache-bench sampler: %s\n", row.status().ToString().c_str());
    return 1;
  }
  std::vector<int32_t> context(generated);
  for (auto& id : context) id = static_cast<int32_t>(rng() % 2000);  // repeats, as text has
  const std::span<const float> logits(row->as<const float>(), static_cast<size_t>(vocab));

  std::vector<Case> cases;
  auto add = [&](const char* name, auto&& set) {
    model::SamplingParams p;
    set(p);
    cases.push_back({name, p});
  };
  add("greedy", [](model::SamplingParams&) {});
  add("greedy+penalties", [](model::SamplingParams& p) {
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.5f;
  });
  add("greedy+logprobs0", [](model::SamplingParams& p) { p.logprobs = 0; });
  add("greedy+logprobs5", [](model::SamplingParams& p) { p.logprobs = 5; });
  add("greedy+logprobs20", [](model::SamplingParams& p) { p.logprobs = 20; });
  add("temperature1 (OpenAI default)", [](model::SamplingParams& p) {  // top_p 1, no top_k
    p.temperature = 1.f;
    p.seed = 1;
  });
  add("top_p", [](model::SamplingParams& p) {
    p.temperature = 0.8f;
    p.top_p = 0.95f;
    p.seed = 1;
  });
  add("top_p+penalties+logprobs5", [](model::SamplingParams& p) {
    p.temperature = 0.8f;
    p.top_p = 0.95f;
    p.seed = 1;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.5f;
    p.logprobs = 5;
  });

  std::vector<double> median_us(cases.size()), median_cpu_us(cases.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    model::Sampler sampler(cases[c].params, device);
    std::vector<double> us(iters), cpu(iters);
    for (int i = 0; i < iters + 20; ++i) {  // 20 warm-up calls
      const double c0 = ThreadCpuUs();
      const auto t0 = Clock::now();
      auto tok = sampler.Sample(logits, context, context.size());
      const auto t1 = Clock::now();
      const double c1 = ThreadCpuUs();
      if (!tok.ok()) {
        std::fprintf(stderr, "icecache-bench sampler: %s\n", tok.status().ToString().c_str());
        return 1;
      }
      if (i >= 20) {
        us[i - 20] = std::chrono::duration<double, std::micro>(t1 - t0).count();
        cpu[i - 20] = c1 - c0;
      }
    }
    std::nth_element(us.begin(), us.begin() + iters / 2, us.end());
    std::nth_element(cpu.begin(), cpu.begin() + iters / 2, cpu.end());
    median_us[c] = us[iters / 2];
    median_cpu_us[c] = cpu[iters / 2];
  }
  const std::string target(kernels::SimdTargetName(kernels::ActiveSimdTarget()));
  if (json) {
    nlohmann::json j = {{"workload", "sampler"}, {"device", kernels::DeviceName(device)}, {"simd", target},
                        {"vocab", vocab}, {"generated", generated}, {"iters", iters}};
    for (size_t c = 0; c < cases.size(); ++c) {
      j["cases"][cases[c].name] = {{"median_us", median_us[c]}, {"median_cpu_us", median_cpu_us[c]},
                                   {"cpu_vs_greedy", median_cpu_us[c] / median_cpu_us[0]}};
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("sampler on %s (SIMD %s), vocab %d, %d generated tokens in the context, median of %d calls\n",
              kernels::DeviceName(device).c_str(), target.c_str(), vocab, generated, iters);
  std::printf("%-28s %12s %12s %14s\n", "case", "wall us", "CPU us", "CPU vs greedy");
  for (size_t c = 0; c < cases.size(); ++c) {
    std::printf("%-32s %12.1f %12.1f %14.2f\n", cases[c].name, median_us[c], median_cpu_us[c],
                median_cpu_us[c] / median_cpu_us[0]);
  }
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("sampler", "Sampler::Sample cost: penalties and logprobs against greedy", RunSampler);

}  // namespace icecache::bench
