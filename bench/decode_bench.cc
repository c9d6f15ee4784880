// icecache-bench decode: single-sequence decode speed against the memory-bandwidth roofline
// (weight bytes per token / read bandwidth measured here), batched decode throughput against
// batch 1, and prefill throughput.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/workload.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "model/dense_kv_cache.h"
#include "model/model.h"

namespace icecache::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// CPU seconds used by the whole process (all threads) so far. On a shared machine wall time
// includes waiting for a core; CPU time per step shows the work itself.
double ProcessCpuSeconds() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// Read bandwidth (bytes/s) of summing a buffer much larger than the caches, with the threads
// the kernels use; best of several passes. Integer sums so the compiler vectorises the loop
// (a float reduction would be latency-bound, not bandwidth-bound).
double MeasureReadBandwidth(size_t bytes, int passes, int threads) {
  const size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (size_t i = 0; i < n; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;
  double best = 0;
  volatile uint64_t sink = 0;
  for (int p = 0; p < passes; ++p) {
    auto t0 = Clock::now();
    uint64_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) num_threads(threads)
    for (size_t i = 0; i < n; ++i) total += buf[i];
    auto t1 = Clock::now();
    sink = sink + total;
    best = std::max(best, static_cast<double>(bytes) / Seconds(t0, t1));
  }
  return best;
}

struct DecodeResult {
  double tokens_per_s = 0;  // generated tokens (all sequences) per second
  double step_ms = 0;
  double cpu_ms_per_step = 0;  // process CPU time per step, all threads
};

// Prefills `batch` random prompts into a dense KV cache of `kv_dtype`, runs `warmup` untimed
// steps, then times `steps` batched steps.
StatusOr<DecodeResult> TimeDecode(model::Model& m, int batch, int prompt_len, int steps, int warmup,
                                  const model::DenseKvCacheOptions& kv_options) {
  model::DenseKvCache cache(m.attention_shape(), kv_options);
  std::mt19937 rng(batch);
  const int vocab = m.config().vocab_size;
  std::vector<std::vector<int32_t>> prompts(batch, std::vector<int32_t>(prompt_len));
  std::vector<model::SequenceInput> inputs;
  for (int b = 0; b < batch; ++b) {
    for (int32_t& t : prompts[b]) t = static_cast<int32_t>(rng() % (vocab - 2));
    ICE_RETURN_IF_ERROR(cache.AddSequence(b));
    inputs.push_back({static_cast<model::SequenceId>(b), prompts[b]});
  }
  std::vector<float> logits;
  ICE_RETURN_IF_ERROR(m.Forward(inputs, cache, model::LogitsMode::kLastToken, &logits));
  std::vector<int32_t> next(batch);
  auto step = [&]() -> Status {
    for (int b = 0; b < batch; ++b) {
      const float* row = logits.data() + static_cast<size_t>(b) * vocab;
      next[b] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      inputs[b].tokens = std::span<const int32_t>(&next[b], 1);
    }
    return m.Forward(inputs, cache, model::LogitsMode::kLastToken, &logits);
  };
  for (int i = 0; i < warmup; ++i) ICE_RETURN_IF_ERROR(step());
  auto t0 = Clock::now();
  const double c0 = ProcessCpuSeconds();
  for (int i = 0; i < steps; ++i) ICE_RETURN_IF_ERROR(step());
  const double s = Seconds(t0, Clock::now());
  DecodeResult r;
  r.cpu_ms_per_step = 1e3 * (ProcessCpuSeconds() - c0) / steps;
  r.tokens_per_s = static_cast<double>(batch) * steps / s;
  r.step_ms = 1e3 * s / steps;
  return r;
}

struct PrefillResult {
  double tokens_per_s = 0;      // wall
  double tokens_per_cpu_s = 0;  // process CPU time (all threads): the figure to trust on a shared machine
};

StatusOr<PrefillResult> TimePrefill(model::Model& m, int len, const model::DenseKvCacheOptions& kv_options) {
  model::DenseKvCache cache(m.attention_shape(), kv_options);
  std::mt19937 rng(7);
  std::vector<int32_t> ids(len);
  for (int32_t& t : ids) t = static_cast<int32_t>(rng() % (m.config().vocab_size - 2));
  std::vector<float> logits;
  ICE_RETURN_IF_ERROR(cache.AddSequence(0));
  model::SequenceInput in{0, ids};
  auto t0 = Clock::now();
  const double c0 = ProcessCpuSeconds();
  ICE_RETURN_IF_ERROR(m.Forward({&in, 1}, cache, model::LogitsMode::kLastToken, &logits));
  PrefillResult r;
  r.tokens_per_s = len / Seconds(t0, Clock::now());
  r.tokens_per_cpu_s = len / (ProcessCpuSeconds() - c0);
  return r;
}

constexpr const char* kUsage =
    "usage: icecache-bench decode --model DIR [--batch B (8)] [--prompt-len N (128)] [--steps S (32)]\n"
    "                             [--prefill-len P (2048; 0 = skip)] [--threads T]\n"
    "                             [--kv-dtype bf16|f16|f32 (bf16, the cluster's cache.kv_dtype default)]\n"
    "                             [--page-size N (DenseKvCache default)] [--json]\n";


int RunDecode(int argc, char** argv) {
  std::string dir;
  int batch = 8, prompt_len = 128, steps = 32, prefill_len = 2048, threads = 0;
  bool json = false;
  kernels::DType kv_dtype = kernels::DType::kBF16;
  int page_size = model::DenseKvCacheOptions().page_size;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next_int = [&](int* v) {
      if (i + 1 >= argc) return false;
      *v = std::atoi(argv[++i]);
      return true;
    };
    bool ok = true;
    if (f == "--model" && i + 1 < argc) dir = argv[++i];
    else if (f == "--batch") ok = next_int(&batch) && batch >= 1;
    else if (f == "--prompt-len") ok = next_int(&prompt_len) && prompt_len >= 1;
    else if (f == "--steps") ok = next_int(&steps) && steps >= 1;
    else if (f == "--prefill-len") ok = next_int(&prefill_len) && prefill_len >= 0;
    else if (f == "--threads") ok = next_int(&threads) && threads >= 0;
    else if (f == "--kv-dtype") {
      auto t = i + 1 < argc ? kernels::ParseDType(argv[++i]) : StatusOr<kernels::DType>(InvalidArgumentError(""));
      ok = t.ok();
      if (ok) kv_dtype = *t;
    }
    else if (f == "--page-size") ok = next_int(&page_size) && page_size >= 1;
    else if (f == "--json") json = true;
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "icecache-bench decode: bad option '%s'\n%s", f.c_str(), kUsage);
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "icecache-bench decode: --model is required (make one with icecache make-model)\n%s", kUsage);
    return 2;
  }
  if (threads > 0) kernels::SetCpuThreads(threads);
  auto loaded = model::Model::Load(dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "icecache-bench decode: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  model::Model& m = **loaded;
  const double bw = MeasureReadBandwidth(size_t{1} << 30, 5, kernels::CpuThreads());
  const double weight_bytes = static_cast<double>(m.decode_weight_bytes());
  const double roofline = bw / weight_bytes;
  const int warmup = 3;
  model::DenseKvCacheOptions kv_options;
  kv_options.kv_dtype = kv_dtype;
  kv_options.page_size = page_size;
  auto one = TimeDecode(m, 1, prompt_len, steps, warmup, kv_options);
  auto many = batch > 1 ? TimeDecode(m, batch, prompt_len, steps, warmup, kv_options) : one;
  if (!one.ok() || !many.ok()) {
    std::fprintf(stderr, "icecache-bench decode: %s\n", (!one.ok() ? one.status() : many.status()).ToString().c_str());
    return 1;
  }
  double prefill_tps = 0, prefill_tps_cpu = 0;
  if (prefill_len > 0) {
    auto p = TimePrefill(m, prefill_len, kv_options);
    if (!p.ok()) {
      std::fprintf(stderr, "icecache-bench decode: prefill: %s\n", p.status().ToString().c_str());
      return 1;
    }
    prefill_tps = p->tokens_per_s;
    prefill_tps_cpu = p->tokens_per_cpu_s;
  }
  const auto& c = m.config();
  // K and V of one cached token, all layers: what decode attention reads per context token.
  const double kv_bytes_per_token = 2.0 * c.num_layers * c.num_kv_heads * c.head_dim *
                                    static_cast<double>(kernels::DTypeSize(kv_dtype));
  nlohmann::json r = {
      {"workload", "decode"},
      {"model", dir},
      {"arch", std::string(model::ArchitectureName(c.arch))},
      {"hidden", c.hidden_size},
      {"layers", c.num_layers},
      {"weight_dtype", c.torch_dtype},
      {"threads", kernels::CpuThreads()},
      {"kv_dtype", std::string(kernels::DTypeName(kv_dtype))},
      {"kv_page_size", page_size},
      {"kv_bytes_per_token", kv_bytes_per_token},
      {"decode_weight_bytes", weight_bytes},
      {"read_bandwidth_gb_s", bw / 1e9},
      {"roofline_tokens_per_s", roofline},
      {"prompt_len", prompt_len},
      {"steps", steps},
      {"batch1_tokens_per_s", one->tokens_per_s},
      {"batch1_step_ms", one->step_ms},
      {"batch1_cpu_ms_per_step", one->cpu_ms_per_step},
      {"batch1_fraction_of_roofline", one->tokens_per_s / roofline},
      {"batch", batch},
      {"batchB_tokens_per_s", many->tokens_per_s},
      {"batchB_step_ms", many->step_ms},
      {"batchB_cpu_ms_per_step", many->cpu_ms_per_step},
      {"batchB_speedup_vs_batch1", many->tokens_per_s / one->tokens_per_s},
      {"prefill_len", prefill_len},
      {"prefill_tokens_per_s", prefill_tps},
      {"prefill_tokens_per_cpu_s", prefill_tps_cpu},
  };
  if (json) {
    std::printf("%s\n", r.dump().c_str());
    return 0;
  }
  std::printf("decode: %s, hidden %d, %d layers, %s weights, %s KV cache (pages of %d), %d threads\n", dir.c_str(),
              c.hidden_size, c.num_layers, c.torch_dtype.c_str(), std::string(kernels::DTypeName(kv_dtype)).c_str(),
              page_size, kernels::CpuThreads());
  std::printf("  KV read per context token %.1f KB (batch %d at %d tokens: %.1f MB per step)\n",
              kv_bytes_per_token / 1e3, batch, prompt_len + warmup + steps,
              kv_bytes_per_token * batch * (prompt_len + warmup + steps) / 1e6);
  std::printf("  weights read per token   %.1f MB; read bandwidth %.1f GB/s -> roofline %.1f tok/s\n",
              weight_bytes / 1e6, bw / 1e9, roofline);
  std::printf("  batch 1  decode          %.1f tok/s (%.2f ms/step, %.1f CPU-ms/step) = %.0f %% of roofline\n",
              one->tokens_per_s, one->step_ms, one->cpu_ms_per_step, 100 * one->tokens_per_s / roofline);
  std::printf("  batch %-2d decode          %.1f tok/s (%.2f ms/step, %.1f CPU-ms/step) = %.2fx batch 1\n", batch,
              many->tokens_per_s, many->step_ms, many->cpu_ms_per_step, many->tokens_per_s / one->tokens_per_s);
  if (prefill_len > 0) {
    std::printf("  prefill %d tokens       %.1f tok/s (%.1f tok per CPU-second)\n", prefill_len, prefill_tps,
                prefill_tps_cpu);
  }
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("decode", "model decode tok/s vs memory roofline, batch-B vs batch-1, prefill tok/s", RunDecode);

}  // namespace icecache::bench
