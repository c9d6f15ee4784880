// The one configuration schema of the three cluster processes (router, prefill, decode). Each
// process reads the same YAML file (docs/config.md) and uses its own section plus the shared
// ones. Command-line overrides ("--set decode.pool_pages=4096") are applied to the YAML tree
// before it is checked, so a value has the same meaning and the same checks from either source.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"
#include "kvstore/dci_tree.h"
#include "kvstore/page_pool.h"
#include "kvstore/retriever.h"

namespace icecache::cluster {

struct ModelSection {
  std::string dir;   // model directory (config.json, *.safetensors, optional tokenizer.json) or a .gguf file
  // Served model name: the HTTP API's model id (requests naming another get 404) and the
  // model_name label of every metric; "": the last component of `dir` without ".gguf".
  std::string name;
};

struct CacheSection {
  int page_size = kernels::kDefaultPageSize;  // tokens per KV page
  int default_budget_pages = 16;  // budget when a request names none; 0 = full attention
  int dense_layers = 2;           // first layers that always attend fully
  int sink_pages = 2;
  int window_pages = 2;
  // DCI-tree parameters: "flat" (kvstore::DciParams::Flat(): Tuned() with a selection cost that grows
  // sub-linearly in the context; the default, kvstore::kServingDciPreset, chosen by measurement in
  // docs/BENCHMARKS.md, "Fidelity on SmolLM2" and "Flat-cost query options"), "tuned"
  // (kvstore::DciParams::Tuned(): higher recall than the reference, about the same build time) or
  // "reference" (the paper's code defaults, docs/design.md §3).
  std::string dci_preset = kvstore::kServingDciPreset;
  // > 0: overrides the preset's field-of-view fraction (a query expands max(fov_min, f * tokens)
  // level-1 cells). Smaller = cheaper decode steps at long context for a little recall
  // (docs/BENCHMARKS.md, "Flat-cost query options"). 0 = the preset's (flat: 0, its field of view
  // grows as 0.182 sqrt(tokens) instead; tuned: 1e-3; reference: 1.5e-3).
  double dci_fov_fraction = 0;
  // > 0: overrides the preset's smallest field of view (level-1 cells a query expands; tuned and
  // flat: 32). Larger finds more at every length for a larger selection cost: on the passkey model
  // the 4-needle task needed ~128 cells at 16k-32k to match full KV (docs/BENCHMARKS.md, "Accuracy on
  // the passkey model"). 0 = the preset's.
  int dci_fov_min = 0;
  // > 0: caps the level-1 cells a GQA group of query heads expands at ceil(g * fov), taken rank by
  // rank over the heads (DciParams::group_fov). Without a cap (tuned) a group of G heads expands
  // the union of its heads' cells, up to G * fov. For wide groups (Llama-3: 4 or 8 query heads per
  // KV head) 2 costs 35-40 % less selection at 16k-128k for -0.001 to -0.009 of attention-mass
  // coverage on the Llama-shaped layer (docs/BENCHMARKS.md, "Flat-cost query options"). 0 = the
  // preset's (tuned: no cap; flat: 1).
  double dci_group_fov = 0;
  // Element type of KV pages in the prefill worker's build pool, on the wire and in the decode
  // worker's pool: "bf16" (what vLLM users expect; half the bytes of f32), "f16" or "f32". Both
  // workers must agree: a decode worker refuses pages of another size.
  std::string kv_dtype = "bf16";
  // ICE(r) layer reuse (docs/design.md §3): groups of ice_group consecutive sparse layers share the first
  // one's page selection (followers build no tree and run no query). 1 = off; the paper uses 3.
  int ice_group = 1;
  // Device page cache of each decode worker, in pages (IceCacheBackendOptions): the selected pages
  // stay on the device between steps and only missing ones are copied. 0 = automatic: none on the
  // CPU (attention reads the host pool in place), min(decode.pool_pages, 65536) on a GPU.
  int64_t device_cache_pages = 0;
  // Decode workers merge into each sparse layer's attention the estimate of the tree leaves a
  // step leaves out, from their mean keys and values (kvstore::RetrievalPolicy::estimate_rest,
  // docs/kvstore.md "Rest estimate"). false: the selected pages alone (the method before).
  bool rest_estimate = true;
  // Its resolution (kvstore::RetrievalPolicy::rest_cells): the tree cells whose mean keys score
  // best, this many, are estimated leaf by leaf and every other cell as one group; 0 = every leaf
  // on its own (a host cost linear in the context).
  int rest_cells = kvstore::RetrievalPolicy{}.rest_cells;
};

struct LimitsSection {
  int max_tokens = 4096;          // upper bound of GenerateRequest.max_tokens
  int max_prompt_tokens = 131072;
  int64_t max_prompt_bytes = 1 << 20;  // prompt text, checked before tokenizing
  int max_stop_strings = 16;           // GenerateRequest.stop entries
  int max_stop_string_bytes = 256;     // bytes of one stop string
  int max_stop_token_ids = 64;         // GenerateRequest.stop_token_ids entries
  // Largest gRPC message every server (router, prefill, decode) accepts and every channel receives.
  int64_t max_message_bytes = 16 << 20;
};

// Where a set of workers is. Either a static list of "host:port", or a DNS name ("name:port")
// resolved to every address it has and re-resolved every dns_refresh_seconds.
struct WorkerDiscovery {
  std::vector<std::string> addresses;
  std::string dns;
};

struct RouterSection {
  std::string listen = "127.0.0.1:50051";
  int metrics_port = 0;  // 0 = no /metrics exposer
  WorkerDiscovery prefill;
  WorkerDiscovery decode;
  double dns_refresh_seconds = 10;
  double stats_refresh_seconds = 0.5;  // how often worker load is polled
  double request_timeout_seconds = 600;  // used when the client sets no deadline
  double kv_transfer_timeout_seconds = 30;
  // Admission: a request that finds every decode worker full waits (in arrival order) for room
  // instead of failing; RESOURCE_EXHAUSTED only when max_waiting requests already wait or the
  // wait passes max_queue_wait_seconds. max_streams caps the router's concurrent Generate calls.
  int max_waiting = 1024;
  double max_queue_wait_seconds = 60;
  int max_streams = 4096;
  // A write to a client (gRPC stream message, HTTP chunk) blocked longer than this (a client that
  // stopped reading) cancels that request (router/write_watchdog.h); 0: no bound for gRPC.
  double write_timeout_seconds = 30;
  // OpenAI-compatible HTTP API (docs/openai_api.md) on this port of the listen host; 0 = off.
  // http_threads connections are served at once (each open stream holds one; more wait for a
  // thread). Bodies above limits.max_message_bytes are refused with 413.
  int http_port = 0;
  int http_threads = 256;
  // API keys of the public APIs (gRPC metadata "authorization: Bearer KEY", HTTP header
  // "Authorization: Bearer KEY"); empty = no authentication. A request without one of these keys
  // is UNAUTHENTICATED (HTTP 401). Health checks and /metrics stay open.
  std::vector<std::string> api_keys;
  // TLS on the public ports (gRPC `listen` and `http_port`): PEM certificate chain and private
  // key, both or neither; "" = plaintext (e.g. behind a TLS-terminating ingress). Clients are not
  // asked for certificates (use api_keys); /metrics stays plaintext.
  std::string tls_cert_file;
  std::string tls_key_file;
  bool tls_enabled() const { return !tls_cert_file.empty(); }
  // A decode worker that fails mid-stream (UNAVAILABLE: killed, gone, drained past its grace
  // period): the request is re-prefilled (prompt + tokens so far) on another prefill/decode pair
  // and the stream continues, at most this many times per request (0 = end with UNAVAILABLE).
  int max_migrations = 3;
  // A reservation, a prefill retry or a migration that finds no worker of the role it needs
  // ready (every one unreachable, restarting, or failing the call) waits up to this long for one
  // to answer its health poll again (each such wait; attempts bound their number), backing off
  // between attempts (50 ms doubling to 1 s), then ends with UNAVAILABLE "no <role> worker became
  // ready within N s". 0 = fail at once.
  double retry_wait_seconds = 30;
  // Attempts per placement after a worker failed the call (UNAVAILABLE) while it counted as
  // ready: a prefill on one more worker with a fresh reservation, a reservation on one more decode
  // worker. Bounds the retries of a request whose workers keep failing; waits do not count.
  int retry_attempts = 8;
  // KV reuse across requests (docs/cluster.md, "KV reuse"): the router sends each prompt's tokens
  // and isolation salt with its reservation, remembers which decode worker holds which prefix
  // blocks and sends a request to the worker that holds its longest prefix (prefix_routing);
  // a worker that holds one computes the uncached rest itself when it is at most
  // local_prefill_max_tokens tokens (otherwise the prompt is prefilled whole on a prefill worker).
  bool prefix_routing = true;
  int local_prefill_max_tokens = 512;
  // SIGTERM: report NOT_SERVING, refuse new requests with UNAVAILABLE and let streams in progress
  // finish for up to this long, then stop.
  double drain_seconds = 30;
};

struct PrefillSection {
  std::string listen = "127.0.0.1:50061";
  int metrics_port = 0;
  int threads = 0;               // compute threads, 0 = all cores
  int max_batch_tokens = 16384;  // prompts batched together up to this many tokens
  // Build layer l's DCI trees while the forward pass computes layer l+1 (false: build every
  // layer after the forward pass, the old schedule; kept for comparison).
  bool overlap_tree_build = true;
  // Prompts queued (not yet in a forward pass) beyond this are refused with RESOURCE_EXHAUSTED
  // (the router tries another prefill worker).
  int max_queued_requests = 256;
  // Health: NOT_SERVING (and Stats UNAVAILABLE) when the engine has shown no sign of life for
  // this long (it beats when idle, and once per layer of a forward pass).
  double health_stall_seconds = 120;
  // Execution device (kernels::ParseDevice): auto (a GPU when one is present), cpu, cuda or cuda:N.
  std::string device = "auto";
  // SIGTERM: report NOT_SERVING, refuse queued and new prompts with UNAVAILABLE (the router tries
  // another prefill worker), finish the batch in progress for up to this long, then stop.
  double drain_seconds = 30;
  // Tensor parallelism: one device per rank (parallel.tensor_parallel_size of them, e.g.
  // [cuda:2, cuda:3]); empty: every rank on the CPU when `device` is the CPU, else ranks on
  // consecutive GPUs from `device`'s.
  std::vector<std::string> devices;
};

struct DecodeSection {
  std::string listen = "127.0.0.1:50071";
  int metrics_port = 0;
  int threads = 0;
  // Host KV pages, each page_size tokens of ONE (layer, KV head), keys and values. 262144 pages are
  // 1 GiB at head_dim 64 in bf16 (2 GiB at 128): a ~45k-token SmolLM2 sequence, ~16k of an 8B
  // Llama; reserved as virtual memory and touched only as pages fill (pinned on a GPU worker).
  int64_t pool_pages = kvstore::kDefaultDecodePoolPages;
  int max_sequences = 64;  // sequences admitted at once: reserved, receiving or decoding
  // Keep sequences that end as retained prefixes, reused by later requests that start with them
  // (decode_worker/prefix_cache.h); admission evicts them, least recently used first.
  bool prefix_cache = true;
  std::string device = "auto";  // as prefill.device
  std::vector<std::string> devices;  // as prefill.devices
  // Health: NOT_SERVING (and Stats UNAVAILABLE) when the engine loop has not come round for this
  // long (a stuck forward pass or a wedged thread).
  double health_stall_seconds = 30;
  // SIGTERM: stop admitting, report NOT_SERVING, let running sequences finish for up to this
  // long, then end the rest with UNAVAILABLE (routers migrate them) and stop. `icecache cluster`
  // and the Helm chart wait the longest drain_seconds + 10 s before SIGKILL.
  double drain_seconds = 30;
};

struct UcxSection {
  std::string tls = "tcp,sm,self";  // UCX_TLS
  std::string net_devices = "";     // UCX_NET_DEVICES; empty = UCX's default
  double transfer_timeout_seconds = 30;  // a transfer that does not finish by then is aborted
  // Consecutive KV pages are shipped as one segment of at most this many bytes (a segment never
  // holds less than one page; a value below the page size ships one page per segment).
  int64_t max_segment_bytes = 4 << 20;
  // Endpoints detect a failed peer (UCX peer error handling): a dead decode worker fails the
  // prefill worker's send at once instead of at transfer_timeout_seconds. UCX 1.13's shared
  // memory transports cannot do this, so with it on only tcp carries KV.
  bool peer_failure_detection = false;
};

// Tensor parallelism inside a worker (docs/parallel.md). Each worker process reads it (set it per
// process with --set parallel.tensor_parallel_size=N).
struct ParallelSection {
  int tensor_parallel_size = 1;  // ranks per worker process (threads; CPU or one GPU each)
};

// Mutual TLS on the internal plane (router -> prefill and decode workers). With the three files set,
// worker servers accept only clients presenting a certificate signed by ca_file, and the router
// presents cert_file and verifies each worker's certificate against ca_file; without them the plane
// is plaintext (reservation tokens still guard each sequence). The public API is not affected.
struct InternalTlsSection {
  std::string ca_file;    // PEM CA certificate(s) that sign every cluster member's certificate
  std::string cert_file;  // PEM certificate of this process (server and client auth)
  std::string key_file;   // PEM private key of cert_file
  // Name checked against the workers' certificates instead of the host in their address (one
  // certificate with SAN DNS:<server_name> then serves every pod); "": the address's host.
  std::string server_name;
  bool enabled() const { return !ca_file.empty(); }
};

struct ClusterConfig {
  ModelSection model;
  ParallelSection parallel;
  CacheSection cache;
  LimitsSection limits;
  RouterSection router;
  PrefillSection prefill;
  DecodeSection decode;
  UcxSection ucx;
  InternalTlsSection internal_tls;
};

// Parses YAML text into a config; every key is optional (defaults above), an unknown key or a
// value of the wrong type or range is INVALID_ARGUMENT naming `origin` and the key path.
// `overrides` are "section.key=value" strings applied on top of the text.
StatusOr<ClusterConfig> ParseClusterConfig(const std::string& yaml_text, const std::string& origin,
                                           const std::vector<std::string>& overrides = {});

// Reads the file at `path` ("" = defaults only) and applies `overrides`.
StatusOr<ClusterConfig> LoadClusterConfig(const std::string& path,
                                          const std::vector<std::string>& overrides = {});

// Pulls the options common to all three binaries out of argv: --config FILE, --set K=V (repeatable)
// and shorthands (--model DIR -> model.dir, --listen ADDR -> <section>.listen, --metrics-port P ->
// <section>.metrics_port, --http-port P -> router.http_port (router only), --api-key KEY -> appended to router.api_keys (router
// only, repeatable), --kv-dtype T -> cache.kv_dtype). `section` is "router", "prefill" or "decode". Unknown flags are
// INVALID_ARGUMENT. argv[0] is skipped.
StatusOr<ClusterConfig> ConfigFromCommandLine(int argc, char** argv, const std::string& section);

// Renders the config as YAML (all keys, defaults included).
std::string ClusterConfigToYaml(const ClusterConfig& config);

// A worker's per-rank devices (prefill.devices / decode.devices, `role` names the section in
// errors): empty when `devices` is empty (the ranks follow the section's `device`), else the
// parsed list. INVALID_ARGUMENT for a list whose length is not tensor_parallel_size or an
// entry that is not a device.
StatusOr<std::vector<kernels::Device>> RankDevices(const std::vector<std::string>& devices, int tensor_parallel_size,
                                                   const std::string& role);

}  // namespace icecache::cluster
