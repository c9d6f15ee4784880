// DciTree queries: multi-level prioritized search and the exact oracle.
#include <algorithm>
#include <cmath>
#include <functional>

#include "kvstore/dci_tree.h"
#include "kvstore/vector_ops.h"

namespace icecache::kvstore {

namespace {

// Query heads in int8 (QuantizeKeyI8, extra 0) for the upper levels' first pass (ScoreRowsI8),
// with what RowBlocksI8::ErrorBound needs to say how far those scores may lie from exact.
struct I8Heads {
  std::vector<uint32_t> words;  // [nq, stride]
  std::vector<int32_t> sum;
  std::vector<float> scale, l1;  // [nq]
  int stride = 0;
  void Set(const float* qs, int nq, int dim) {
    stride = I8Quads(dim);
    words.resize(static_cast<size_t>(nq) * stride);
    sum.resize(nq);
    scale.resize(nq);
    l1.assign(nq, 0.f);
    for (int j = 0; j < nq; ++j) {
      const float* q = qs + static_cast<size_t>(j) * dim;
      sum[j] = QuantizeKeyI8(q, dim, 0.f, words.data() + static_cast<size_t>(j) * stride, &scale[j]);
      for (int i = 0; i < dim; ++i) l1[j] += std::fabs(q[i]);
    }
  }
  // out: [nq, rows.rows]
  void Score(const RowBlocksI8& rows, float* out) const {
    ScoreRowsI8(rows, words.data(), stride, sum.data(), scale.data(), static_cast<int>(sum.size()), out);
  }
  // ErrorBound plus room for the fp32 roundings of both scores (each well under 1e-3 of the
  // bound's l1 * S / 2 term at head_dim <= 1024).
  float Slack(const RowBlocksI8& rows, int j) const { return 1.01f * rows.ErrorBound(l1[j], scale[j]); }
};

}  // namespace

// Per-thread working memory of a query, reused across calls.
class DciTree::Scratch {
 public:
  using Entry = std::pair<float, int32_t>;
  void Begin() {
    entries.clear();
    next_s.clear();
    next_n.clear();
    cells.clear();
    stats = QueryStats{};
  }
  std::vector<Entry> entries;  // (best scored token, leaf) of each leaf scored from its page
  std::vector<float> cand_s, next_s;      // greedy descent: scores and nodes of the next level
  std::vector<int32_t> cand_n, next_n;
  std::vector<int32_t> keys;
  std::vector<int32_t> cells;  // cells to expand
  std::vector<Entry> picked;   // ChooseCells: (score, node, then its cell) of the nodes taken
  std::vector<int32_t> order;  // leaves to score, in scoring order
  std::vector<const void*> rows;  // K block of each leaf of `order`
  std::vector<int> valid;
  // Prefetches (into L2) the K rows of planned leaf i.
  void PrefetchLeaf(size_t i, size_t row_bytes) const {
    const char* k = static_cast<const char*>(rows[i]);
    for (size_t off = 0; off < valid[i] * row_bytes; off += 64) __builtin_prefetch(k + off, 0, 1);
  }
  std::vector<float> scores;
  QueryStats stats;
};

namespace {

// Leaves ahead of the one being scored whose K rows are prefetched: enough to cover a miss to
// L3/DRAM with a few 16-row leaves of work, few enough not to overrun the miss queues.
constexpr size_t kPrefetchLeaves = 4;

// Best first: higher score, then lower id. A functor so that the sorts inline it.
struct Better {
  bool operator()(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) const {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }
};

// The largest of v[0..n) (-inf when n = 0; NaN never wins, as in std::max(m, NaN)): four
// independent maxima, so the loop is not one chain of max latencies through memory.
inline float MaxOf(const float* v, int n) {
  float m0 = -INFINITY, m1 = -INFINITY, m2 = -INFINITY, m3 = -INFINITY;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    m0 = std::max(m0, v[i]);
    m1 = std::max(m1, v[i + 1]);
    m2 = std::max(m2, v[i + 2]);
    m3 = std::max(m3, v[i + 3]);
  }
  for (; i < n; ++i) m0 = std::max(m0, v[i]);
  return std::max(std::max(m0, m1), std::max(m2, m3));
}

void TopLeaves(const std::vector<int32_t>& touched, const std::vector<float>& best, int k, std::vector<ScoredLeaf>* out) {
  out->clear();
  out->reserve(touched.size());
  for (int32_t leaf : touched) out->push_back(ScoredLeaf{leaf, best[leaf]});
  auto better = [](const ScoredLeaf& a, const ScoredLeaf& b) {
    return a.score > b.score || (a.score == b.score && a.leaf < b.leaf);
  };
  const size_t kk = std::min<size_t>(k, out->size());
  std::partial_sort(out->begin(), out->begin() + kk, out->end(), better);
  out->resize(kk);
}

}  // namespace

void DciTree::ScoreLeaf(int32_t leaf, const float* q, Scratch* s) const {
  const int v = leaf_valid_[leaf];
  s->stats.tokens_scored += v;
  ++s->stats.leaves_scored;
  ScoreRows(pool_->dtype(), pool_->PageK(leaf_page(leaf, 0)), v, dim_, q, s->scores.data());
  s->entries.emplace_back(*std::max_element(s->scores.data(), s->scores.data() + v), leaf);
}

void DciTree::ScoreCentroids(const float* qs, int nq, float* out) const {
  const CellSummaries& m = summaries_;
  const int cnt = static_cast<int>(m.count.size());
  ScoreRowsMulti(pool_->dtype(), m.rows.data(), cnt, dim_, qs, nq, out);
  if (params_.centroid_bonus <= 0) return;
  const float w = static_cast<float>(params_.centroid_bonus);
  for (int j = 0; j < nq; ++j) {
    const float* qj = qs + static_cast<size_t>(j) * dim_;
    const float wq = w * std::sqrt(DotF32(qj, qj, dim_));
    float* oj = out + static_cast<size_t>(j) * cnt;
    for (int i = 0; i < cnt; ++i) oj[i] += wq * m.bonus[i];
  }
}

int64_t DciTree::FieldOfView() const {
  const double n = static_cast<double>(size());
  return std::max<int64_t>({params_.fov_min, static_cast<int64_t>(std::ceil(params_.fov_fraction * n)),
                            static_cast<int64_t>(std::ceil(params_.fov_sqrt * std::sqrt(n)))});
}

void DciTree::ChooseCells(float* scores, const int32_t* nodes, int n, int64_t fov, Scratch* s,
                          std::vector<int32_t>* cells, std::vector<float>* cell_scores) const {
  // Threshold at the best `need` scores left, take those (-inf marks taken), and repeat while a
  // taken node turned out to own no cell.
  s->keys.resize(n);
  int left = 0;
  for (int i = 0; i < n; ++i) left += scores[i] > -INFINITY;
  int64_t got = 0;
  while (got < fov && left > 0) {
    const int need = static_cast<int>(std::min<int64_t>(fov - got, left));
    const float thr = need == left ? -INFINITY : KthLargest(scores, n, need, s->keys.data());
    int ties = need;  // scores equal to thr to take, lowest index first
    for (int i = 0; i < n; ++i) ties -= scores[i] > thr;
    // Taken nodes first, then their cells: staged so that the cache misses on node_cell_ and on
    // the cell headers of all taken nodes overlap instead of queueing behind each other.
    auto& picked = s->picked;
    picked.clear();
    for (int i = 0; i < n; ++i) {
      if (!(scores[i] > thr || (scores[i] == thr && thr > -INFINITY && ties-- > 0))) continue;
      picked.emplace_back(scores[i], nodes[i]);
      scores[i] = -INFINITY;
    }
    const int taken = static_cast<int>(picked.size());
    for (const auto& p : picked) __builtin_prefetch(&node_cell_[p.second]);
    for (auto& p : picked) {
      p.second = node_cell_[p.second];
      if (p.second >= 0) __builtin_prefetch(&cells_[p.second]);
    }
    for (const auto& [score, c] : picked) {
      if (c >= 0 && cells_[c].count > 0) {
        cells->push_back(c);
        if (cell_scores != nullptr) cell_scores->push_back(score);
        ++got;
      }
    }
    if (taken == 0) break;  // only NaN left
    left -= taken;
  }
}

void DciTree::PlanCells(const std::vector<int32_t>& cells, float qproj, double fraction, Scratch* s) const {
  // Staged so that the independent misses of every cell overlap: headers, leaf lists, leaves.
  for (int32_t c : cells) __builtin_prefetch(&cells_[c]);
  for (int32_t c : cells) __builtin_prefetch(cells_[c].leaves.data());
  std::vector<int32_t>& order = s->order;
  order.clear();
  for (int32_t cell_id : cells) {
    const Cell& cell = cells_[cell_id];
    const int nl = static_cast<int>(cell.leaves.size());
    if (nl == 0) continue;
    ++s->stats.cells_expanded;
    const int64_t target = static_cast<int64_t>(std::ceil(fraction * cell.count));
    if (target >= cell.count) {
      order.insert(order.end(), cell.leaves.begin(), cell.leaves.end());
      continue;
    }
    // Start at the leaf the query's projection falls in and grow toward the nearer neighbour.
    int j = static_cast<int>(std::partition_point(cell.leaves.begin(), cell.leaves.end(),
                                                  [&](int32_t leaf) { return LeafLastProj(leaf) < qproj; }) -
                             cell.leaves.begin());
    j = std::min(j, nl - 1);
    order.push_back(cell.leaves[j]);
    int64_t taken = leaf_valid_[cell.leaves[j]];
    int lo = j - 1, hi = j + 1;
    while (taken < target && (lo >= 0 || hi < nl)) {
      bool take_lo;
      if (lo < 0) {
        take_lo = false;
      } else if (hi >= nl) {
        take_lo = true;
      } else {
        take_lo = qproj - LeafLastProj(cell.leaves[lo]) <= LeafFirstProj(cell.leaves[hi]) - qproj;
      }
      const int32_t leaf = cell.leaves[take_lo ? lo-- : hi++];
      order.push_back(leaf);
      taken += leaf_valid_[leaf];
    }
  }
  PlanLeaves(s);
}

void DciTree::PlanLeaves(Scratch* s) const {
  const std::vector<int32_t>& order = s->order;
  const size_t n = order.size();
  s->rows.resize(n);
  s->valid.resize(n);
  for (size_t i = 0; i < n; ++i) {
    __builtin_prefetch(&leaf_pages_[static_cast<size_t>(order[i]) * num_payloads_]);
    __builtin_prefetch(&leaf_valid_[order[i]]);
  }
  for (size_t i = 0; i < n; ++i) {
    s->rows[i] = pool_->PageK(leaf_page(order[i], 0));
    s->valid[i] = leaf_valid_[order[i]];
  }
  const size_t rb = pool_->row_bytes();
  for (size_t i = 0; i < std::min(n, kPrefetchLeaves); ++i) s->PrefetchLeaf(i, rb);
}

void DciTree::ScoreLeaves(const float* q, Scratch* s, bool collect) const {
  const size_t n = s->order.size(), rb = pool_->row_bytes();
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchLeaves < n) s->PrefetchLeaf(i + kPrefetchLeaves, rb);
    const int32_t leaf = s->order[i];
    const int v = s->valid[i];
    ScoreRows(pool_->dtype(), s->rows[i], v, dim_, q, s->scores.data());
    s->stats.tokens_scored += v;
    ++s->stats.leaves_scored;
    s->entries.emplace_back(MaxOf(s->scores.data(), v), leaf);
    if (collect) {
      const int32_t* toks = &leaf_tokens_[static_cast<size_t>(leaf) * page_size_];
      s->next_s.insert(s->next_s.end(), s->scores.data(), s->scores.data() + v);
      s->next_n.insert(s->next_n.end(), toks, toks + v);
    }
  }
}

void DciTree::SelectLeaves(Scratch* s, int k, std::vector<ScoredLeaf>* out) const {
  // The scored leaves are distinct: the k best of them, best first.
  out->clear();
  std::vector<Scratch::Entry>& e = s->entries;
  const size_t kk = std::min(e.size(), static_cast<size_t>(k));
  std::partial_sort(e.begin(), e.begin() + kk, e.end(), Better{});
  for (size_t i = 0; i < kk; ++i) out->push_back(ScoredLeaf{e[i].second, e[i].first});
}

void DciTree::Descend(const float* q, int k, std::vector<ScoredLeaf>* out, QueryStats* stats) const {
  thread_local Scratch scratch;
  Scratch* s = &scratch;
  s->Begin();
  s->scores.resize(std::max<size_t>(page_size_, s->scores.size()));
  const float qn = std::sqrt(DotF32(q, q, dim_));
  const float qproj = qn > 0 ? DotF32(directions_.data(), q, dim_) * std::sqrt(max_norm2_) / qn : 0.f;
  const int64_t fov = FieldOfView();
  const int top = num_levels() - 1;
  s->cells.assign(1, 0);
  PlanCells(s->cells, qproj, 1.0, s);
  ScoreLeaves(q, s, top >= 1);
  for (int lvl = top; lvl >= 1; --lvl) {
    std::swap(s->cand_s, s->next_s);
    std::swap(s->cand_n, s->next_n);
    s->next_s.clear();
    s->next_n.clear();
    s->cells.clear();
    ChooseCells(s->cand_s.data(), s->cand_n.data(), static_cast<int>(s->cand_s.size()), fov, s, &s->cells);
    PlanCells(s->cells, qproj, params_.cell_score_fraction, s);
    ScoreLeaves(q, s, lvl - 1 >= 1);
  }
  SelectLeaves(s, k, out);
  *stats = s->stats;
}

void DciTree::Query(const float* q, int k, std::vector<ScoredLeaf>* out, QueryStats* stats) const {
  QueryHeads(q, 1, k, out, stats);
}

void DciTree::QueryGroup(const float* qs, int nq, int k, std::vector<std::vector<ScoredLeaf>>* out,
                         QueryStats* stats) const {
  out->resize(std::max(nq, 0));
  QueryHeads(qs, std::max(nq, 0), k, out->data(), stats);
}

void DciTree::QueryHeads(const float* qs, int nq, int k, std::vector<ScoredLeaf>* out, QueryStats* stats) const {
  for (int j = 0; j < nq; ++j) out[j].clear();
  QueryStats st;
  if (nq <= 0 || size() == 0 || k <= 0 || cells_.empty()) {
    if (stats != nullptr) *stats = st;
    return;
  }
  const int top = num_levels() - 1;
  const bool whole_cells = params_.cell_score_fraction >= 1.0;
  if (!params_.exhaustive_upper || top < 1 || (!whole_cells && nq > 1)) {
    // One head at a time: the greedy descent, or a partial scan of each cell (which follows the
    // head's own projection) as a group of one.
    QueryStats one;
    for (int j = 0; j < nq; ++j) {
      const float* q = qs + static_cast<size_t>(j) * dim_;
      if (params_.exhaustive_upper && top >= 1) {
        QueryHeads(q, 1, k, &out[j], &one);
      } else {
        Descend(q, k, &out[j], &one);
      }
      st.tokens_scored += one.tokens_scored;
      st.leaves_scored += one.leaves_scored;
      st.cells_expanded += one.cells_expanded;
    }
    if (stats != nullptr) *stats = st;
    return;
  }
  struct GroupScratch {
    std::vector<float> best;      // [nq, num_leaves], -inf when untouched
    std::vector<int32_t> touched;
    std::vector<uint8_t> cell_mark;
    std::vector<int32_t> cells, head_cells;
    std::vector<float> head_scores;
    std::vector<std::vector<std::pair<float, int32_t>>> ranked;  // per head: (owner score, cell), best first
    std::vector<float> scores;  // [nq, level-1 nodes]: centroid scores
    std::vector<float> upper;   // every upper level's [nq, nodes] scores, at the offsets of `levels`
    std::vector<std::pair<int, size_t>> levels;  // (level, offset into upper)
    std::vector<float> floor;   // [nq] k-th best scored leaf of each head
    std::vector<uint8_t> leaf_mark;  // [num_leaves] 1 while in `touched`
    std::vector<float> cand;
    std::vector<float> col;  // one head's column of best, over touched leaves
    I8Heads q8;                    // the heads in int8
    std::vector<float> eps, exact;  // [nq]: how far head j's upper scores may lie from exact; one row's exact scores
    Scratch query;
  };
  thread_local GroupScratch g;
  const size_t nl = static_cast<size_t>(num_leaves());
  if (g.best.size() < nl * nq) g.best.assign(nl * nq, -INFINITY);
  if (g.cell_mark.size() < cells_.size()) g.cell_mark.resize(cells_.size(), 0);
  g.touched.clear();
  g.cells.clear();
  if (g.leaf_mark.size() < nl) g.leaf_mark.resize(nl, 0);
  auto mark = [&](int32_t leaf) {
    if (!g.leaf_mark[leaf]) {
      g.leaf_mark[leaf] = 1;
      g.touched.push_back(leaf);
    }
  };
  const int64_t fov = FieldOfView();
  if (params_.centroid_cells) RefreshSummaries();
  // Upper levels: every head's score of every node ([nq, cnt] per level, kept in g.upper); they
  // are mapped to their leaves after the leaves are scored, and only above each head's floor.
  g.levels.clear();
  size_t total = 0;
  for (int lvl = top; lvl >= 1; --lvl) {
    const size_t cnt = level_nodes_[lvl].size();
    if (cnt == 0) continue;
    g.levels.emplace_back(lvl, total);
    total += cnt * nq;
  }
  g.upper.resize(total);
  g.q8.Set(qs, nq, dim_);
  g.eps.assign(nq, 0.f);
  const float* rank = nullptr;  // [nq, level-1 nodes]: what ranks the level-1 cells
  for (const auto& [lvl, off] : g.levels) {
    const int cnt = static_cast<int>(level_nodes_[lvl].size());
    g.q8.Score(level_rows_i8_[lvl], g.upper.data() + off);
    for (int j = 0; j < nq; ++j) g.eps[j] = std::max(g.eps[j], g.q8.Slack(level_rows_i8_[lvl], j));
    st.tokens_scored += cnt;
    if (lvl == 1) rank = g.upper.data() + off;
  }
  // Level-1 cells, ranked by their owners' scores (above) or by their summaries.
  const auto& l1 = level_nodes_[1];
  const int ncand = static_cast<int>(l1.size());
  const int32_t* cand_nodes = l1.data();
  if (params_.centroid_cells) {
    g.scores.resize(static_cast<size_t>(ncand) * nq);
    ScoreCentroids(qs, nq, g.scores.data());
    st.tokens_scored += ncand;
    rank = g.scores.data();
  }
  if (params_.group_fov <= 0 || nq == 1) {
    for (int j = 0; j < nq; ++j) {
      g.cand.assign(rank + static_cast<size_t>(j) * ncand, rank + static_cast<size_t>(j + 1) * ncand);
      g.head_cells.clear();
      ChooseCells(g.cand.data(), cand_nodes, ncand, fov, &g.query, &g.head_cells);
      for (int32_t c : g.head_cells) {
        if (!g.cell_mark[c]) {
          g.cell_mark[c] = 1;
          g.cells.push_back(c);
        }
      }
    }
  } else {
    // Group field of view: each head ranks its own best fov cells; the group takes them rank by
    // rank until the union holds the cap.
    const int64_t cap = static_cast<int64_t>(std::ceil(params_.group_fov * static_cast<double>(fov)));
    g.ranked.resize(nq);
    size_t longest = 0;
    for (int j = 0; j < nq; ++j) {
      g.cand.assign(rank + static_cast<size_t>(j) * ncand, rank + static_cast<size_t>(j + 1) * ncand);
      g.head_cells.clear();
      g.head_scores.clear();
      ChooseCells(g.cand.data(), cand_nodes, ncand, std::min(fov, cap), &g.query, &g.head_cells, &g.head_scores);
      auto& r = g.ranked[j];
      r.clear();
      for (size_t i = 0; i < g.head_cells.size(); ++i) r.emplace_back(g.head_scores[i], g.head_cells[i]);
      std::sort(r.begin(), r.end(), Better{});
      longest = std::max(longest, r.size());
    }
    for (size_t rank = 0; rank < longest && static_cast<int64_t>(g.cells.size()) < cap; ++rank) {
      for (int j = 0; j < nq && static_cast<int64_t>(g.cells.size()) < cap; ++j) {
        if (rank >= g.ranked[j].size()) continue;
        const int32_t c = g.ranked[j][rank].second;
        if (!g.cell_mark[c]) {
          g.cell_mark[c] = 1;
          g.cells.push_back(c);
        }
      }
    }
  }
  std::vector<float>& sc = g.scores;
  sc.resize(static_cast<size_t>(page_size_) * nq);
  for (int32_t c : g.cells) g.cell_mark[c] = 0;
  Scratch* qs_plan = &g.query;
  qs_plan->Begin();
  if (whole_cells) {
    PlanCells(g.cells, 0.f, 1.0, qs_plan);
  } else {  // one head (above): the leaves of each cell nearest its projection
    const float qn = std::sqrt(DotF32(qs, qs, dim_));
    const float qproj = qn > 0 ? DotF32(directions_.data(), qs, dim_) * std::sqrt(max_norm2_) / qn : 0.f;
    PlanCells(g.cells, qproj, params_.cell_score_fraction, qs_plan);
  }
  st.cells_expanded += qs_plan->stats.cells_expanded;
  const size_t n_order = qs_plan->order.size(), rb = pool_->row_bytes();
  for (size_t i = 0; i < n_order; ++i) {
    if (i + kPrefetchLeaves < n_order) qs_plan->PrefetchLeaf(i + kPrefetchLeaves, rb);
    const int32_t leaf = qs_plan->order[i];
    const int v = qs_plan->valid[i];
    ScoreRowsMulti(pool_->dtype(), qs_plan->rows[i], v, dim_, qs, nq, sc.data());
    st.tokens_scored += v;
    ++st.leaves_scored;
    float* row = g.best.data() + static_cast<size_t>(leaf) * nq;
    mark(leaf);
    for (int j = 0; j < nq; ++j) row[j] = std::max(row[j], MaxOf(sc.data() + static_cast<size_t>(j) * v, v));
  }
  // The scored leaves are distinct, so head j's k-th best of them bounds its answer from below:
  // an upper node scoring less for head j cannot enter head j's list (ties are kept).
  g.floor.assign(nq, -INFINITY);
  if (n_order >= static_cast<size_t>(k)) {
    for (int j = 0; j < nq; ++j) {
      g.cand.resize(n_order);
      for (size_t i = 0; i < n_order; ++i) g.cand[i] = g.best[static_cast<size_t>(qs_plan->order[i]) * nq + j];
      std::nth_element(g.cand.begin(), g.cand.begin() + (k - 1), g.cand.end(), std::greater<float>());
      g.floor[j] = g.cand[k - 1];
    }
  }
  g.exact.resize(nq);
  for (const auto& [lvl, off] : g.levels) {
    const auto& nodes = level_nodes_[lvl];
    const size_t cnt = nodes.size();
    const float* blk = g.upper.data() + off;
    for (size_t i = 0; i < cnt; ++i) {
      // Rescored exactly (every head) where some head's int8 score might reach its floor.
      bool near = false;
      for (int j = 0; j < nq && !near; ++j) near = blk[static_cast<size_t>(j) * cnt + i] + g.eps[j] >= g.floor[j];
      if (!near) continue;
      ScoreRowsMulti(pool_->dtype(), level_rows_[lvl].data() + i * rb, 1, dim_, qs, nq, g.exact.data());
      int32_t leaf = -1;
      for (int j = 0; j < nq; ++j) {
        const float s = g.exact[j];
        if (!(s >= g.floor[j])) continue;
        if (leaf < 0) {
          leaf = tok_leaf_[nodes[i]];
          mark(leaf);
        }
        float& b = g.best[static_cast<size_t>(leaf) * nq + j];
        b = std::max(b, s);
      }
    }
  }
  std::vector<float>& col = g.col;
  if (col.size() < nl) col.resize(nl, -INFINITY);
  for (int j = 0; j < nq; ++j) {
    for (int32_t leaf : g.touched) col[leaf] = g.best[static_cast<size_t>(leaf) * nq + j];
    TopLeaves(g.touched, col, k, &out[j]);
  }
  for (int32_t leaf : g.touched) {
    std::fill_n(g.best.data() + static_cast<size_t>(leaf) * nq, nq, -INFINITY);
    g.leaf_mark[leaf] = 0;
  }
  if (stats != nullptr) *stats = st;
}

void DciTree::Oracle(const float* q, int k, std::vector<ScoredLeaf>* out) const {
  out->clear();
  if (size() == 0 || k <= 0) return;
  thread_local Scratch scratch;
  Scratch* s = &scratch;
  s->Begin();
  s->scores.resize(std::max<size_t>(page_size_, s->scores.size()));
  for (int32_t leaf = 0; leaf < num_leaves(); ++leaf) ScoreLeaf(leaf, q, s);
  SelectLeaves(s, k, out);
}

}  // namespace icecache::kvstore
