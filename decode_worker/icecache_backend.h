// The IceCache attention backend of the decode worker (model/attention_backend.h): each sequence
// is a kvstore::SequenceCache (dense layers in position order; sparse layers as sink pages + a
// DCI-tree + window pages), all in one kvstore::PagePool.
//
// Sequences arrive prefilled: Import() adopts a SequenceCache rebuilt from a shipped wire form.
// Steps then add ONE token per sequence (decode); a multi-token segment is INVALID_ARGUMENT
// (prompts are prefilled on prefill workers).
//
// Attend(layer) for each sequence and kv head attends over
//   * dense layers: every page (exact);
//   * sparse layers with budget B pages: sink pages + the K = B - sink_pages - window_pages best
//     tree leaves for this token's queries (each query head of the GQA group queries the tree;
//     their lists are merged rank by rank into K distinct leaves; every leaf when the tree has
//     <= K) + window pages; ICE(r) followers reuse their leader layer's selection. The heads of a
//     group share one tree traversal (DciTree::QueryGroup), and the (sequence, kv head) queries
//     of a layer run in parallel on OpenMP threads;
// plus the new token itself, whose contribution is merged into the paged result by log-sum-exp
// (so the cache is only appended to, once per step, at EndStep with all layers' K/V).
// Attention over pages is kernels::PagedDecodeAttention.
//
// Not thread-safe (AttentionBackend contract): one engine thread drives it.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "kvstore/page_pool.h"
#include "kvstore/sequence_cache.h"
#include "model/attention_backend.h"

namespace icecache::decode {

// Per-sequence counters since Import.
struct SequenceKvStats {
  int64_t pages_fetched = 0;       // pages attended in sparse layers (sink + retrieved + window)
  double retrieval_seconds = 0.0;  // time spent querying trees and merging the selections
};

class IceCacheBackend final : public model::AttentionBackend {
 public:
  // `pool` is not owned and must outlive the backend; its head_dim must equal shape.head_dim.
  IceCacheBackend(const model::AttentionShape& shape, kvstore::PagePool* pool);
  ~IceCacheBackend() override;

  // Adopts `cache` (built in this backend's pool) as sequence `id`. budget_pages: the page budget
  // of sparse layers (ignored when the cache has none); it must exceed the cache's sink_pages +
  // window_pages. INVALID_ARGUMENT when the cache's geometry does not match the shape or the
  // budget is too small; ALREADY_EXISTS for a used id. On error the cache is released.
  Status Import(model::SequenceId id, std::unique_ptr<kvstore::SequenceCache> cache, int budget_pages);

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

  const model::AttentionShape& shape() const override { return shape_; }
  Status BeginStep(std::span<const model::StepSegment> segments) override;
  Status Attend(int layer, const float* q, const float* k, const float* v, float* out) override;
  void EndStep(bool commit) override;

  size_t num_sequences() const { return seqs_.size(); }

 private:
  struct Sequence {
    std::unique_ptr<kvstore::SequenceCache> cache;
    int budget_pages = 0;
    SequenceKvStats stats;
    Status error;
    std::vector<std::vector<int32_t>> leader_pick;  // [num_kv_heads] leaves picked at the leader layer
  };

  struct SelectTask {
    int b = 0;               // index into step_seqs_
    int g = 0;               // kv head
    double seconds = 0.0;
  };
  // The k leaves of `tree` for the GQA group's queries q_group [group, head_dim]: the heads' ranked
  // lists merged rank by rank into k distinct leaves (all leaves when the tree has <= k).
  // Thread-safe (per_head is the caller's scratch).
  void SelectLeaves(const kvstore::DciTree& tree, const float* q_group, int k,
                    std::vector<std::vector<kvstore::ScoredLeaf>>* per_head, std::vector<int32_t>* picked) const;
  // Fills leader_pick for every (step sequence, kv head) whose leader layer is `layer`, the tree
  // queries spread over OpenMP threads.
  void SelectAll(int layer, const float* q);

  const model::AttentionShape shape_;
  kvstore::PagePool* const pool_;
  std::unordered_map<model::SequenceId, Sequence> seqs_;

  // Step in progress.
  bool in_step_ = false;
  std::vector<Sequence*> step_seqs_;
  std::vector<std::vector<float>> step_k_, step_v_;  // [layer][batch, num_kv_heads, head_dim]
  // Scratch.
  std::vector<int32_t> indptr_, ids_, valid_;
  std::vector<float> lse_;
  std::vector<SelectTask> select_tasks_;
};

}  // namespace icecache::decode
