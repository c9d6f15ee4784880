// SequenceCache: one sequence's KV pages across all layers and kv heads, organised the IceCache
// way (docs/design.md §3):
//  * dense layers (the first `dense_layers`): every token in pages in position order, no tree;
//  * sparse layers, per kv head: sink pages (the first sink_pages * page_size tokens, in order),
//    a DciTree over the middle tokens, and window pages (the most recent tokens, at most
//    window_pages pages, page-aligned so that appended tokens fill the last one). When a token
//    arrives while the window is full, the window's oldest page is inserted into the tree and
//    its page is reused for the new token.
//  * layout kTokenOrder (a baseline, SparseLayout): sparse layers keep the middle tokens in pages
//    in position order instead of a tree ("middle pages", all full), each with its per-channel
//    key min/max (the Quest page summary). An evicted window page joins the middle list as it is.
//    No ICE(r) (ice_group must be 1) and no wire form (Serialize: FAILED_PRECONDITION).
//  * ICE(r) (ice_group > 1): consecutive sparse layers form groups of ice_group; the first layer
//    of a group (the leader) owns the tree, whose leaves carry the followers' K/V as extra
//    payloads, so a follower reuses the leader's selection and runs no query.
//
// Inputs are fp32; pages store the pool's dtype. Keys are post-RoPE (after q/k-norm if any).
//
// Ownership: the cache owns every page it holds (freed by Release() or the destructor); `pool`
// must outlive it. Thread safety: const methods may run concurrently; Build/Append/Release need
// exclusive access. After a failed Append (pool exhausted) the cache is marked broken and only
// Release()/destruction are allowed (other calls return FAILED_PRECONDITION).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "kvstore/dci_tree.h"
#include "kvstore/page_pool.h"

namespace icecache::kvstore {

// How a sparse layer stores its middle tokens (between sink and window).
enum class SparseLayout : int {
  kDciTree = 0,     // IceCache: a DciTree whose leaves are the pages (serving)
  kTokenOrder = 1,  // pages in position order with per-channel key min/max (Quest's layout)
};

struct SequenceCacheOptions {
  int num_layers = 0;      // >= 1
  int num_kv_heads = 0;    // >= 1
  int dense_layers = 2;    // first layers kept dense (no tree); clamped to num_layers
  int sink_pages = 2;      // >= 0
  int window_pages = 2;    // >= 0 (0: appended tokens go straight into the tree)
  int ice_group = 1;       // ICE(r) group size over sparse layers; 1 = off, the paper uses 3
  DciParams dci;           // every tree of the sequence uses these (same seed: shared directions)
  SparseLayout layout = SparseLayout::kDciTree;
};

// The flat wire form of a sequence: metadata (versioned) and the list of source page ids in the
// order the pages must be shipped. Page contents travel separately (e.g. UCX straight into the
// destination pool); the receiver passes its own page ids in the same order to Deserialize.
struct SequenceWire {
  std::vector<uint8_t> metadata;
  std::vector<int32_t> pages;
};

class SequenceCache {
 public:
  static constexpr uint32_t kWireVersion = kKvWireVersion;  // kvstore/wire.h

  static StatusOr<std::unique_ptr<SequenceCache>> Create(const SequenceCacheOptions& options, PagePool* pool);
  ~SequenceCache();
  SequenceCache(const SequenceCache&) = delete;
  SequenceCache& operator=(const SequenceCache&) = delete;

  // Prefill. k[l], v[l] for each layer l: [n, num_kv_heads, head_dim] fp32. REQUIRES an empty
  // cache. Work is spread over (layer, kv-head) on `threads` (nullptr: the calling thread).
  // On error nothing stays allocated.
  Status Build(const float* const* k, const float* const* v, int64_t n, ThreadPool* threads = nullptr);
  // Layer-by-layer prefill, equivalent to Build (a forward pass produces K/V one layer at a time,
  // so layer l can be built while l+1 computes): BeginBuild(n); then BuildLayers for consecutive
  // ranges [first, first + count) in layer order, each ending where EndsGroup() (an ICE leader's
  // tree needs its followers' K/V), k[i], v[i] = layer first + i, [n, num_kv_heads, head_dim]
  // fp32; then FinishBuild() once every layer is built (num_tokens() stays 0 until then). On a
  // BuildLayers error nothing stays allocated and the cache is empty again.
  Status BeginBuild(int64_t n);
  Status BuildLayers(int first, int count, const float* const* k, const float* const* v, ThreadPool* threads = nullptr);
  Status FinishBuild();
  int built_layers() const { return built_layers_; }
  // True when `layer` is dense or the last layer of its ICE group.
  bool EndsGroup(int layer) const { return IsDense(layer) || layer == LeaderOf(layer) + GroupSize(LeaderOf(layer)) - 1; }
  // Decode: appends one token. k[l], v[l]: [num_kv_heads, head_dim] fp32 for each layer.
  // Equivalent to BeginToken() then WriteLayer(l, k[l], v[l]) for every layer.
  Status Append(const float* const* k, const float* const* v);
  // Layer-by-layer decode (a forward pass produces K/V one layer at a time, and the token must
  // attend to itself): BeginToken() makes room for the next position in every (layer, head) —
  // pushing the window's oldest page into the trees when the window is full — and counts the
  // token (num_tokens() grows by one, the new slots are selected as window/sink/dense pages);
  // then WriteLayer(l, k, v) fills position num_tokens()-1 of layer l (k, v: [num_kv_heads,
  // head_dim] fp32), before that layer's attention reads it. FAILED_PRECONDITION with
  // window_pages == 0 past the sink (such tokens go straight into the tree: use Append).
  Status BeginToken();
  Status WriteLayer(int layer, const float* k, const float* v);
  // Frees every page; the cache becomes empty (and usable again).
  void Release();

  const SequenceCacheOptions& options() const { return options_; }
  PagePool* pool() const { return pool_; }
  int64_t num_tokens() const { return n_; }
  int64_t sink_tokens() const { return sink_tokens_; }     // positions [0, sink_tokens)
  int64_t window_start() const { return window_start_; }  // window holds [window_start, n)
  int64_t pages_held() const;

  bool IsDense(int layer) const { return layer < options_.dense_layers; }
  // ICE(r): the layer whose tree serves `layer`, and the payload index of `layer` in it.
  int LeaderOf(int layer) const;
  int PayloadOf(int layer) const { return layer - LeaderOf(layer); }

  // Pages of (layer, kv_head). Valid slots: dense/sink/window pages are filled in position order,
  // every page full except possibly the last of each list.
  const std::vector<int32_t>& dense_pages(int layer, int head) const { return Head(layer, head).dense; }
  const std::vector<int32_t>& sink_pages(int layer, int head) const { return Head(layer, head).sink; }
  const std::vector<int32_t>& window_pages(int layer, int head) const { return Head(layer, head).window; }
  int dense_valid(size_t i) const { return ListValid(i, n_); }
  int sink_valid(size_t i) const { return ListValid(i, sink_tokens_); }
  int window_valid(size_t i) const { return ListValid(i, n_ - window_start_); }
  // kTokenOrder layout: the middle pages of a sparse (layer, head) in position order (page i holds
  // positions sink_tokens() + i * page_size ..), all full, and their key bounds
  // [pages, 2, head_dim] fp32: per channel the min (row 0) and max (row 1) of the keys as stored
  // in the pool's dtype. Empty for the tree layout and for dense layers.
  const std::vector<int32_t>& middle_pages(int layer, int head) const { return Head(layer, head).middle; }
  const std::vector<float>& middle_bounds(int layer, int head) const { return Head(layer, head).bounds; }
  int middle_valid(size_t i) const { return ListValid(i, window_start_ - sink_tokens_); }
  bool token_order() const { return options_.layout == SparseLayout::kTokenOrder; }
  // The tree serving a sparse layer (the leader's for a follower); nullptr for dense layers and
  // for the kTokenOrder layout.
  const DciTree* tree(int layer, int head) const;

  // Where position `pos` lives in (layer, head): page id and slot. REQUIRES 0 <= pos < n.
  TokenLocation LocateToken(int layer, int head, int64_t pos, int32_t* page) const;
  // Where the next Append (or BeginToken) will put position num_tokens() in (layer, head) when it
  // lands in a page this cache already holds: that page in *page and the slot (what LocateToken
  // returns after the append). *page = -1 when the append opens a new page there (at a page
  // boundary, after pushing a full window into the trees) or sends the token into the tree
  // (window_pages == 0 past the sink); callers treat -1 as "not known in advance".
  TokenLocation NextTokenLocation(int layer, int head, int32_t* page) const;
  // The pages whose contents the last BeginToken/Append changed other than by writing the new
  // token's slot, or that it freed (sorted, unique): the tree leaves the window push (or, with
  // window_pages == 0, the token) wrote, split or re-sorted, and the window pages it pushed into
  // the trees and gave back to the pool. Every page not listed and not holding the new token is
  // byte for byte as before (a device copy of it stays valid). Empty after other calls' steps
  // that push nothing.
  const std::vector<int32_t>& pages_changed() const { return pages_changed_; }

  // An independent copy in the same pool: new pages with the same contents, the same tokens,
  // lists and trees (through the wire form, so the copy is what a decode worker would receive).
  // RESOURCE_EXHAUSTED when the pool lacks the pages (nothing is allocated then);
  // FAILED_PRECONDITION as Serialize (a broken cache, the token-order layout) and in the middle
  // of a layered build.
  StatusOr<std::unique_ptr<SequenceCache>> Clone() const;
  // An independent cache of positions [0, n) only, in the same pool: their K/V read back from
  // the pages (exact: the pool's dtype round-trips through fp32) and built anew, trees included,
  // as a prefill of those n tokens would build them (Build). A retained sequence's prefix shared
  // by a request that diverges after it (decode_worker/prefix_cache.h). n == num_tokens() is
  // Clone(). INVALID_ARGUMENT for n outside [1, num_tokens()]; RESOURCE_EXHAUSTED when the pool
  // lacks the pages; FAILED_PRECONDITION as Clone.
  StatusOr<std::unique_ptr<SequenceCache>> ClonePrefix(int64_t n, ThreadPool* threads = nullptr) const;

  // Wire form (see SequenceWire). Pages listed per (layer, head): sink, window, dense, tree.
  StatusOr<SequenceWire> Serialize() const;
  // Rebuilds a cache in `pool` from metadata and destination page ids (same order as
  // SequenceWire::pages, contents already in place). On success the cache owns the pages; on
  // error the caller still owns them. DATA_LOSS / INVALID_ARGUMENT name the problem; a form whose
  // fields parse but disagree (page counts that do not match the token counts, a tree on a dense
  // or follower layer, a sparse leader without its tree) is DATA_LOSS.
  static StatusOr<std::unique_ptr<SequenceCache>> Deserialize(const uint8_t* metadata, size_t size, const int32_t* pages,
                                                              size_t num_pages, PagePool* pool);

  // Splits a sequence by kv head into `parts` caches of num_kv_heads / parts heads each: part p
  // holds global heads [p * heads, (p + 1) * heads) as its heads 0.., in the same pool, with the
  // same tokens, options and trees (a tensor-parallel rank's heads, docs/parallel.md). The pages
  // and trees move into the parts; nothing is copied, and `whole` ends empty.
  // With more parts than kv heads (parts a multiple of num_kv_heads: replicated kv heads), part p
  // holds global head p / (parts / num_kv_heads) alone: the first part of each head takes `whole`'s
  // pages and tree, the others independent copies (Clone), so the pool then holds
  // parts / num_kv_heads times the sequence's pages.
  // INVALID_ARGUMENT when parts neither divides num_kv_heads nor is a multiple of it (or is < 1);
  // FAILED_PRECONDITION for a broken cache or one in the middle of a layered build;
  // RESOURCE_EXHAUSTED when the pool cannot hold the copies. On every error `whole` is released
  // (its pages and any copies' go back to the pool) and nothing is returned.
  static StatusOr<std::vector<std::unique_ptr<SequenceCache>>> SplitByHead(std::unique_ptr<SequenceCache> whole,
                                                                           int parts);

 private:
  struct HeadState {
    std::vector<int32_t> sink, window, dense;
    std::unique_ptr<DciTree> tree;  // leaders of sparse layers only
    std::vector<int32_t> middle;    // kTokenOrder only
    std::vector<float> bounds;      // kTokenOrder only: [middle.size(), 2, head_dim]
  };
  SequenceCache(const SequenceCacheOptions& options, PagePool* pool);
  HeadState& Head(int layer, int head) { return heads_[static_cast<size_t>(layer) * options_.num_kv_heads + head]; }
  const HeadState& Head(int layer, int head) const {
    return heads_[static_cast<size_t>(layer) * options_.num_kv_heads + head];
  }
  int ListValid(size_t i, int64_t tokens) const {
    const int64_t v = tokens - static_cast<int64_t>(i) * page_size_;
    return static_cast<int>(v < 0 ? 0 : (v > page_size_ ? page_size_ : v));
  }
  int GroupSize(int leader) const;  // layers served by this leader's tree
  // Cross-field invariants of a deserialized cache (token counts against page lists and trees),
  // so that no later call indexes an empty list or a missing tree. DATA_LOSS naming the field.
  Status CheckWireInvariants() const;
  Status AppendToList(std::vector<int32_t>* pages, int64_t index_in_list, const float* k, const float* v);
  Status FillList(std::vector<int32_t>* pages, const float* k, const float* v, size_t stride, int64_t count);
  Status EvictWindowPage();
  // Which list of a (layer, head) of `layer` takes position num_tokens() (what BeginToken and
  // NextTokenLocation share), with the position's index in it in *index; kTree: the token goes
  // straight into the tree (window_pages == 0 past the sink).
  enum class NextList { kDense, kSink, kWindow, kTree };
  NextList NextTokenList(int layer, int64_t* index) const;
  // kTokenOrder: (re)computes the bounds of middle page `i` of `h` from its first `valid` slots.
  void SetBounds(HeadState* h, size_t i, int valid);

  SequenceCacheOptions options_;
  PagePool* pool_;
  int page_size_;
  int head_dim_;
  int64_t n_ = 0;
  int64_t sink_tokens_ = 0;
  int64_t window_start_ = 0;
  bool broken_ = false;
  int64_t build_n_ = -1;  // tokens of the layered build in progress, -1: none
  int built_layers_ = 0;
  std::vector<HeadState> heads_;  // [num_layers, num_kv_heads]
  std::vector<int32_t> pages_changed_;  // see pages_changed()
  std::vector<int32_t> tree_written_;   // scratch: one tree insertion's written pages
};

// Copies page contents between pools of the same geometry (src_ids[i] -> dst_ids[i]); what a
// transport does over the network, for local use and tests.
Status CopyPages(const PagePool& src, const std::vector<int32_t>& src_ids, PagePool* dst,
                 const std::vector<int32_t>& dst_ids);

}  // namespace icecache::kvstore
