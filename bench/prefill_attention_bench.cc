// Workload "prefill-attention" of icecache-bench: causal prefill attention over one layer (a
// whole prompt, q_len == kv_len), the tiled CPU kernel against the row-by-row kernel it replaced,
// on the same inputs in the same run; where the serving default allows bf16 products
// (PrefillAttentionParams::bf16 as the model sets it: MatmulPrecision bf16) and the CPU has a
// bf16 form (AMX tiles), that form too, against the fp32 tiled kernel. Reports time (wall and
// process CPU), GFLOP/s (4·d FLOPs per visible (query head, key) pair) and the largest
// differences between the outputs.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/cpu_time.h"
#include "bench/workload.h"
#include "kernels/attention.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/prefill_attention_cpu.h"
#include "kernels/matmul.h"

namespace icecache::bench {
namespace {

struct Timing {
  double wall = 1e30, cpu = 1e30;  // best of the repetitions
};

template <typename F>
Timing Time(int reps, F&& f) {
  Timing t;
  for (int r = 0; r < reps; ++r) {
    const auto w0 = std::chrono::steady_clock::now();
    const double c0 = ProcessCpuSeconds();
    f();
    t.cpu = std::min(t.cpu, ProcessCpuSeconds() - c0);
    t.wall = std::min(t.wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
  }
  return t;
}

int Run(int argc, char** argv) {
  int len = 4096, hq = 32, hkv = 8, d = 128, reps = 2;
  bool json = false, skip_baseline = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--len") len = next();
    else if (a == "--q-heads") hq = next();
    else if (a == "--kv-heads") hkv = next();
    else if (a == "--head-dim") d = next();
    else if (a == "--reps") reps = next();
    else if (a == "--json") json = true;
    else if (a == "--no-baseline") skip_baseline = true;
    else {
      std::fprintf(stderr,
                   "usage: icecache-bench prefill-attention [--len N] [--q-heads H] [--kv-heads K] [--head-dim D]\n"
                   "       [--reps R] [--no-baseline] [--json]\n");
      return 2;
    }
  }
  if (len < 1 || hq < 1 || hkv < 1 || hq % hkv != 0 || d < 1 || reps < 1) {
    std::fprintf(stderr, "prefill-attention: need len, heads, head-dim, reps >= 1 and q-heads a multiple of kv-heads\n");
    return 2;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> q(static_cast<size_t>(len) * hq * d), k(static_cast<size_t>(len) * hkv * d), v(k.size());
  for (auto& x : q) x = u(rng);
  for (auto& x : k) x = 2.f * u(rng);
  for (auto& x : v) x = u(rng);
  std::vector<float> out_tiled(q.size()), out_rows(q.size());
  kernels::PrefillAttentionParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.q_len = p.kv_len = len;
  p.num_q_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = d;
  p.scale = 1.f / std::sqrt(static_cast<float>(d));
  const double flops = 4.0 * d * hq * (static_cast<double>(len) * (len + 1) / 2);
  p.out = out_tiled.data();
  const Timing tiled = Time(reps, [&] { (void)kernels::cpu::PrefillAttention(p); });
  // The serving call (model/dense_kv_cache.cc, over the cluster's default bf16 KV cache): bf16
  // products where MatmulPrecision allows them; timed separately where that selects the AMX form.
  kernels::PrefillAttentionParams b = p;
  b.bf16 = kernels::UseBf16Attention(kernels::DType::kBF16);
  const bool bf16_form = kernels::cpu::PrefillAttentionOnAmx(b);
  Timing amx;
  double amx_diff = 0;
  if (bf16_form) {
    std::vector<float> out_amx(q.size());
    b.out = out_amx.data();
    amx = Time(reps, [&] { (void)kernels::cpu::PrefillAttention(b); });
    for (size_t i = 0; i < q.size(); ++i) amx_diff = std::max<double>(amx_diff, std::fabs(out_amx[i] - out_tiled[i]));
  }
  Timing rows;
  double max_diff = 0;
  if (!skip_baseline) {
    p.out = out_rows.data();
    rows = Time(reps, [&] { (void)kernels::cpu::PrefillAttentionRowwise(p); });
    for (size_t i = 0; i < q.size(); ++i) max_diff = std::max<double>(max_diff, std::fabs(out_tiled[i] - out_rows[i]));
  }
  nlohmann::json j = {{"len", len},
                      {"q_heads", hq},
                      {"kv_heads", hkv},
                      {"head_dim", d},
                      {"tiled_wall_s", tiled.wall},
                      {"tiled_cpu_s", tiled.cpu},
                      {"tiled_gflops_per_cpu_s", flops / tiled.cpu * 1e-9}};
  if (bf16_form) {
    j["bf16_amx_wall_s"] = amx.wall;
    j["bf16_amx_cpu_s"] = amx.cpu;
    j["bf16_amx_gflops_per_cpu_s"] = flops / amx.cpu * 1e-9;
    j["bf16_amx_speedup_cpu"] = tiled.cpu / amx.cpu;
    j["bf16_amx_max_abs_diff"] = amx_diff;
  }
  if (!skip_baseline) {
    j["rowwise_wall_s"] = rows.wall;
    j["rowwise_cpu_s"] = rows.cpu;
    j["rowwise_gflops_per_cpu_s"] = flops / rows.cpu * 1e-9;
    j["speedup_cpu"] = rows.cpu / tiled.cpu;
    j["speedup_wall"] = rows.wall / tiled.wall;
    j["max_abs_diff"] = max_diff;
  }
  if (json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("prefill attention len %d, %d q / %d kv heads, d %d (best of %d)\n", len, hq, hkv, d, reps);
    std::printf("  tiled   : %.3f s wall, %.3f s CPU, %.1f GFLOP per CPU-second\n", tiled.wall, tiled.cpu,
                flops / tiled.cpu * 1e-9);
    if (bf16_form) {
      std::printf("  bf16 AMX: %.3f s wall, %.3f s CPU, %.1f GFLOP per CPU-second; %.2fx the tiled fp32 kernel by CPU,"
                  " %.2fx wall; max |bf16 - fp32| = %.2e\n",
                  amx.wall, amx.cpu, flops / amx.cpu * 1e-9, tiled.cpu / amx.cpu, tiled.wall / amx.wall, amx_diff);
    }
    if (!skip_baseline) {
      std::printf("  rowwise : %.3f s wall, %.3f s CPU, %.1f GFLOP per CPU-second\n", rows.wall, rows.cpu,
                  flops / rows.cpu * 1e-9);
      std::printf("  speedup : %.2fx CPU, %.2fx wall; max |tiled - rowwise| = %.2e\n", rows.cpu / tiled.cpu,
                  rows.wall / tiled.wall, max_diff);
    }
  }
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("prefill-attention", "causal prefill attention: tiled CPU kernel vs row-by-row (and its AMX bf16 form)", Run);

}  // namespace icecache::bench
