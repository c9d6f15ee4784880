// The prefill engine: batches queued prompts into dense forward passes of the model, builds each
// sequence's IceCache layout (kvstore::SequenceCache: dense layers in order, sparse layers as
// sink + DCI-tree + window, the trees built on this side), and ships the pages plus the cache's
// wire form over a Transport straight into the decode worker's page pool. Returns the first
// token and a timing breakdown.
//
// Pipeline: one engine thread runs forward passes one batch after another. With
// overlap_tree_build, each layer's K/V of a sequence is handed to the `ship_threads` worker
// threads as soon as the forward pass has produced it (CaptureBackend's listener), and that
// layer's pages and DCI trees are built (SequenceCache::BuildLayers) while the forward pass
// computes the next layers; whatever is left is built after the pass, then the sequence ships.
// Shipping a finished batch overlaps the next batch's forward pass.
//
// Pages are built in options.kv_dtype and ship in it (transport/kv_shipping.h: pages that are
// consecutive in the wire order and in the per-sequence build pool travel as one segment of at
// most max_segment_bytes).
//
// Tensor parallelism (docs/parallel.md): with a model::TpGroup each rank's forward pass captures
// the K/V of its own kv heads (a CaptureBackend per rank, on the rank's device); a layer is ready
// once every rank has produced it, and the ship threads then gather the ranks' heads into the
// whole model's [n, num_kv_heads, head_dim] layout (global head order, a replicated kv head taken
// once) before building it. The sequence's cache, wire form and transfer are those of one rank
// of the whole model: one transfer per request, whatever the TP size on either side (the decode
// worker splits it by head, kvstore::SequenceCache::SplitByHead).
//
// Thread safety: Run() may be called from many threads at once (one per RPC).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kernels/dtype.h"
#include "kernels/kv_pages.h"
#include "kvstore/dci_tree.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/tensor_parallel.h"
#include "transport/transport.h"

namespace icecache::prefill {

struct PrefillEngineOptions {
  int page_size = kernels::kDefaultPageSize;
  int dense_layers = 2;
  int sink_pages = 2;
  int window_pages = 2;
  int ice_group = 1;
  kvstore::DciParams dci;
  int max_batch_tokens = 16384;  // prompts batched into one forward pass up to this many tokens
  double transfer_timeout_seconds = 30;
  int ship_threads = 1;          // tree build + shipping workers
  int threads = 0;               // OpenMP threads of the forward pass (0 = OpenMP's default)
  kernels::DType kv_dtype = kernels::DType::kBF16;  // pages built and shipped in this type
  bool overlap_tree_build = true;                  // build layer l while layer l+1 computes
  size_t max_segment_bytes = 4 << 20;              // largest run of pages in one segment
  int max_queued_requests = 256;  // Run refuses more queued prompts with RESOURCE_EXHAUSTED
  // Called on the engine thread after each forward pass with every rank's seconds in it: its
  // whole Forward and its collectives (only with a TpGroup of more than one rank).
  std::function<void(const model::RankStepTimes&)> rank_times_observer;
};

struct PrefillJob {
  std::vector<int32_t> tokens;     // the prompt, >= 1 token
  model::SamplingParams sampling;  // for the first token
  bool build_index = true;         // false: every layer dense (the sequence attends fully)
  std::string peer;                // decode worker's transport address
  uint64_t transfer_id = 0;        // decode worker's sequence id
  std::string token;               // decode worker's reservation token (kKvTokenBytes bytes)
  // Polled before the job joins a batch and before it ships: true = the caller has gone (its RPC
  // was cancelled); the job is dropped and Run returns CANCELLED. May be empty.
  std::function<bool()> cancelled;
};

struct PrefillResult {
  int32_t first_token = -1;
  std::optional<model::TokenLogprobs> first_logprobs;  // when job.sampling.logprobs >= 0
  double queue_seconds = 0;
  double compute_seconds = 0;     // the batch's forward pass
  // SequenceCache build (pages + trees) not hidden behind the forward pass: from its end to the
  // end of the build. This is what the build adds to TTFT.
  double tree_build_seconds = 0;
  double tree_build_total_seconds = 0;  // all build work of the sequence, hidden or not
  double transfer_seconds = 0;
  int64_t transfer_bytes = 0;
  int64_t pages_shipped = 0;
  int64_t segments_shipped = 0;  // the metadata segment included
};

// Cumulative over the engine's life (completed sequences only).
struct PrefillEngineStats {
  int64_t completed = 0;
  double tree_build_seconds = 0;
  double tree_build_total_seconds = 0;
  int64_t transfer_bytes = 0;
  int64_t segments_shipped = 0;
};

class PrefillEngine {
 public:
  // `model` and `transport` are not owned and must outlive the engine.
  PrefillEngine(model::Model* model, transport::Transport* transport, const PrefillEngineOptions& options);
  // The same over the ranks of a tensor-parallel group (not owned, must outlive the engine).
  PrefillEngine(model::TpGroup* group, transport::Transport* transport, const PrefillEngineOptions& options);
  ~PrefillEngine();  // fails queued jobs with UNAVAILABLE, finishes running ones, joins
  PrefillEngine(const PrefillEngine&) = delete;
  PrefillEngine& operator=(const PrefillEngine&) = delete;

  // Prefills, ships and returns the first token. Errors: INVALID_ARGUMENT (empty prompt, ids out
  // of range), errors of the transport (UNAVAILABLE, DEADLINE_EXCEEDED, FAILED_PRECONDITION when
  // the decode worker gave up on the sequence), RESOURCE_EXHAUSTED (max_queued_requests prompts
  // already queued: nothing was done), CANCELLED (job.cancelled() turned true).
  StatusOr<PrefillResult> Run(PrefillJob job);

  // Draining (SIGTERM): prompts still queued and every later Run end with UNAVAILABLE (the router
  // tries another prefill worker); the batch in a forward pass or shipping carries on.
  void StopAdmitting();

  // Prompt tokens queued or in a forward pass right now.
  int64_t queued_tokens() const;
  // When the engine thread last showed life: it beats at least every 200 ms when idle, between
  // batches, and (with overlap_tree_build) as each layer of a forward pass completes.
  std::chrono::steady_clock::time_point last_heartbeat() const;
  int64_t completed() const;
  PrefillEngineStats stats() const;
  // True once a failure inside a forward pass aborted the tensor-parallel group
  // (TpGroup::usable): that batch failed, Run answers UNAVAILABLE and the worker must be
  // restarted (its health turns NOT_SERVING). Never true with one Model.
  bool broken() const { return broken_.load(); }

 private:
  struct Pending;
  struct SeqBuild;
  void EngineLoop();
  void RunBatch(std::vector<std::shared_ptr<Pending>> batch);
  StatusOr<std::shared_ptr<SeqBuild>> NewSeqBuild(const std::shared_ptr<Pending>& p);
  // Builds every layer whose K/V is complete (up to the last ICE group boundary); serialised per
  // sequence by its mutex, on ship_pool_ threads.
  void BuildReadyLayers(SeqBuild& b);
  void FinishAndShip(const std::shared_ptr<SeqBuild>& b);

  PrefillEngine(model::LanguageModel* lm, model::TpGroup* group, const model::AttentionShape& shape,
                transport::Transport* transport, const PrefillEngineOptions& options);
  // Tensor parallelism: copies layer `layer` of every rank's captured K/V into b.kv (whole-model
  // head order). REQUIRES every rank has completed the layer.
  void GatherLayer(SeqBuild& b, int layer) const;

  model::LanguageModel* const lm_;
  model::TpGroup* const group_;        // null: one Model
  const model::AttentionShape shape_;  // the whole model's (all heads)
  std::vector<int> rank_kv_head0_;     // [ranks] first global kv head of each rank (TpGroup only)
  transport::Transport* const transport_;
  const PrefillEngineOptions options_;
  ThreadPool ship_pool_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> queue_;  // guarded by mu_
  int64_t queued_tokens_ = 0;                   // guarded by mu_
  PrefillEngineStats stats_;                    // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  bool draining_ = false;                       // guarded by mu_
  std::atomic<int64_t> heartbeat_ns_{0};        // steady clock of the last sign of life
  std::atomic<bool> broken_{false};             // the TpGroup was aborted (set by the engine thread)
  void Beat() { heartbeat_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
  std::thread thread_;
};

}  // namespace icecache::prefill
