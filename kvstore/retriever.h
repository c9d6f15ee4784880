// Retriever: the IceCache page-selection policy for decode steps (docs/design.md §3).
//
// For each (sequence, kv head) of a layer it selects, under a budget counted in pages (sink and
// window included: 16 pages = 2 sink + 12 retrieved + 2 window):
//   sink pages + K retrieved tree leaves + window pages,  K = budget - #sink - #window.
// The K leaves come from DciTree::Query for every query head of the GQA group (each head's best K,
// ranked by their best token score), merged into one set of K by the policy's GroupMerge (below).
// If the tree has <= K leaves, all are taken (exact). Modes:
//   kSparse  the tree search above;
//   kFull    every page (sink, all leaves, window): exact dense attention;
//   kOracle  as kSparse but each head's list is the exact best-K leaves by best token score;
//   kQuest   the Quest baseline (Tang et al. 2024) on a SparseLayout::kTokenOrder cache: the
//            middle pages in position order, each ranked for every query head by the upper bound
//            sum_c max(q_c * max_c, q_c * min_c) of q.k over its keys (per-channel min/max of the
//            page's keys), the K best per head merged as above. Same sink, window and budget
//            accounting as kSparse.
// kSparse / kOracle need the tree layout and kQuest the token-order layout (INVALID_ARGUMENT
// otherwise); kFull takes every page of either.
// Dense layers always select all their pages. If budget < #sink + #window, sink and window are
// still selected in full (K = 0).
//
// ICE(r): for a follower layer (SequenceCache::LeaderOf(layer) != layer) pass the selection made
// for its leader layer in the same step; the follower's pages are then the same tree leaves in the
// follower's payload plus its own sink/window pages, and no query runs.
//
// Rest estimate (RetrievalPolicy::estimate_rest, kSparse / kOracle): the attention over the tree
// leaves a unit did not select is estimated from their mean keys and values
// (DciTree::EstimateRest) into PageSelection::rest_out / rest_lse; the attention kernels' result
// over the selected pages is then merged with it (kernels::MergeStates), so the leaves left out
// still count, each as one key of its token count's weight. ICE(r) followers estimate in their
// own payload. The estimate needs q: a call without one (kFull, or ICE(r) followers alone) makes
// none.
//
// Output (PageSelection) feeds kernels::PagedDecodeAttention directly: for b in [0, batch) and
// kv head g, the pages of (b, g) are page_ids[page_indptr[b*H+g] .. page_indptr[b*H+g+1]) with
// page_valid giving the valid slots of each.
//
// This is the selection that serves: the decode worker's IceCache backend calls SelectBatch for
// every layer of every step, and the recall tests and benchmarks measure the same code.
//
// Parallelism: with a ThreadPool the (sequence, kv head) units of a batch spread over it; without
// one they spread over the kernels' OpenMP threads when the batch's trees hold at least
// kParallelSelectTokens tokens (a query over a few thousand tokens takes tens of microseconds,
// about what waking a parallel region costs on a loaded host).
//
// Thread safety: Select is const and may run concurrently (it only reads the caches).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kvstore/sequence_cache.h"

namespace icecache::kvstore {

enum class RetrievalMode : int { kSparse = 0, kFull = 1, kOracle = 2, kQuest = 3 };

// The layout a mode selects from: kQuest needs SparseLayout::kTokenOrder, kSparse and kOracle
// the tree; kFull serves both (returned: the tree, its serving layout).
inline SparseLayout LayoutFor(RetrievalMode mode) {
  return mode == RetrievalMode::kQuest ? SparseLayout::kTokenOrder : SparseLayout::kDciTree;
}

// Quest's bound for query q [head_dim] over page bounds [2, head_dim] (min row, max row).
float QuestBound(const float* q, const float* bounds, int head_dim);

// How the ranked lists of a GQA group's query heads become one set of K pages for their KV head.
//   kRank  rank by rank: rank 0 of every head, then rank 1, ..., first occurrence wins (each head
//          an equal share, whatever its attention looks like).
//   kMass  by the group's estimated attention weight: head j's softmax over the pages it can see is
//          estimated from its sink and window tokens (scored exactly) and its listed pages (each
//          standing for its best token score s); a page weighs sum_j exp(c s_j) / Z_j over the
//          heads that list it, c = 1 / sqrt(head_dim) (the attention scale of every supported
//          family). A head whose attention sits in a few pages, or in its sink and window, gives
//          up slots to a head whose attention is spread over many (docs/kvstore.md, "Group merge").
// With one query head per KV head both give that head's K best.
enum class GroupMerge : int { kRank = 0, kMass = 1 };

// "rank" | "mass" (INVALID_ARGUMENT otherwise), and back.
StatusOr<GroupMerge> GroupMergeNamed(const std::string& name);
const char* GroupMergeName(GroupMerge merge);

struct RetrievalPolicy {
  int budget_pages = 16;  // >= 1; sink and window pages count against it
  RetrievalMode mode = RetrievalMode::kSparse;
  GroupMerge merge = GroupMerge::kMass;  // the serving default (docs/kvstore.md, "Group merge")
  // kSparse / kOracle: also estimate the attention of the tree leaves left out, from their mean
  // keys and values (DciTree::EstimateRest), into PageSelection::rest_*; the serving default
  // (docs/kvstore.md, "Rest estimate").
  bool estimate_rest = true;
  // The rest estimate's resolution (DciTree::EstimateRest's expand_cells): the tree cells whose
  // mean keys score best count leaf by leaf, this many of them, every other cell as one group;
  // 0 = every leaf on its own. 64 serves: on SmolLM2 within 0.002 of every leaf's perplexity on
  // the texts measured (16: up to 0.005), for about half of its extra selection cost at 64k
  // (docs/kvstore.md, "Rest estimate").
  int rest_cells = 64;
  // The attention scale of the model (the group merge's and the rest estimate's c); 0 means
  // 1 / sqrt(head_dim), that of every supported family.
  float scale = 0.f;
};

struct PageSelection {
  int batch = 0;
  int num_kv_heads = 0;
  std::vector<int32_t> page_indptr;  // [batch * num_kv_heads + 1], page_indptr[0] == 0
  std::vector<int32_t> page_ids;     // [page_indptr.back()] pool page ids
  std::vector<int32_t> page_valid;   // [same] valid slots, 1..page_size
  std::vector<int32_t> tree_leaf;    // [same] tree leaf index, or -1 for sink/window/dense pages
  std::vector<double> unit_seconds;  // [batch * num_kv_heads] time spent selecting each unit
  // The rest estimate (RetrievalPolicy::estimate_rest), per (sequence, query head): the estimated
  // attention over the tree leaves not selected, in kernels::MergeStates' form. rest_lse is -inf
  // where nothing was estimated (dense layers, every leaf selected, estimate off, Quest, full).
  // Both empty when no unit of the batch has an estimate (has_rest false).
  bool has_rest = false;
  std::vector<float> rest_out;  // [batch * num_q_heads * head_dim]
  std::vector<float> rest_lse;  // [batch * num_q_heads]
};

inline constexpr int64_t kParallelSelectTokens = 32768;

class Retriever {
 public:
  // `threads` (optional, not owned) spreads a batch over (sequence, kv head).
  explicit Retriever(const RetrievalPolicy& policy, ThreadPool* threads = nullptr)
      : policy_(policy), threads_(threads) {}

  const RetrievalPolicy& policy() const { return policy_; }

  // seqs: [batch] caches with identical num_layers / num_kv_heads / head_dim.
  // q: [batch, num_q_heads, head_dim] fp32 (num_q_heads a multiple of num_kv_heads); may be null
  // for kFull and for ICE(r) followers. leader: see above (required for follower layers).
  Status Select(const std::vector<const SequenceCache*>& seqs, int layer, const float* q, int num_q_heads,
                PageSelection* out, const PageSelection* leader = nullptr) const;
  // Select with a policy per sequence (policies: [batch]; this retriever's own policy unused).
  Status SelectBatch(const std::vector<const SequenceCache*>& seqs, const std::vector<RetrievalPolicy>& policies,
                     int layer, const float* q, int num_q_heads, PageSelection* out,
                     const PageSelection* leader = nullptr) const;

  // One (sequence, kv head) under `policy`: appends to the three arrays. q_group: [group, head_dim].
  static Status SelectHead(const RetrievalPolicy& policy, const SequenceCache& seq, int layer, int kv_head,
                           const float* q_group, int group, std::vector<int32_t>* ids, std::vector<int32_t>* valid,
                           std::vector<int32_t>* leaves);

 private:
  RetrievalPolicy policy_;
  ThreadPool* threads_;
};

// Merges ranked lists rank by rank into at most k distinct leaves (first occurrence wins).
std::vector<int32_t> MergeRankByRank(const std::vector<std::vector<ScoredLeaf>>& lists, int k);

// GroupMerge::kMass: at most k distinct leaves of `lists` (one per query head, scores q_j . k) by
// w(l) = sum_j exp(c s_j(l)) / Z_j, Z_j = exp(fixed_logz[j]) + sum over list j of exp(c s), where
// fixed_logz[j] = log of head j's sum of exp(c q_j . k) over its sink and window tokens (-inf
// for none). Best weight first; ties by first occurrence in rank order (so equal lists give
// MergeRankByRank's answer).
std::vector<int32_t> MergeByMass(const std::vector<std::vector<ScoredLeaf>>& lists, int k, float c,
                                 const float* fixed_logz);

}  // namespace icecache::kvstore
