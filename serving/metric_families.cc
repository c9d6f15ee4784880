#include "serving/metric_families.h"

#include <cstdlib>
#include <filesystem>

namespace icecache::cluster {
namespace {

prometheus::Histogram& Histogram(prometheus::Registry& r, const prometheus::Labels& process, const char* name,
                                 const char* help, const std::vector<double>& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Labels(process).Register(r).Add({}, buckets);
}
prometheus::Counter& Counter(prometheus::Registry& r, const prometheus::Labels& process, const char* name,
                             const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Labels(process).Register(r).Add({});
}
prometheus::Gauge& Gauge(prometheus::Registry& r, const prometheus::Labels& process, const char* name,
                         const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Labels(process).Register(r).Add({});
}

// icecache_worker_restarts_total, started at the launcher's count.
prometheus::Counter& Restarts(prometheus::Registry& r, const prometheus::Labels& process) {
  prometheus::Counter& c = Counter(r, process, "icecache_worker_restarts_total",
                                   "Restarts of this worker by icecache cluster before this process");
  c.Increment(static_cast<double>(WorkerRestartsFromEnvironment()));
  return c;
}

}  // namespace

int64_t WorkerRestartsFromEnvironment() {
  const char* v = std::getenv(kWorkerRestartsEnv);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  return end != nullptr && *end == '\0' && n > 0 ? n : 0;
}

std::string ServedModelName(const std::string& configured_name, const std::string& model_path) {
  if (!configured_name.empty()) return configured_name;
  std::filesystem::path p(model_path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  std::string name = p.filename().string();
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  return name.empty() ? std::string("icecache") : name;
}

prometheus::Labels ProcessLabels(const std::string& component, const std::string& model_name) {
  return {{"component", component}, {"model_name", model_name}};
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                        0.5,   0.75,   1.0,   2.5,  5.0,  7.5,  10,   20,   40,  80, 120};
  return b;
}

const std::vector<double>& TokenCountBuckets() {
  static const std::vector<double> b = {1,    2,    5,    10,   20,    50,    100,   200,   500,
                                        1000, 2000, 4096, 8192, 16384, 32768, 65536, 131072};
  return b;
}

RouterMetrics::RouterMetrics(prometheus::Registry& r, const prometheus::Labels& p)
    : ttft(Histogram(r, p, "icecache_time_to_first_token_seconds", "Request arrival to first token",
                     LatencyBuckets())),
      itl(Histogram(r, p, "icecache_inter_token_latency_seconds", "Time between consecutive streamed tokens",
                    LatencyBuckets())),
      tpot(Histogram(r, p, "icecache_request_time_per_output_token_seconds",
                     "Mean time per output token after the first, per request", LatencyBuckets())),
      e2e(Histogram(r, p, "icecache_e2e_request_latency_seconds", "Request arrival to last token", LatencyBuckets())),
      queue_time(Histogram(r, p, "icecache_request_queue_time_seconds",
                           "Request arrival to a decode worker reserved (admission queue included)",
                           LatencyBuckets())),
      prefill_time(Histogram(r, p, "icecache_request_prefill_time_seconds",
                             "Decode worker reserved to first token (prefill queue, compute, tree build, shipping)",
                             LatencyBuckets())),
      decode_time(Histogram(r, p, "icecache_request_decode_time_seconds", "First token to last token",
                            LatencyBuckets())),
      prompt_tokens_per_request(Histogram(r, p, "icecache_request_prompt_tokens", "Prompt tokens per finished request",
                                          TokenCountBuckets())),
      generation_tokens_per_request(Histogram(r, p, "icecache_request_generation_tokens",
                                              "Generated tokens per finished request", TokenCountBuckets())),
      running(Gauge(r, p, "icecache_requests_running", "Requests decoding")),
      waiting(Gauge(r, p, "icecache_requests_waiting",
                    "Requests waiting for a decode worker (admission queue) or in reserve/prefill")),
      prompt_tokens(Counter(r, p, "icecache_prompt_tokens_total", "Prompt tokens of admitted requests")),
      generation_tokens(Counter(r, p, "icecache_generation_tokens_total", "Tokens streamed to clients")),
      success(prometheus::BuildCounter()
                  .Name("icecache_request_success_total")
                  .Help("Finished requests by finish reason")
                  .Labels(p)
                  .Register(r)),
      errors(prometheus::BuildCounter()
                 .Name("icecache_request_errors_total")
                 .Help("Failed requests by gRPC status code")
                 .Labels(p)
                 .Register(r)),
      migrations(Counter(r, p, "icecache_request_migrations_total",
                         "Streams moved to another prefill/decode pair after their decode worker failed")),
      prefill_retries(Counter(r, p, "icecache_request_prefill_retries_total",
                              "Prefills retried on another prefill worker with a new reservation after one failed "
                              "UNAVAILABLE")),
      worker_unavailable(prometheus::BuildCounter()
                             .Name("icecache_worker_unavailable_seconds_total")
                             .Help("Seconds a worker counted as not ready for requests, by role and address")
                             .Labels(p)
                             .Register(r)),
      cached_prompt_tokens(Counter(r, p, "icecache_prompt_tokens_cached_total",
                                   "Prompt tokens whose KV a decode worker reused instead of computing")) {}

PrefillMetrics::PrefillMetrics(prometheus::Registry& r, const prometheus::Labels& p)
    : restarts(Restarts(r, p)),
      prompt_tokens(Counter(r, p, "icecache_prefill_tokens_total", "Prompt tokens prefilled by this worker")),
      sent_bytes(Counter(r, p, "icecache_prefill_kv_sent_bytes_total", "KV bytes shipped to decode workers")),
      waiting(Gauge(r, p, "icecache_prefill_requests_waiting", "Prompts queued or in prefill on this worker")),
      phase(prometheus::BuildHistogram()
                .Name("icecache_prefill_phase_seconds")
                .Help("Prefill time by phase")
                .Labels(p)
                .Register(r)) {}

void PrefillMetrics::ObservePhase(const std::string& phase_name, double seconds) {
  phase.Add({{"phase", phase_name}}, LatencyBuckets()).Observe(seconds);
}

DecodeMetrics::DecodeMetrics(prometheus::Registry& r, const prometheus::Labels& p)
    : restarts(Restarts(r, p)),
      kv_host_bytes(Gauge(r, p, "icecache_kv_host_bytes", "Host bytes of KV pages in use")),
      kv_usage(Gauge(r, p, "icecache_kv_cache_usage_ratio", "Fraction of the KV page pool in use")),
      running(Gauge(r, p, "icecache_decode_sequences_running", "Sequences reserved or decoding on this worker")),
      generation_tokens(Counter(r, p, "icecache_decode_tokens_total", "Tokens generated by this decode worker")),
      pages_fetched(Counter(r, p, "icecache_pages_fetched_total", "KV pages attended in sparse layers")),
      retrieval(Counter(r, p, "icecache_retrieval_seconds_total", "Seconds spent selecting pages (tree queries)")),
      received_bytes(Counter(r, p, "icecache_decode_kv_received_bytes_total", "KV bytes received over the transport")),
      segments_refused(Counter(r, p, "icecache_decode_kv_segments_refused_total",
                               "KV transfer messages dropped because they lacked the reservation's token")),
      kv_gpu_bytes(Gauge(r, p, "icecache_kv_gpu_bytes", "Device bytes of the KV page cache (0 on the CPU)")),
      cache_hits(Counter(r, p, "icecache_device_page_cache_hits_total",
                         "Selected KV pages already resident on the device")),
      cache_misses(Counter(r, p, "icecache_device_page_cache_misses_total", "Selected KV pages copied host to device")),
      h2d_bytes(Counter(r, p, "icecache_h2d_bytes_total", "KV bytes copied host to device")),
      kv_retained_bytes(Gauge(r, p, "icecache_kv_retained_bytes", "Host bytes of KV pages kept as reusable prefixes")),
      prefix_entries(Gauge(r, p, "icecache_prefix_cache_entries", "Retained KV prefixes")),
      prefix_evictions(Counter(r, p, "icecache_prefix_cache_evictions_total", "Retained KV prefixes evicted for room")),
      prefix_lookups(Counter(r, p, "icecache_prefix_cache_queries_total", "Reservations looked up in the prefix cache")),
      prefix_hits(Counter(r, p, "icecache_prefix_cache_hits_total", "Reservations that reused a retained prefix")),
      prefix_reused_tokens(Counter(r, p, "icecache_prefix_cache_reused_tokens_total",
                                   "Prompt tokens whose KV was reused instead of computed")),
      prefix_computed_tokens(Counter(r, p, "icecache_prefix_cache_computed_tokens_total",
                                     "Uncached prompt tokens of reused prefixes computed on this decode worker")) {}

CollectiveMetrics::CollectiveMetrics(prometheus::Registry& r, const prometheus::Labels& p)
    : seconds(prometheus::BuildHistogram()
                  .Name("icecache_collective_seconds")
                  .Help("Seconds a tensor-parallel rank spent in collectives per forward step")
                  .Labels(p)
                  .Register(r)),
      step_seconds(prometheus::BuildHistogram()
                       .Name("icecache_rank_step_seconds")
                       .Help("Seconds of a tensor-parallel rank's forward step, collectives included")
                       .Labels(p)
                       .Register(r)),
      process_(p) {}

void CollectiveMetrics::ObserveStep(std::span<const double> step, std::span<const double> collective) {
  // A step of one rank (and its collectives) is far below the request latencies: 10 us .. 10 s.
  static const std::vector<double> kBuckets = {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1, 3, 10};
  std::lock_guard<std::mutex> lock(mu_);
  auto observe = [&](prometheus::Family<prometheus::Histogram>& family, std::vector<prometheus::Histogram*>* ranks,
                     std::span<const double> s) {
    while (ranks->size() < s.size()) ranks->push_back(&family.Add({{"rank", std::to_string(ranks->size())}}, kBuckets));
    for (size_t r = 0; r < s.size(); ++r) (*ranks)[r]->Observe(s[r]);
  };
  observe(seconds, &ranks_, collective);
  observe(step_seconds, &step_ranks_, step);
}

}  // namespace icecache::cluster
