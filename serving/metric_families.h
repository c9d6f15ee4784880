// The one list of icecache's Prometheus metric families, per component.
//
// Every series a process exports carries the labels `component` (router|prefill|decode) and
// `model_name` (the served model name, ServedModelName()), set by the process itself, so a scrape
// config needs no relabelling; which pod or process a series came from is the scrape target's
// `instance` (and `pod` under a PodMonitor). A family name belongs to one component only, so no
// sum over all targets counts the same thing twice: the router counts requests and their tokens,
// the prefill workers the prompts they ran and the bytes they shipped, the decode workers their
// sequences, tokens, pages and KV memory. The exceptions are families each worker exports about
// itself alone (its restarts, its tensor-parallel steps), which a sum still counts once. Request-level families follow vLLM's (`vllm:` ->
// `icecache_`), so dashboards and alerts written for vLLM translate one for one.
//
// Thread safety: the structs hold references into a prometheus::Registry; prometheus-cpp's
// metrics are safe to update from any thread. Construct once per process.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace icecache::cluster {

// The served model name: `model.name` when set, else the model path's last component without a
// ".gguf" suffix ("/models/SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct.Q4_1").
std::string ServedModelName(const std::string& configured_name, const std::string& model_path);

// {component, model_name}: the labels every family of a process carries.
prometheus::Labels ProcessLabels(const std::string& component, const std::string& model_name);

// Buckets: latency in seconds (1 ms .. 120 s), token counts (1 .. 128k).
const std::vector<double>& LatencyBuckets();
const std::vector<double>& TokenCountBuckets();

// The environment variable through which `icecache cluster` tells a worker it restarts how many
// times its port's worker has been restarted before it (tools/cli/cluster_command.cc).
inline constexpr const char* kWorkerRestartsEnv = "ICECACHE_WORKER_RESTARTS";
// Its value in this process's environment: 0 when unset or not a count (e.g. under Kubernetes,
// where kube-state-metrics counts pod restarts instead).
int64_t WorkerRestartsFromEnvironment();

struct RouterMetrics {
  RouterMetrics(prometheus::Registry& r, const prometheus::Labels& process);
  // Latencies per request (arrival = when the router received it).
  prometheus::Histogram& ttft;        // icecache_time_to_first_token_seconds
  prometheus::Histogram& itl;         // icecache_inter_token_latency_seconds
  prometheus::Histogram& tpot;        // icecache_request_time_per_output_token_seconds
  prometheus::Histogram& e2e;         // icecache_e2e_request_latency_seconds
  prometheus::Histogram& queue_time;  // icecache_request_queue_time_seconds: arrival -> a decode worker reserved
  prometheus::Histogram& prefill_time;  // icecache_request_prefill_time_seconds: reserved -> first token
  prometheus::Histogram& decode_time;   // icecache_request_decode_time_seconds: first -> last token
  prometheus::Histogram& prompt_tokens_per_request;      // icecache_request_prompt_tokens
  prometheus::Histogram& generation_tokens_per_request;  // icecache_request_generation_tokens
  prometheus::Gauge& running;  // icecache_requests_running
  prometheus::Gauge& waiting;  // icecache_requests_waiting
  prometheus::Counter& prompt_tokens;      // icecache_prompt_tokens_total
  prometheus::Counter& generation_tokens;  // icecache_generation_tokens_total
  prometheus::Family<prometheus::Counter>& success;  // icecache_request_success_total{finished_reason}
  prometheus::Family<prometheus::Counter>& errors;   // icecache_request_errors_total{code}
  // icecache_request_migrations_total: streams moved to another prefill/decode pair after their
  // decode worker failed mid-stream (one per move; a request may move more than once).
  prometheus::Counter& migrations;
  // icecache_request_prefill_retries_total: prefills retried on another prefill worker with a new
  // reservation after one failed UNAVAILABLE (e.g. killed mid-shipment).
  prometheus::Counter& prefill_retries;
  // icecache_worker_unavailable_seconds_total{role, worker}: seconds a worker counted as not
  // ready (its Stats poll failed, or a request's call to it failed UNAVAILABLE), in steps of
  // router.stats_refresh_seconds.
  prometheus::Family<prometheus::Counter>& worker_unavailable;
  // icecache_prompt_tokens_cached_total: prompt tokens whose KV a decode worker reused (part of
  // icecache_prompt_tokens_total; usage.cached_tokens summed).
  prometheus::Counter& cached_prompt_tokens;
};

struct PrefillMetrics {
  PrefillMetrics(prometheus::Registry& r, const prometheus::Labels& process);
  // icecache_worker_restarts_total (prefill and decode workers): restarts of this worker by
  // `icecache cluster` before this process; starts at WorkerRestartsFromEnvironment().
  prometheus::Counter& restarts;
  prometheus::Counter& prompt_tokens;   // icecache_prefill_tokens_total
  prometheus::Counter& sent_bytes;      // icecache_prefill_kv_sent_bytes_total
  prometheus::Gauge& waiting;           // icecache_prefill_requests_waiting: queued or in prefill
  prometheus::Family<prometheus::Histogram>& phase;  // icecache_prefill_phase_seconds{phase}
  // Adds one histogram sample of `phase` (queue, compute, tree_build, tree_build_total, transfer).
  void ObservePhase(const std::string& phase_name, double seconds);
};

struct DecodeMetrics {
  DecodeMetrics(prometheus::Registry& r, const prometheus::Labels& process);
  prometheus::Counter& restarts;          // icecache_worker_restarts_total (as PrefillMetrics)
  prometheus::Gauge& kv_host_bytes;       // icecache_kv_host_bytes
  prometheus::Gauge& kv_usage;            // icecache_kv_cache_usage_ratio
  prometheus::Gauge& running;             // icecache_decode_sequences_running: reserved or decoding
  prometheus::Counter& generation_tokens; // icecache_decode_tokens_total
  prometheus::Counter& pages_fetched;     // icecache_pages_fetched_total (sparse layers)
  prometheus::Counter& retrieval;         // icecache_retrieval_seconds_total (tree queries)
  prometheus::Counter& received_bytes;    // icecache_decode_kv_received_bytes_total
  // icecache_decode_kv_segments_refused_total: transport messages (KV segments, end-of-transfer)
  // for a live reservation that carried another token, dropped unread (transport/transport.h).
  prometheus::Counter& segments_refused;
  prometheus::Gauge& kv_gpu_bytes;        // icecache_kv_gpu_bytes
  prometheus::Counter& cache_hits;        // icecache_device_page_cache_hits_total
  prometheus::Counter& cache_misses;      // icecache_device_page_cache_misses_total
  prometheus::Counter& h2d_bytes;         // icecache_h2d_bytes_total
  // KV reuse (decode_worker/prefix_cache.h). icecache_kv_host_bytes and the usage ratio count
  // pages of sequences only; retained prefixes are evictable and counted here.
  prometheus::Gauge& kv_retained_bytes;   // icecache_kv_retained_bytes
  prometheus::Gauge& prefix_entries;      // icecache_prefix_cache_entries
  prometheus::Counter& prefix_evictions;  // icecache_prefix_cache_evictions_total
  prometheus::Counter& prefix_lookups;    // icecache_prefix_cache_queries_total: reservations that gave tokens
  prometheus::Counter& prefix_hits;       // icecache_prefix_cache_hits_total: of those, reused a prefix
  prometheus::Counter& prefix_reused_tokens;    // icecache_prefix_cache_reused_tokens_total
  prometheus::Counter& prefix_computed_tokens;  // icecache_prefix_cache_computed_tokens_total: uncached
                                                // prompt tokens computed on this decode worker
};

// Tensor parallelism (docs/parallel.md), in the prefill and the decode workers that run more than
// one rank: the two families both worker components export (their own steps, told apart by
// `component`, so no sum counts a step twice).
struct CollectiveMetrics {
  CollectiveMetrics(prometheus::Registry& r, const prometheus::Labels& process);
  // icecache_collective_seconds{rank}: per forward step, the seconds each rank spent in
  // collectives (all-reduces, including waiting for the other ranks).
  prometheus::Family<prometheus::Histogram>& seconds;
  // icecache_rank_step_seconds{rank}: per forward step, each rank's whole step (its Forward,
  // collectives included): a slow rank shows as the one with less collective time (it waits least).
  prometheus::Family<prometheus::Histogram>& step_seconds;
  // One sample per rank in each family.
  void ObserveStep(std::span<const double> step, std::span<const double> collective);

 private:
  prometheus::Labels process_;
  std::vector<prometheus::Histogram*> ranks_, step_ranks_;  // created on first use, per rank
  std::mutex mu_;                                           // guards ranks_, step_ranks_
};

}  // namespace icecache::cluster
