// KV selection methods of the fidelity benchmarks (accuracy, perplexity): one prompt is prefilled
// densely (model::DenseKvCache), its K/V are read back and built into a kvstore::SequenceCache in
// the layout the method needs, and decoding then runs through decode::IceCacheBackend, the decode
// worker's backend (the selection, page cache and attention code that serve requests).
//
// Budget unit: pages of the pool's page size (16 tokens), sink and window pages included, as
// everywhere else (cache.default_budget_pages, `generate --budget`, the retrieval and decode
// benches). With S sink and W window pages (serving defaults S = W = 2, cache.sink_pages /
// cache.window_pages) a budget of B pages is
//   icecache  S sink + (B - S - W) DCI-tree leaves (RetrievalMode kSparse, what serves) + W window
//   oracle    S sink + (B - S - W) exact best tree leaves (kOracle) + W window
//   quest     S sink + (B - S - W) middle pages in position order ranked by Quest's bound (kQuest,
//             SparseLayout::kTokenOrder) + W window
//   window    S sink + (B - S) window pages (StreamingLLM-style: the cache is built with a wider
//             window and nothing is retrieved)
//   full      every page (kFull; the budget is ignored)
// icecache and oracle also merge in the estimated attention of the tree leaves they leave out
// (kvstore::RetrievalPolicy::estimate_rest, the serving default; KvMethod::estimate_rest); that
// estimate reads only the leaves' mean keys and values, no page of theirs.
// so every budgeted method attends to at most B * 16 tokens of the prompt in each sparse layer
// (the first dense_layers layers are always dense, as served).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "decode_worker/icecache_backend.h"
#include "kernels/backend.h"
#include "kvstore/dci_tree.h"
#include "kvstore/page_pool.h"
#include "kvstore/retriever.h"
#include "model/model.h"

namespace icecache::bench {

// The KV layout shared by every method of a run (serving defaults: the cluster's cache.*).
struct KvLayout {
  int dense_layers = 2;
  int sink_pages = 2;
  int window_pages = 2;
  kernels::DType dtype = kernels::DType::kBF16;  // cache.kv_dtype
  int page_size = 16;
};

struct KvMethod {
  std::string name;        // full | oracle | icecache | quest | window
  int budget_pages = 0;    // ignored for full
  kvstore::DciParams dci;  // the tree's parameters (icecache, oracle; also used to build full)
  int ice_group = 1;       // ICE(r) over the sparse layers (tree methods only)
  bool fov_swept = false;  // icecache: dci carries one point of a field-of-view sweep
  kvstore::GroupMerge merge = kvstore::RetrievalPolicy{}.merge;  // the serving default
  // Tree methods (icecache, oracle): merge in the estimate of the leaves left out
  // (kvstore::RetrievalPolicy::estimate_rest, the serving default); quest and window never have one.
  bool estimate_rest = kvstore::RetrievalPolicy{}.estimate_rest;
  int rest_cells = kvstore::RetrievalPolicy{}.rest_cells;  // its resolution (RetrievalPolicy::rest_cells)
};

// The methods' names, comma separated, for usage text.
inline constexpr const char kKvMethodNames[] = "full,oracle,icecache,quest,window";

// Whether the method selects from a DCI tree (icecache, oracle), so that DciParams (its seed
// included) change its answers.
inline bool TreeMethod(const std::string& name) { return name == "icecache" || name == "oracle"; }

// INVALID_ARGUMENT naming the method when its budget leaves no retrieved page (icecache, oracle,
// quest: B > S + W; window: B > S) or the name is unknown.
Status ValidateKvMethod(const KvMethod& m, const KvLayout& layout);

// Dense prefill of `ids` (all of them) and the K/V read back: k[l], v[l] are
// [ids.size(), num_kv_heads, head_dim] fp32, post-RoPE. `logits` (optional) gets the last
// token's logits [vocab].
struct PrefillKv {
  int64_t n = 0;
  std::vector<std::vector<float>> k, v;
};
StatusOr<PrefillKv> PrefillDense(model::Model& m, std::span<const int32_t> ids, std::vector<float>* logits = nullptr);

// A pool for one sequence of up to `tokens` tokens (prompt + decoded) under any method.
StatusOr<std::unique_ptr<kvstore::PagePool>> MakeMethodPool(const model::AttentionShape& shape, const KvLayout& layout,
                                                           int64_t tokens);

// Builds the method's SequenceCache over `kv` in `pool` and imports it as sequence 0 of a new
// backend on the model's device. `fov` (optional) gets the first sparse layer's tree field of
// view (0 without a tree).
StatusOr<std::unique_ptr<decode::IceCacheBackend>> ImportMethod(model::Model& m, kvstore::PagePool* pool,
                                                                const PrefillKv& kv, const KvMethod& method,
                                                                const KvLayout& layout, int64_t* fov = nullptr);

// Feeds `tok` to sequence 0 of `be` and writes the next-token logits [vocab] to `logits`.
Status DecodeStep(model::Model& m, model::AttentionBackend& be, int32_t tok, std::vector<float>* logits);

// "icecache b16", "full", "icecache b16 fov_min 32 frac 0.001".
std::string MethodLabel(const KvMethod& m);

// "a,b,,c" -> {"a", "b", "c"}: the benches' comma lists (empty items dropped).
std::vector<std::string> Split(const std::string& s);

// "rank,mass" -> the GroupMerges named, in order; empty -> the serving default alone.
// INVALID_ARGUMENT naming the bad entry.
StatusOr<std::vector<kvstore::GroupMerge>> ParseGroupMerges(const std::string& list);

// "on,off" -> the rest-estimate settings named, in order; empty -> the serving default alone.
// INVALID_ARGUMENT naming the bad entry.
StatusOr<std::vector<bool>> ParseRestEstimates(const std::string& list);

// The tree methods' variants of a run: every --rest-estimate setting, and with the estimate on,
// every --rest-cells value ("0,32"; empty -> the serving default). Each variant is
// (estimate_rest, rest_cells). INVALID_ARGUMENT naming the bad entry.
StatusOr<std::vector<std::pair<bool, int>>> ParseRestVariants(const std::string& estimates, const std::string& cells);

// Parses --kv-dtype f32|bf16|f16.
StatusOr<kernels::DType> ParseKvDtype(const std::string& s);

}  // namespace icecache::bench
