// The IceCache attention backend of the decode worker (model/attention_backend.h): each sequence
// is a kvstore::SequenceCache (dense layers in position order; sparse layers as sink pages + a
// DCI-tree + window pages), all in one kvstore::PagePool in host memory.
//
// Sequences arrive prefilled: Import() adopts a SequenceCache rebuilt from a shipped wire form.
// Steps then add ONE token per sequence (decode); a multi-token segment is INVALID_ARGUMENT
// (prompts are prefilled on prefill workers).
//
// The split of work (the IceCache paper's): page selection on host threads, attention on the
// device. Attend(layer) for the step's sequences:
//   1. copies this layer's new K/V (and, where a tree is queried, q) to the host;
//   2. selects pages with kvstore::Retriever::SelectBatch — the one selection path, the one the
//      recall tests measure: dense layers every page; sparse layers sink pages + the K =
//      budget - sink - window best tree leaves for the GQA group's queries + window pages (every
//      leaf when the tree has <= K; ICE(r) followers reuse their leader layer's leaves);
//   3. makes the selected pages visible to the device. With a device page cache
//      (options.device_cache_pages > 0: kernels::PageResidencyCache, LRU over layer-steps) only
//      the pages not resident are copied, in one batched host→device copy per group of
//      sequences that fits the cache; without one (the CPU default, whose memory is the host
//      pool) attention reads the pool in place;
//   4. runs kernels::PagedDecodeAttention on the device; merges in the selection's estimate of
//      the tree leaves left out (PageSelection::rest_*, computed on the host from the leaves' mean
//      keys and values; uploaded, then kernels::MergeStates); then kernels::MergeToken adds the
//      new token itself (not yet in any page) by log-sum-exp;
//   5. with a device page cache, writes the token's K/V (kernels::StoreKv, from the device's own
//      k/v) into the device copy of the page that will receive it at EndStep, when that page is
//      resident (SequenceCache::NextTokenLocation: every step but those that open a page), so the
//      window/sink/dense page that grows stays valid on the device instead of being copied again.
// EndStep appends each sequence's token to its host pages (and trees) and invalidates the device
// copies of the pages that changed and were not written on the device in step 5 (a page opened
// this step, in every (layer, kv head) where that happened), and, when the window pushed a page
// into the trees, of the tree leaves that insertion wrote and the window pages it freed
// (kvstore::SequenceCache::pages_changed); the rest of the trees' pages stay resident.
//
// Not thread-safe (AttentionBackend contract): one engine thread drives it.
#pragma once

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/page_gather.h"
#include "kvstore/page_pool.h"
#include "kvstore/retriever.h"
#include "kvstore/sequence_cache.h"
#include "model/attention_backend.h"

namespace icecache::decode {

// Per-sequence counters since Import.
struct SequenceKvStats {
  int64_t pages_fetched = 0;       // pages attended in sparse layers (sink + retrieved + window)
  double retrieval_seconds = 0.0;  // time spent querying trees and merging the selections
};

struct IceCacheBackendOptions {
  kernels::Device device;      // where attention runs (the model's device)
  // Device page slots (pages of the pool's page_bytes). 0: attention reads the host pool in place,
  // which only a device whose memory is host memory (the CPU) can; a CUDA device needs > 0.
  int device_cache_pages = 0;
};

// Device page cache counters (zero without a cache).
struct DevicePageCacheStats {
  int64_t hits = 0;          // selected pages already on the device
  int64_t misses = 0;        // selected pages copied host→device
  int64_t h2d_bytes = 0;     // bytes copied host→device
  int64_t slots = 0;         // cache size in pages
  int64_t bytes = 0;         // device memory of the cache
};

// Where the backend's time goes, cumulative over steps (wall seconds on the engine thread). On a
// GPU, device work is asynchronous: `attention` counts launching it and waiting for its results
// where a copy back forces that.
struct IceCacheTimings {
  double kv_to_host = 0;  // the layer's new K/V (and q) copied to the host
  double selection = 0;   // page selection on host threads (Retriever::SelectBatch)
  double gather = 0;      // device page cache: residency bookkeeping and the host→device copies
  double attention = 0;   // paged attention + the new token's merge (launch, on a GPU)
  double append = 0;      // EndStep: appending tokens to host pages and trees, invalidation
  int64_t steps = 0;
};

class IceCacheBackend final : public model::AttentionBackend {
 public:
  // `pool` is not owned and must outlive the backend; its head_dim must equal shape.head_dim.
  // INVALID_ARGUMENT for a CUDA device without a page cache; errors of DeviceBuffer::Allocate.
  static StatusOr<std::unique_ptr<IceCacheBackend>> Create(const model::AttentionShape& shape, kvstore::PagePool* pool,
                                                           const IceCacheBackendOptions& options);
  ~IceCacheBackend() override;

  // Adopts `cache` (built in this backend's pool) as sequence `id`, selected under `policy`:
  // budget_pages, the page budget of sparse layers (ignored when the cache has none), at least the
  // cache's sink_pages + window_pages (equal: no retrieved pages, the StreamingLLM-style baseline);
  // mode: kSparse serves; kFull, kOracle (exact best leaves) and kQuest (on a cache built with
  // kvstore::SparseLayout::kTokenOrder) are the accuracy baselines; a mode that does not match the
  // cache's layout is INVALID_ARGUMENT; merge, estimate_rest, rest_cells: the serving defaults
  // unless a benchmark or cache.rest_* compare (kvstore::RetrievalPolicy); scale is set to the
  // shape's. INVALID_ARGUMENT when the cache's geometry does not match the shape or the budget is
  // too small; ALREADY_EXISTS for a used id. On error the cache is released.
  Status Import(model::SequenceId id, std::unique_ptr<kvstore::SequenceCache> cache, kvstore::RetrievalPolicy policy);
  // The serving policy with this budget and mode.
  Status Import(model::SequenceId id, std::unique_ptr<kvstore::SequenceCache> cache, int budget_pages,
                kvstore::RetrievalMode mode = kvstore::RetrievalMode::kSparse) {
    kvstore::RetrievalPolicy p;
    p.budget_pages = budget_pages;
    p.mode = mode;
    return Import(id, std::move(cache), p);
  }

  // Removes sequence `id` and hands back its cache, pages and trees intact (a finished sequence
  // kept as a retained prefix, decode_worker/prefix_cache.h). NOT_FOUND for an unknown id,
  // FAILED_PRECONDITION during a step or for a sequence broken by a failed append.
  StatusOr<std::unique_ptr<kvstore::SequenceCache>> ReleaseSequence(model::SequenceId id);
  // Switches the retrieval mode of sequence `id` from its next step on (kFull while the decode
  // worker computes the uncached tail of a reused prefix, so those tokens attend exactly, then
  // back to the policy's). INVALID_ARGUMENT as Import for a mode the cache's layout cannot serve.
  Status SetMode(model::SequenceId id, kvstore::RetrievalMode mode);

  // AddSequence is not supported (FAILED_PRECONDITION): sequences come from Import.
  Status AddSequence(model::SequenceId id) override;
  Status RemoveSequence(model::SequenceId id) override;
  bool HasSequence(model::SequenceId id) const override { return seqs_.count(id) > 0; }
  StatusOr<int> SequenceLength(model::SequenceId id) const override;
  StatusOr<SequenceKvStats> Stats(model::SequenceId id) const;
  // Pages held by the sequence's cache.
  StatusOr<int64_t> PagesHeld(model::SequenceId id) const;
  // The error that broke a sequence in the last EndStep (pool exhausted while appending), or OK.
  // A broken sequence must be removed.
  Status SequenceError(model::SequenceId id) const;
  DevicePageCacheStats device_cache_stats() const;
  const IceCacheTimings& timings() const { return timings_; }

  const model::AttentionShape& shape() const override { return shape_; }
  kernels::Device device() const override { return device_; }
  Status BeginStep(std::span<const model::StepSegment> segments) override;
  Status Attend(int layer, const float* q, const float* k, const float* v, float* out) override;
  void EndStep(bool commit) override;

  size_t num_sequences() const { return seqs_.size(); }

 private:
  struct Sequence {
    std::unique_ptr<kvstore::SequenceCache> cache;
    kvstore::RetrievalPolicy policy;
    SequenceKvStats stats;
    Status error;
    // Pages copied to the device cache for this sequence (forgotten when it leaves).
    std::unordered_set<int64_t> resident;
  };

  IceCacheBackend(const model::AttentionShape& shape, kvstore::PagePool* pool, kernels::Device device,
                  std::unique_ptr<kernels::PageResidencyCache> cache);
  // Attention over `sel` for step rows [first, last) with their pages made visible to the device.
  Status AttendRows(const kvstore::PageSelection& sel, size_t first, size_t last, const float* q, float* out);
  // Step 5 above for `layer` (k, v: the step's [batch, num_kv_heads, head_dim] on the device).
  Status WriteTokenOnDevice(int layer, const float* k, const float* v);
  void InvalidateAll(Sequence& s);

  const model::AttentionShape shape_;
  kvstore::PagePool* const pool_;
  const kernels::Device device_;
  std::unique_ptr<kernels::PageResidencyCache> device_cache_;  // null: attention reads the pool
  kvstore::Retriever retriever_;
  std::unordered_map<model::SequenceId, Sequence> seqs_;

  // Step in progress.
  bool in_step_ = false;
  std::vector<Sequence*> step_seqs_;
  std::vector<const kvstore::SequenceCache*> step_caches_;
  std::vector<kvstore::RetrievalPolicy> step_policies_;
  std::vector<kvstore::PageSelection> selection_;     // [layer] this step's selection
  std::vector<std::vector<float>> step_k_, step_v_;  // [layer][batch, num_kv_heads, head_dim] host
  std::vector<float> q_host_;
  // [batch, layer, kv head]: the page whose device copy got this step's token (-1: none).
  std::vector<int32_t> token_written_;
  // Scratch.
  std::vector<int32_t> lists_;
  std::vector<int64_t> host_pages_;
  std::vector<int32_t> slots_;
  std::vector<int64_t> token_slots_;
  kernels::DeviceBuffer lists_dev_, lse_, token_slots_dev_, rest_dev_;
  IceCacheTimings timings_;
};

}  // namespace icecache::decode
