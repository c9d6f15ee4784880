// icecache-bench decode: single-sequence decode speed against the memory-bandwidth roofline
// (weight bytes per token / read bandwidth measured here), batched decode throughput against
// batch 1, and prefill throughput, on a chosen device (--device). With --budget-pages B the
// decode steps run IceCache through decode::IceCacheBackend (the decode worker's backend: host
// selection, device page cache, paged attention on the device) instead of dense attention, and
// the step time is split into its parts (IceCacheTimings) with the page cache's hit rate and
// host→device bytes.
#include <omp.h>

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

#include "bench/cpu_time.h"
#include "bench/workload.h"
#include "decode_worker/icecache_backend.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "kvstore/dci_tree.h"
#include "kvstore/page_pool.h"
#include "kvstore/retriever.h"
#include "kvstore/sequence_cache.h"
#include "model/dense_kv_cache.h"
#include "model/model.h"
#include "model/sampler.h"

namespace icecache::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

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
  // IceCache only: per-step split (ms) and the device page cache.
  decode::IceCacheTimings split;
  decode::DevicePageCacheStats cache;
};

// IceCache decode (--budget-pages): the layout the cluster serves (cache.* defaults).
struct SparseOptions {
  int budget_pages = 0;        // 0 = dense decode
  // The layout defaults are kvstore's (the cluster's cache.* defaults are the same values).
  int dense_layers = kvstore::SequenceCacheOptions{}.dense_layers;
  int sink_pages = kvstore::SequenceCacheOptions{}.sink_pages;
  int window_pages = kvstore::SequenceCacheOptions{}.window_pages;
  int ice_group = kvstore::SequenceCacheOptions{}.ice_group;
  int device_cache_pages = 0;  // 0: none on the CPU, min(pool, 65536) on a GPU (as the decode worker)
  bool rest_estimate = kvstore::RetrievalPolicy{}.estimate_rest;  // cache.rest_estimate
  int rest_cells = kvstore::RetrievalPolicy{}.rest_cells;         // cache.rest_cells
};

// Prefills `batch` random prompts densely on the model's device, builds each into an IceCache
// SequenceCache from the prefilled K/V (as a prefill worker does), imports them into an
// IceCacheBackend and times `steps` greedy decode steps after `warmup`.
StatusOr<DecodeResult> TimeSparseDecode(model::Model& m, int batch, int prompt_len, int steps, int warmup,
                                        kernels::DType kv_dtype, int page_size, const SparseOptions& so) {
  const auto shape = m.attention_shape();
  const int vocab = m.config().vocab_size;
  const int64_t per_seq = static_cast<int64_t>(shape.num_layers) * shape.num_kv_heads *
                          ((prompt_len + warmup + steps) / page_size + 8) * 3 / 2;
  kvstore::PagePoolOptions po;
  po.page_size = page_size;
  po.head_dim = shape.head_dim;
  po.dtype = kv_dtype;
  po.num_pages = per_seq * batch + 1024;
  ICE_ASSIGN_OR_RETURN(auto pool, kvstore::PagePool::Create(po));
  ICE_ASSIGN_OR_RETURN(auto pinned, kernels::PinnedHostRegion::Register(m.device().backend, pool->base(),
                                                                         pool->capacity_bytes()));
  decode::IceCacheBackendOptions bo;
  bo.device = m.device();
  bo.device_cache_pages = so.device_cache_pages;
  if (bo.device_cache_pages == 0 && !kernels::MemoryIsHost(m.device().backend)) {
    bo.device_cache_pages = static_cast<int>(std::min<int64_t>(po.num_pages, 65536));
  }
  ICE_ASSIGN_OR_RETURN(auto backend, decode::IceCacheBackend::Create(shape, pool.get(), bo));
  ICE_ASSIGN_OR_RETURN(kvstore::DciParams dci, kvstore::DciParamsPreset(kvstore::kServingDciPreset));
  std::mt19937 rng(batch);
  std::vector<int32_t> next(batch);
  std::vector<model::SequenceInput> inputs(batch);
  model::SamplingParams greedy;
  model::Sampler sampler(greedy, m.device());
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> prompt(prompt_len);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % (vocab - 2));
    model::DenseKvCacheOptions kv;
    kv.device = m.device();
    kv.kv_dtype = kv_dtype;
    kv.page_size = page_size;
    model::DenseKvCache dense(shape, kv);
    ICE_RETURN_IF_ERROR(dense.AddSequence(0));
    model::SequenceInput in{0, prompt};
    ICE_RETURN_IF_ERROR(m.Forward({&in, 1}, dense, model::LogitsMode::kLastToken));
    ICE_ASSIGN_OR_RETURN(next[b], sampler.Sample({m.logits(), static_cast<size_t>(vocab)}, {}));
    // K/V back to the host as [n, kv_heads, head_dim] per layer, then the IceCache build.
    const size_t row = static_cast<size_t>(shape.num_kv_heads) * shape.head_dim;
    std::vector<std::vector<float>> k(shape.num_layers, std::vector<float>(prompt_len * row)), v = k;
    for (int l = 0; l < shape.num_layers; ++l) ICE_RETURN_IF_ERROR(dense.ReadLayerKv(0, l, k[l].data(), v[l].data()));
    kvstore::SequenceCacheOptions co;
    co.num_layers = shape.num_layers;
    co.num_kv_heads = shape.num_kv_heads;
    co.dense_layers = so.dense_layers;
    co.sink_pages = so.sink_pages;
    co.window_pages = so.window_pages;
    co.ice_group = so.ice_group;
    co.dci = dci;
    ICE_ASSIGN_OR_RETURN(auto cache, kvstore::SequenceCache::Create(co, pool.get()));
    std::vector<const float*> kp, vp;
    for (int l = 0; l < shape.num_layers; ++l) {
      kp.push_back(k[l].data());
      vp.push_back(v[l].data());
    }
    ICE_RETURN_IF_ERROR(cache->Build(kp.data(), vp.data(), prompt_len));
    kvstore::RetrievalPolicy policy;
    policy.budget_pages = so.budget_pages;
    policy.estimate_rest = so.rest_estimate;
    policy.rest_cells = so.rest_cells;
    ICE_RETURN_IF_ERROR(backend->Import(b, std::move(cache), policy));
    inputs[b].seq_id = b;
  }
  auto step = [&]() -> Status {
    for (int b = 0; b < batch; ++b) inputs[b].tokens = std::span<const int32_t>(&next[b], 1);
    ICE_RETURN_IF_ERROR(m.Forward(inputs, *backend, model::LogitsMode::kLastToken));
    for (int b = 0; b < batch; ++b) {
      ICE_ASSIGN_OR_RETURN(next[b], sampler.Sample({m.logits() + static_cast<size_t>(b) * vocab,
                                                    static_cast<size_t>(vocab)}, {}));
    }
    return Status::Ok();
  };
  for (int i = 0; i < warmup; ++i) ICE_RETURN_IF_ERROR(step());
  const decode::IceCacheTimings t_before = backend->timings();
  const decode::DevicePageCacheStats c_before = backend->device_cache_stats();
  auto t0 = Clock::now();
  const double c0 = ProcessCpuSeconds();
  for (int i = 0; i < steps; ++i) ICE_RETURN_IF_ERROR(step());
  const double s = Seconds(t0, Clock::now());
  DecodeResult r;
  r.cpu_ms_per_step = 1e3 * (ProcessCpuSeconds() - c0) / steps;
  r.tokens_per_s = static_cast<double>(batch) * steps / s;
  r.step_ms = 1e3 * s / steps;
  const decode::IceCacheTimings& t = backend->timings();
  auto per_step_ms = [&](double after, double before) { return 1e3 * (after - before) / steps; };
  r.split.kv_to_host = per_step_ms(t.kv_to_host, t_before.kv_to_host);
  r.split.selection = per_step_ms(t.selection, t_before.selection);
  r.split.gather = per_step_ms(t.gather, t_before.gather);
  r.split.attention = per_step_ms(t.attention, t_before.attention);
  r.split.append = per_step_ms(t.append, t_before.append);
  r.split.steps = steps;
  const decode::DevicePageCacheStats c = backend->device_cache_stats();
  r.cache.hits = c.hits - c_before.hits;
  r.cache.misses = c.misses - c_before.misses;
  r.cache.h2d_bytes = c.h2d_bytes - c_before.h2d_bytes;
  r.cache.slots = c.slots;
  r.cache.bytes = c.bytes;
  return r;
}

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
    "usage: icecache-bench decode --model DIR [--batch B (8)] [--prompt-len|--context N (128)] [--steps S (32)]\n"
    "                             [--prefill-len P (2048; 0 = skip)] [--threads T] [--device auto|cpu|cuda:N]\n"
    "                             [--gguf-weights keep|bf16 (keep: a GGUF's Q8_0/Q4_0/Q4_1 blocks, the default)]\n"
    "                             [--kv-dtype bf16|f16|f32 (bf16, the cluster's cache.kv_dtype default)]\n"
    "                             [--page-size N (DenseKvCache default)] [--json]\n"
    "                             [--budget-pages B (0 = dense; else IceCache decode, sink and window included)]\n"
    "                             [--dense-layers N (2)] [--ice-group G (1)] [--device-cache-pages P (0: the decode worker's rule)]\n"
    "                             [--rest-estimate on|off] [--rest-cells N] (cache.rest_*; default: the serving ones)\n"
    "                             [--check-args (parse and check the options, then exit 0: no model, no device)]\n";


int RunDecode(int argc, char** argv) {
  std::string dir;
  int batch = 8, prompt_len = 128, steps = 32, prefill_len = 2048, threads = 0;
  bool json = false;
  kernels::DType kv_dtype = kernels::DType::kBF16;
  int page_size = model::DenseKvCacheOptions().page_size;
  kernels::Device device;
  model::GgufWeights gguf_weights = model::GgufWeights::kKeep;
  SparseOptions so;
  bool check_args = false;
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
    else if (f == "--prompt-len" || f == "--context") ok = next_int(&prompt_len) && prompt_len >= 1;
    else if (f == "--budget-pages") ok = next_int(&so.budget_pages) && so.budget_pages >= 0;
    else if (f == "--dense-layers") ok = next_int(&so.dense_layers) && so.dense_layers >= 0;
    else if (f == "--ice-group") ok = next_int(&so.ice_group) && so.ice_group >= 1;
    else if (f == "--device-cache-pages") ok = next_int(&so.device_cache_pages) && so.device_cache_pages >= 0;
    else if (f == "--rest-cells") ok = next_int(&so.rest_cells) && so.rest_cells >= 0;
    else if (f == "--rest-estimate" && i + 1 < argc) {
      const std::string v = argv[++i];
      ok = v == "on" || v == "off";
      so.rest_estimate = v == "on";
    }
    else if (f == "--gguf-weights") {
      auto w = i + 1 < argc ? model::ParseGgufWeights(argv[++i]) : StatusOr<model::GgufWeights>(InvalidArgumentError(""));
      ok = w.ok();
      if (ok) gguf_weights = *w;
    }
    else if (f == "--device") {
      auto d = i + 1 < argc ? kernels::ParseDevice(argv[++i]) : StatusOr<kernels::Device>(InvalidArgumentError(""));
      ok = d.ok();
      if (ok) device = *d;
    }
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
    else if (f == "--check-args") check_args = true;
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
  if (check_args) {
    std::printf("icecache-bench decode: options ok (model %s, device %s, batch %d, context %d, steps %d, budget %d pages)\n",
                dir.c_str(), kernels::DeviceName(device).c_str(), batch, prompt_len, steps, so.budget_pages);
    return 0;
  }
  if (threads > 0) kernels::SetCpuThreads(threads);
  model::ModelLoadOptions load_options;
  load_options.device = device;
  load_options.gguf_weights = gguf_weights;
  auto loaded = model::Model::Load(dir, load_options);
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
  kv_options.device = m.device();
  auto run = [&](int b) {
    return so.budget_pages > 0 ? TimeSparseDecode(m, b, prompt_len, steps, warmup, kv_dtype, page_size, so)
                               : TimeDecode(m, b, prompt_len, steps, warmup, kv_options);
  };
  auto one = run(1);
  auto many = batch > 1 ? run(batch) : one;
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
      {"device", kernels::DeviceName(m.device())},
      {"budget_pages", so.budget_pages},
  };
  if (so.budget_pages > 0) {
    r["rest_estimate"] = so.rest_estimate;
    r["rest_cells"] = so.rest_cells;
  }
  if (so.budget_pages > 0) {
    for (const auto& [name, res] : {std::pair{"batch1", &*one}, std::pair{"batchB", &*many}}) {
      const decode::IceCacheTimings& t = res->split;
      const double pages = static_cast<double>(res->cache.hits + res->cache.misses);
      r[std::string(name) + "_split_ms"] = {{"kv_to_host", t.kv_to_host}, {"selection", t.selection},
                                           {"gather", t.gather},         {"attention", t.attention},
                                           {"append", t.append},
                                           {"model_rest", res->step_ms - t.kv_to_host - t.selection - t.gather -
                                                              t.attention - t.append}};
      r[std::string(name) + "_page_cache"] = {{"slots", res->cache.slots},
                                             {"hit_rate", pages > 0 ? res->cache.hits / pages : 0.0},
                                             {"h2d_bytes_per_step", static_cast<double>(res->cache.h2d_bytes) / steps}};
    }
  }
  if (json) {
    std::printf("%s\n", r.dump().c_str());
    return 0;
  }
  std::printf("decode: %s on %s, hidden %d, %d layers, %s weights, %s KV cache (pages of %d), %d threads\n",
              dir.c_str(), kernels::DeviceName(m.device()).c_str(), c.hidden_size, c.num_layers, c.torch_dtype.c_str(),
              std::string(kernels::DTypeName(kv_dtype)).c_str(), page_size, kernels::CpuThreads());
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
  if (so.budget_pages > 0) {
    std::printf("  IceCache decode on %s, budget %d pages (split per step, ms; model_rest = the dense compute):\n",
                kernels::DeviceName(m.device()).c_str(), so.budget_pages);
    std::printf("  %s\n", r["batch1_split_ms"].dump().c_str());
    std::printf("  batch %d: %s\n  page cache: %s\n", batch, r["batchB_split_ms"].dump().c_str(),
                r["batchB_page_cache"].dump().c_str());
  }
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("decode", "model decode tok/s vs memory roofline, batch-B vs batch-1, prefill tok/s", RunDecode);

}  // namespace icecache::bench
