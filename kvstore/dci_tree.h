// DciTree: the IceCache index of one (layer, kv-head). A hierarchical prioritized-DCI k-NN tree
// over the head's post-RoPE keys whose leaves are physical KV pages of a PagePool, so that
// semantically related tokens share pages. See docs/kvstore.md and docs/design.md §3.
//
// Model (all defaults are the reference code's, every one configurable in DciParams):
//  * MIPS -> NN: key k -> k' = [k, sqrt(M - |k|^2)], M = norm_headroom * running max |k|^2;
//    query q -> q' = [q * sqrt(M)/|q|, 0] (same sphere as the keys, so projections compare).
//    Nearest k' to q' <=> largest q.k. A key with a new max norm raises M; cached projections
//    are then re-keyed lazily (a cell is re-sorted the next time an insertion touches it).
//  * Every token is a node on exactly one level. Level 1 holds ~ceil(n*p1) tokens, each higher
//    level ceil(p2 * the one below) until a level has <= top_level_max_nodes. Each node of level
//    l attaches to its nearest node of level l+1 (exact when that level has <=
//    exact_parent_max_nodes nodes, prioritized DCI with m simple x L composite random unit
//    directions in R^(d+1) above); top-level nodes belong to a root cell.
//  * A node's children form its "cell", a chain of leaves; each leaf is one page per payload,
//    holding its tokens compactly in slots [0, valid). How a cell is cut is DciParams::leaf_layout:
//    kProjection (the reference) keeps the children in order of their projection on direction 0,
//    spreads a cell of c children evenly over ceil(c / page_size) leaves at build, and on
//    insertion splits a full leaf half/half into a new page; kPosition (Flat()) keeps them in
//    token order in full leaves (only the last is partial) and appends insertions.
//  * Query: start from the root cell; on each level keep the field of view
//    fov = max(fov_min, fov_fraction * n, fov_sqrt * sqrt(n)) best nodes (exact q.k) and expand their cells, scoring
//    about cell_score_fraction of each cell's children exactly (the leaves nearest the query in
//    projection order). Result: the K best distinct leaves, ranked by the best scored token score.
//    With exhaustive_upper, every node of level >= 1 is scored (they are ~p1 of the tokens) from
//    the tree's contiguous int8 copy of their keys instead of a greedy descent through pages, and
//    the field of view picks which level-1 cells to expand: about the same work as the descent at
//    the reference fov, without its misses. Upper nodes that may enter the answer are rescored
//    exactly from a copy in the pool's element type (the same values as their page slots), so
//    answers carry exact scores. Only nodes that own a non-empty cell count toward the
//    field of view (near-duplicate keys make many childless nodes tie with the one that collected
//    their children). Options for a flatter cost (DciParams::Flat()): a sub-linear field of view
//    (fov_sqrt), a cap on the cells a GQA group expands (group_fov), and level-1 cells ranked by
//    the mean of their children's keys (centroid_cells, centroid_bonus) instead of by their owner.
//
// Payloads (ICE(r) reuse): a tree may carry num_payloads parallel page sets with the same layout
// (payload 0 is the indexed layer; payloads 1.. are follower layers whose K/V simply move with
// the leader's). Search uses payload 0's keys only.
//
// Tokens are identified by sequence position; the tree holds the contiguous range
// [first_position(), first_position() + size()). Insertions must continue that range.
//
// Ownership: the tree owns its leaf pages (allocated from `pool`, freed by the destructor or
// Release()). `pool` must outlive the tree. Thread safety: const methods (Query, Oracle, accessors)
// may run concurrently with each other; Insert/Release need exclusive access.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "kvstore/page_pool.h"
#include "kvstore/vector_ops.h"
#include "kvstore/wire.h"

namespace icecache::kvstore {

class DciIndex;

// How the children of a cell are cut into leaves (pages); docs/kvstore.md, "The tree".
enum class LeafLayout : uint8_t {
  // In order of their projection on direction 0, spread evenly over ceil(c / page_size) leaves;
  // an insertion joins the leaf its projection falls in and a full leaf splits half/half (the
  // reference). Needed when a query scores only part of a cell (cell_score_fraction < 1).
  kProjection = 0,
  // In token order, each leaf filled to page_size before the next starts (only a cell's last leaf
  // is partial); an insertion appends to the cell's last leaf (a new one when it is full), so no
  // token ever moves. Consecutive same-topic tokens that share a cell share a page.
  // REQUIRES cell_score_fraction = 1 (whole cells scored).
  kPosition = 1,
};

struct DciParams {
  int num_simple = 1;                  // m: simple indices per composite index
  int num_composite = 1;               // L: composite indices
  double p1 = 0.01;                    // fraction of tokens on level >= 1
  double p2 = 0.2;                     // each higher level, fraction of the one below
  int top_level_max_nodes = 5;         // a level this small is the top (>= 1)
  int exact_parent_max_nodes = 3000;   // exact parent search up to this many upper nodes
  int dci_parent_candidates = 64;      // nodes scored exactly by a DCI parent search
  int fov_min = 30;                    // field of view: max(fov_min, fov_fraction * n, fov_sqrt * sqrt(n)) nodes
  double fov_fraction = 1.5e-3;
  double fov_sqrt = 0;                 // >= 0; sub-linear growth of the field of view (0: off)
  // GQA groups (QueryGroup's shared traversal): > 0 caps the cells the group expands at
  // ceil(group_fov * fov), taken rank by rank over the heads' own best-fov lists (rank 0 of every
  // head, then rank 1, ...); 0: every head expands its own fov cells (union up to nq * fov).
  double group_fov = 0;
  // Which level-1 cells to expand: false ranks them by their owner's score q . k_owner (the
  // reference); true by q . c + centroid_bonus * |q| * b, where c is the mean of the cell's
  // children's keys (as stored in the pages) and b = spread * sqrt(2 ln(children) / head_dim), spread the
  // RMS distance of the children to c (an estimate of how far the best child lies above c).
  // The level-1 nodes' own keys are scored either way (their tokens are candidates).
  bool centroid_cells = false;
  double centroid_bonus = 0;           // >= 0
  double cell_score_fraction = 0.8;    // fraction of an expanded cell scored exactly, (0, 1]
  bool exhaustive_upper = false;       // score all nodes of levels >= 1 (fov: level-1 cells expanded)
  // Exact parent search on bf16-rounded keys: at insertion, and at build where int8_parent_search
  // does not apply (off, or head_dim > 4 * (kI8MaxQuads - kI8ExtraQuads) = 1020).
  bool bf16_parent_search = false;
  // The build's exact parent search on 8-bit rows and 6-bit keys with an exact int32 compare
  // (over bf16_parent_search; build only, head_dim <= 1020).
  bool int8_parent_search = false;
  double promote_fraction = 0.01;      // inserted tokens promoted to level 1 (new cells), [0, 1)
  double norm_headroom = 1.0;          // M = norm_headroom * max |k|^2, >= 1
  uint64_t seed = 0x1cecace;           // directions and level sampling
  LeafLayout leaf_layout = LeafLayout::kProjection;  // how cells are cut into leaves (above)

  // The reference with smaller cells (p1 = 0.02), whole cells scored, every upper node scored,
  // fov = max(32, 1e-3 n), and the quantised parent searches (int8 at build, bf16 at insertion).
  // Why these values: docs/kvstore.md, "Tunables"; current figures: docs/BENCHMARKS.md,
  // "Build, query and insertion".
  static DciParams Tuned() {
    DciParams p;
    p.p1 = 0.02;
    p.cell_score_fraction = 1.0;
    p.exhaustive_upper = true;
    p.bf16_parent_search = true;
    p.int8_parent_search = true;
    p.fov_min = 32;
    p.fov_fraction = 1e-3;
    return p;
  }
  // Tuned() with a selection cost that grows sub-linearly in the context: level-1 cells ranked
  // by their children's mean key plus a spread bonus (centroid_cells), fov = max(32, 0.182 sqrt(n)),
  // a GQA group expands at most fov cells in all (group_fov 1), and leaves in token order
  // (LeafLayout::kPosition). Why: docs/BENCHMARKS.md, "Flat-cost query options" and "Attention mass
  // kept"; the leaf layout: docs/kvstore.md, "The tree"; options measured and not served:
  // docs/kvstore.md, "Tried and not served".
  static DciParams Flat() {
    DciParams p = Tuned();
    p.fov_fraction = 0;
    p.fov_sqrt = 0.182;
    p.group_fov = 1;
    p.centroid_cells = true;
    p.centroid_bonus = 1;
    p.leaf_layout = LeafLayout::kPosition;
    return p;
  }
};

// Checks ranges; INVALID_ARGUMENT naming the field.
Status ValidateDciParams(const DciParams& p);

// The preset of a config's cache.dci_preset: "reference" (DciParams{}), "tuned" or "flat";
// INVALID_ARGUMENT naming the accepted names otherwise.
StatusOr<DciParams> DciParamsPreset(const std::string& name);
// The preset that serves by default (cache.dci_preset's default; benchmarks default to it too).
// Why Flat(): docs/BENCHMARKS.md, "Fidelity on SmolLM2" and "Attention mass kept"; against Tuned():
// docs/kvstore.md, "Tunables".
inline constexpr const char kServingDciPreset[] = "flat";

// Wire form of DciParams, field by field (no padding bytes). Deserialize: DATA_LOSS when
// truncated or a flag is not 0/1 (ranges are the caller's ValidateDciParams).
void SerializeDciParams(const DciParams& p, WireWriter* w);
Status DeserializeDciParams(WireReader* r, DciParams* p);

// Keys and values of `count` consecutive tokens for each payload.
// keys[p] / values[p]: [count, row_stride] fp32, the first head_dim values of each row used.
struct TokenBlock {
  int64_t first_position = 0;
  int count = 0;
  const float* const* keys = nullptr;    // [num_payloads]
  const float* const* values = nullptr;  // [num_payloads]
  size_t row_stride = 0;                 // >= head_dim
};

struct ScoredLeaf {
  int32_t leaf = -1;
  float score = 0.f;  // best q.k of the scored tokens in the leaf
};

// Work done by one query (for benchmarks and tuning).
struct QueryStats {
  int64_t tokens_scored = 0;
  int64_t leaves_scored = 0;
  int64_t cells_expanded = 0;
};

struct TokenLocation {
  int32_t leaf = -1;
  int32_t slot = -1;
};

class DciTree {
 public:
  // Builds the tree over `block` (count may be 0: an empty tree that insertions grow).
  // RESOURCE_EXHAUSTED if the pool runs out (nothing stays allocated); INVALID_ARGUMENT on bad
  // params or shapes.
  static StatusOr<std::unique_ptr<DciTree>> Build(const DciParams& params, PagePool* pool, int num_payloads,
                                                  const TokenBlock& block);
  ~DciTree();
  DciTree(const DciTree&) = delete;
  DciTree& operator=(const DciTree&) = delete;

  // Inserts tokens (block.first_position must equal end_position()). Each token finds its
  // parent by search and joins that cell (kProjection: in projection order, a full leaf splits;
  // kPosition: after the cell's last token, a new leaf when the last is full). No rebuild.
  // On RESOURCE_EXHAUSTED the tokens inserted before the failure stay in the tree.
  // written_pages, when given, is set to the pool pages whose contents the insertion changed
  // (sorted, unique; every payload of each leaf it wrote a row into: the leaf a token joined,
  // the half a split moved, the leaves of a cell it re-sorted), also after an error; every other
  // page of the tree is byte for byte as before (what a copy of the pages elsewhere, e.g. a
  // device page cache, must refresh).
  Status Insert(const TokenBlock& block, std::vector<int32_t>* written_pages = nullptr);

  // The query heads of one GQA group, qs [nq, head_dim]: out[j] (resized to nq) is the
  // min(k, num_leaves()) best leaves for head j (approximate; see above), best first, ties by leaf
  // id. With exhaustive_upper and cell_score_fraction = 1 the heads share one traversal: every cell
  // any head picks is scored once for all heads (each page read once), so each head's list is
  // ranked over a superset of the leaves it would score alone; group_fov caps the cells of a group
  // of two or more heads. Otherwise each head is searched alone. stats (if given): the work of
  // all heads. Thread-safe w.r.t. other const calls.
  void QueryGroup(const float* qs, int nq, int k, std::vector<std::vector<ScoredLeaf>>* out,
                  QueryStats* stats = nullptr) const;
  // One head, q [head_dim]: QueryGroup's answer for a group of one, into *out.
  void Query(const float* q, int k, std::vector<ScoredLeaf>* out, QueryStats* stats = nullptr) const;
  // The field of view at the current size: max(fov_min, ceil(fov_fraction * n), ceil(fov_sqrt * sqrt(n))).
  int64_t FieldOfView() const;
  // Exact: scores every token; the k leaves with the best token score, best first (ties by leaf id).
  void Oracle(const float* q, int k, std::vector<ScoredLeaf>* out) const;

  // The rest estimate (docs/kvstore.md, "Rest estimate"): the attention of the query heads qs
  // ([nq, head_dim] fp32) over every leaf NOT in skip[0, nskip) (leaf ids, any order, repeats and
  // out-of-range ids ignored), estimated from mean keys k̄ and mean values v̄ in `payload`: a
  // group of n tokens stands for them as one key of weight n, score
  //   x_j = scale * q_j . k̄ + log n,
  //   lse[j] = log sum exp(x_j),  out[j] = sum exp(x_j - lse[j]) v̄,
  // the form of kernels::MergeStates' second set. The groups: with expand_cells <= 0 or >= the
  // number of cells, every leaf left; otherwise the cells are ranked by their own mean key's best
  // score over the heads, and the expand_cells best (plus every cell holding a skipped leaf) count
  // leaf by leaf, each other cell as one group. lse[j] = -inf and out[j] = 0 when nothing is left.
  // out: [nq, head_dim], lse: [nq]. Cost: one pass over two rows (pool dtype) per leaf, or per
  // cell plus per leaf of the expanded cells. Thread-safe w.r.t. other const calls.
  void EstimateRest(const float* qs, int nq, float scale, int payload, const int32_t* skip, int nskip,
                    int expand_cells, float* out, float* lse) const;

  // Frees every page back to the pool; the tree becomes empty (size() == 0).
  void Release();
  // Forgets its pages without freeing them (ownership goes back to whoever shipped them in).
  void DetachPages() { leaf_pages_.clear(); Release(); }

  // Structure.
  int64_t size() const { return static_cast<int64_t>(level_.size()); }
  int64_t first_position() const { return first_position_; }
  int64_t end_position() const { return first_position_ + size(); }
  int num_payloads() const { return num_payloads_; }
  int32_t num_leaves() const { return static_cast<int32_t>(leaf_valid_.size()); }
  int32_t leaf_page(int32_t leaf, int payload = 0) const { return leaf_pages_[static_cast<size_t>(leaf) * num_payloads_ + payload]; }
  int leaf_valid(int32_t leaf) const { return leaf_valid_[leaf]; }
  int32_t leaf_cell(int32_t leaf) const { return leaf_cell_[leaf]; }  // cells numbered by their first child's position
  // Sequence positions of the valid slots of `leaf`, in slot order.
  std::vector<int64_t> LeafPositions(int32_t leaf) const;
  TokenLocation Locate(int64_t position) const;  // REQUIRES position in range
  int Level(int64_t position) const { return level_[position - first_position_]; }  // REQUIRES position in range
  int num_levels() const { return static_cast<int>(level_counts_.size()); }
  std::vector<int64_t> level_counts() const { return level_counts_; }  // [num_levels], level 0 first
  int32_t num_cells() const { return static_cast<int32_t>(cells_.size()); }
  float max_norm2() const { return max_norm2_; }
  const DciParams& params() const { return params_; }
  PagePool* pool() const { return pool_; }

  // Verifies every structural invariant (each token in exactly one slot, location map, leaf
  // compactness, the leaf layout's order within each cell (projection order in up-to-date cells,
  // or token order with only the last leaf partial), parent levels, page ownership).
  // INTERNAL naming the first violation.
  Status CheckInvariants() const;

  // Wire form of the metadata; pages are listed in AllPages() order and shipped separately.
  void Serialize(WireWriter* w) const;
  // Pages in wire order: leaf-major, payload-minor.
  std::vector<int32_t> AllPages() const { return leaf_pages_; }
  // Rebuilds a tree whose pages (already holding the shipped contents, in AllPages() order) are
  // `pages`; the tree takes ownership of them.
  static StatusOr<std::unique_ptr<DciTree>> Deserialize(WireReader* r, PagePool* pool, const int32_t* pages,
                                                        size_t num_pages, size_t* pages_used);

 private:
  struct Cell {
    int32_t owner = -1;               // node (tree-local token index) or -1 for the root cell
    uint32_t epoch = 0;               // re-key epoch its order was computed in
    int32_t count = 0;                // children
    std::vector<int32_t> leaves;      // in the layout's order (projection or token order)
  };
  class Scratch;
  // Level l's keys transposed for batched exact parent search ([head_dim, ld]; extra [ld]); with
  // bf16 set, as bf16 pairs in rows_p ([ceil(head_dim / 2), ld]) instead of rows_t.
  struct LevelMatrix {
    std::vector<float> rows_t, extra;
    std::vector<uint32_t> rows_p;
    int ld = 0, rows = 0;
    bool bf16 = false;
    uint32_t epoch = ~0u;
  };

  DciTree(const DciParams& params, PagePool* pool, int num_payloads);
  Status BuildFrom(const TokenBlock& block);
  // Sets parent_ of every member (nodes of level l, keys[t * stride]) to its nearest node of
  // level l + 1 (dci_tree_parents.cc).
  void AttachLevel(int l, const std::vector<int32_t>& members, const float* keys, size_t stride);
  Status InsertBlock(const TokenBlock& block);  // Insert without collecting written pages
  Status InsertOne(const TokenBlock& block, int i, int level = -1, int32_t parent = -2);
  void RefreshLevelMatrix(int level, LevelMatrix* m, bool bf16 = false) const;
  void SetDirections();
  float OrderProjection(int32_t t) const;
  // The augmented coordinate of a key with squared norm n2: sqrt(M - n2), M = max_norm2_.
  float AugExtra(float n2) const { return std::sqrt(std::max(0.f, max_norm2_ - n2)); }
  void Rekey(float new_max_norm2);
  void UpperAug(int32_t t, float* out) const;  // [head_dim + 1] augmented key of an upper node
  int32_t FindParent(int level, const float* aug);  // node on `level` nearest to aug
  DciIndex* LevelIndex(int level);                   // prioritized DCI over a level, kept current
  int32_t CellOf(int32_t node);                            // creates an empty cell if needed
  void ResortCell(int32_t cell);
  Status InsertIntoCell(int32_t cell, int32_t t, const TokenBlock& block, int i);
  int32_t NewLeaf(int32_t cell, const int32_t* pages);
  void MoveSlot(int32_t from_leaf, int from_slot, int32_t to_leaf, int to_slot);
  // Records that `leaf`'s pages changed, into written_ when an Insert collects them. Every write
  // of page rows goes through WriteToken, MoveSlot or ResortCell, which call it.
  void NoteWritten(int32_t leaf);
  // stream: non-temporal stores (StreamRowFromF32); the caller fences (StoreFence) after.
  void WriteToken(int32_t leaf, int slot, const TokenBlock& block, int i, bool stream = false);
  void ScoreLeaf(int32_t leaf, const float* q, Scratch* s) const;  // Oracle
  float LeafFirstProj(int32_t leaf) const { return order_proj_[leaf_tokens_[static_cast<size_t>(leaf) * page_size_]]; }
  float LeafLastProj(int32_t leaf) const {
    return order_proj_[leaf_tokens_[static_cast<size_t>(leaf) * page_size_ + leaf_valid_[leaf] - 1]];
  }
  void AddUpperNode(int level, int32_t t, const float* key);
  void RebuildLevelRows();  // level_rows_ and level_rows_i8_ from level_keys_
  void AppendUpperI8(int level, const void* row);  // row (pool dtype) appended to level_rows_i8_[level]
  // Query helpers (dci_tree_query.cc).
  void ScoreLeaves(const float* q, Scratch* s, bool collect) const;
  void PlanCells(const std::vector<int32_t>& cells, float qproj, double fraction, Scratch* s) const;
  // The k best of the scored leaves (s->entries, distinct leaves), best first.
  void SelectLeaves(Scratch* s, int k, std::vector<ScoredLeaf>* out) const;
  // Query and QueryGroup: the answers of nq heads qs ([nq, head_dim]) into out[0, nq).
  void QueryHeads(const float* qs, int nq, int k, std::vector<ScoredLeaf>* out, QueryStats* stats) const;
  // One head without exhaustive_upper (or a one-level tree): the greedy descent from the root cell.
  void Descend(const float* q, int k, std::vector<ScoredLeaf>* out, QueryStats* stats) const;
  // Appends to `cells` the cells of the best `fov` of n nodes (scores[i], nodes[i]) that own a
  // non-empty cell (ties: lower index first), and their owners' scores to `cell_scores` if given.
  // scores is overwritten.
  void ChooseCells(float* scores, const int32_t* nodes, int n, int64_t fov, Scratch* s, std::vector<int32_t>* cells,
                   std::vector<float>* cell_scores = nullptr) const;

  DciParams params_;
  PagePool* pool_;
  int num_payloads_;
  int dim_;
  int page_size_;
  int64_t first_position_ = 0;
  float max_norm2_ = 0.f;             // M
  uint32_t epoch_ = 0;                // bumped on each re-key
  uint64_t rng_state_ = 0;            // promotion sampling on insert
  std::vector<int32_t>* written_ = nullptr;  // during Insert(block, written_pages): the pages changed
  std::vector<float> directions_;     // [m*L, head_dim + 1] unit vectors

  // Per token (tree-local index t = position - first_position_).
  std::vector<int8_t> level_;
  std::vector<int32_t> parent_;       // node one level up, -1 for top-level nodes
  std::vector<int32_t> node_cell_;    // cell of a node's children, -1 if none
  std::vector<int32_t> tok_leaf_;
  std::vector<int16_t> tok_slot_;
  std::vector<float> norm2_;
  std::vector<float> proj_raw_;       // direction 0 . k (first head_dim components)
  std::vector<float> order_proj_;     // cached projection the token is ordered by in its cell

  // Upper levels (index l >= 1): nodes and their fp32 keys [nodes, head_dim].
  std::vector<std::vector<int32_t>> level_nodes_;
  std::vector<std::vector<float>> level_keys_;
  std::vector<std::vector<uint8_t>> level_rows_;  // the same keys in the pool's dtype (queries)
  // level_rows_' values again in int8 (RowBlocksI8): a query scores the upper levels from these
  // (half the bytes of bf16) and rescores exactly from level_rows_ only the nodes whose bound
  // lets them reach its answer.
  std::vector<RowBlocksI8> level_rows_i8_;
  // Level-1 cell summaries (centroid_cells): per level-1 node i (level_nodes_[1][i]) its children's
  // keys as stored in the pages, folded in token order (so a fold from scratch and the catch-up
  // after insertions give identical sums). Written by BuildFrom, by Deserialize (the sums travel
  // on the wire; the rows are recomputed), and by the first query after an insertion (under mu;
  // upto == size() afterwards, and only Insert, which is exclusive with queries, makes them
  // differ again).
  struct CellSummaries {
    std::mutex mu;
    std::atomic<int64_t> upto{0};  // tokens [0, upto) folded in
    std::vector<float> sum;        // [n1, head_dim]
    std::vector<double> sumsq;     // [n1] sum of squared norms
    std::vector<int32_t> count;    // [n1]
    std::vector<uint8_t> rows;     // [n1, head_dim] pool dtype: the mean (the node's own key while childless)
    std::vector<float> bonus;      // [n1] spread * sqrt(2 ln count / head_dim)
  };
  mutable CellSummaries summaries_;
  // out[j * n1 + i]: query head j's ranking score of level-1 cell i (REQUIRES summaries current).
  void ScoreCentroids(const float* qs, int nq, float* out) const;
  void RefreshSummaries() const;  // folds tokens [upto, size()) in; thread-safe w.r.t. other queries
  // Folds tokens [upto, size()) in, their keys read from `keys` ([size(), stride] fp32, rounded to
  // the pool dtype as the pages hold them) or, when null, from the pages; recomputes the rows of
  // the nodes touched, or of all nodes with all_rows.
  void FoldSummaries(const float* keys, size_t stride, bool all_rows) const;
  void ResetSummaries();
  // Leaf means (EstimateRest): per payload, each leaf's mean key and mean value over its valid
  // slots, in the pool dtype ([num_leaves, head_dim] each; zeros for an empty leaf). A function of
  // the leaf's pages alone, so not on the wire: BuildFrom and Deserialize compute every leaf's,
  // Insert those of the leaves it changed (NoteWritten and MoveSlot list them in dirty) before it
  // returns, also after an error.
  // Cell means likewise, per cell: its leaves' means weighted by their token counts.
  struct LeafMeans {
    std::vector<std::vector<uint8_t>> key, value;            // [num_payloads][num_leaves * row_bytes]
    std::vector<std::vector<uint8_t>> cell_key, cell_value;  // [num_payloads][num_cells * row_bytes]
    std::vector<float> cell_log_count;                       // [num_cells] log(tokens in the cell's leaves), -inf for 0
    std::vector<int32_t> dirty;                              // leaves changed since the last refresh (may repeat)
  };
  LeafMeans means_;
  void MeanLeaf(int32_t leaf);  // means_' rows of `leaf` from its pages
  void MeanCell(int32_t cell);  // means_' cell rows of `cell` from its leaves' rows
  void MeanAllLeaves();
  void RefreshDirtyMeans();     // MeanLeaf for each dirty leaf, MeanCell for their cells (rows sized), then clears the list
  // s->order = the leaves to score (set by the caller); fills s->rows / s->valid and prefetches.
  void PlanLeaves(Scratch* s) const;
  std::vector<int64_t> level_counts_;  // nodes per level (level 0 first)
  LevelMatrix level1_matrix_;          // cache for insertions (not serialised)
  struct CachedIndex {
    std::unique_ptr<DciIndex> index;
    uint32_t epoch = ~0u;
    int rows = 0;
  };
  std::vector<CachedIndex> level_index_;  // per level, for DCI parent search (not serialised)

  // Leaves.
  std::vector<int32_t> leaf_pages_;   // [num_leaves, num_payloads]
  std::vector<int32_t> leaf_valid_;
  std::vector<int32_t> leaf_cell_;
  std::vector<int32_t> leaf_tokens_;  // [num_leaves, page_size], tree-local token of each slot
  std::vector<Cell> cells_;           // cells_[0] is the root cell once the tree is non-empty
};

}  // namespace icecache::kvstore
