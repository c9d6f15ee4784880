// DciTree queries: multi-level prioritized search and the exact oracle.
#include <algorithm>
#include <cmath>

#include "kvstore/dci_tree.h"
#include "kvstore/vector_ops.h"

namespace icecache::kvstore {

// Per-thread working memory of a query, reused across calls.
class DciTree::Scratch {
 public:
  void Begin(int32_t num_leaves, int page_size) {
    if (static_cast<int32_t>(leaf_best.size()) < num_leaves) leaf_best.resize(num_leaves, -INFINITY);
    scores.resize(page_size);
    touched.clear();
    stats = QueryStats{};
    cand.clear();
    next.clear();
  }
  void End() {
    for (int32_t leaf : touched) leaf_best[leaf] = -INFINITY;
  }
  std::vector<float> leaf_best;
  std::vector<int32_t> touched;
  std::vector<float> scores;
  std::vector<int32_t> order;
  std::vector<float> upper_scores;
  QueryStats stats;
  std::vector<std::pair<float, int32_t>> cand, next;  // (score, node)
};

namespace {
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

void DciTree::ScoreLeaf(int32_t leaf, const float* q, Scratch* s, bool collect) const {
  const int v = leaf_valid_[leaf];
  s->stats.tokens_scored += v;
  ++s->stats.leaves_scored;
  ScoreRows(pool_->dtype(), pool_->PageK(leaf_page(leaf, 0)), v, dim_, q, s->scores.data());
  float best = -INFINITY;
  const int32_t* toks = &leaf_tokens_[static_cast<size_t>(leaf) * page_size_];
  for (int j = 0; j < v; ++j) {
    best = std::max(best, s->scores[j]);
    if (collect) s->next.emplace_back(s->scores[j], toks[j]);
  }
  if (s->leaf_best[leaf] == -INFINITY) s->touched.push_back(leaf);
  s->leaf_best[leaf] = std::max(s->leaf_best[leaf], best);
}

void DciTree::ScoreCell(int32_t cell_id, const float* q, float qproj, double fraction, Scratch* s, bool collect) const {
  const Cell& cell = cells_[cell_id];
  const int nl = static_cast<int>(cell.leaves.size());
  if (nl == 0) return;
  ++s->stats.cells_expanded;
  // Choose the leaves first (then score them with the next one prefetched): start at the leaf the
  // query's projection falls in and grow toward the nearer neighbour until the target is met.
  std::vector<int32_t>& order = s->order;
  order.clear();
  const int64_t target = static_cast<int64_t>(std::ceil(fraction * cell.count));
  if (target >= cell.count) {
    order.assign(cell.leaves.begin(), cell.leaves.end());
  } else {
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
  const size_t row_bytes = pool_->row_bytes();
  for (size_t i = 0; i < order.size(); ++i) {
    if (i + 1 < order.size()) {
      const int32_t next = order[i + 1];
      const char* k = static_cast<const char*>(pool_->PageK(leaf_page(next, 0)));
      const size_t bytes = leaf_valid_[next] * row_bytes;
      for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(k + off);
    }
    ScoreLeaf(order[i], q, s, collect);
  }
}

void DciTree::Query(const float* q, int k, std::vector<ScoredLeaf>* out, QueryStats* stats) const {
  out->clear();
  if (size() == 0 || k <= 0 || cells_.empty()) return;
  thread_local Scratch scratch;
  Scratch* s = &scratch;
  s->Begin(num_leaves(), page_size_);
  const float qn = std::sqrt(DotF32(q, q, dim_));
  const float qproj = qn > 0 ? DotF32(directions_.data(), q, dim_) * std::sqrt(max_norm2_) / qn : 0.f;
  const int64_t fov = std::max<int64_t>(params_.fov_min, static_cast<int64_t>(std::ceil(params_.fov_fraction * size())));
  const int top = num_levels() - 1;
  if (params_.exhaustive_upper && top >= 1) {
    // Every upper node is scored from the contiguous fp32 copy of its level's keys (no page
    // walking); the fov best level-1 nodes then have their cells expanded.
    for (int lvl = 1; lvl <= top; ++lvl) {
      const auto& nodes = level_nodes_[lvl];
      const int cnt = static_cast<int>(nodes.size());
      if (cnt == 0) continue;
      s->upper_scores.resize(cnt);
      ScoreRows(kernels::DType::kF32, level_keys_[lvl].data(), cnt, dim_, q, s->upper_scores.data());
      s->stats.tokens_scored += cnt;
      for (int i = 0; i < cnt; ++i) {
        const int32_t leaf = tok_leaf_[nodes[i]];
        if (s->leaf_best[leaf] == -INFINITY) s->touched.push_back(leaf);
        s->leaf_best[leaf] = std::max(s->leaf_best[leaf], s->upper_scores[i]);
        if (lvl == 1) s->cand.emplace_back(s->upper_scores[i], nodes[i]);
      }
    }
    if (static_cast<int64_t>(s->cand.size()) > fov) {
      std::nth_element(s->cand.begin(), s->cand.begin() + fov, s->cand.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      s->cand.resize(fov);
    }
    for (const auto& [score, node] : s->cand) {
      const int32_t c = node_cell_[node];
      if (c >= 0) ScoreCell(c, q, qproj, params_.cell_score_fraction, s, false);
    }
  } else {
    ScoreCell(0, q, qproj, 1.0, s, top >= 1);
    for (int lvl = top; lvl >= 1; --lvl) {
      std::swap(s->cand, s->next);
      s->next.clear();
      if (static_cast<int64_t>(s->cand.size()) > fov) {
        std::nth_element(s->cand.begin(), s->cand.begin() + fov, s->cand.end(),
                         [](const auto& a, const auto& b) { return a.first > b.first; });
        s->cand.resize(fov);
      }
      for (const auto& [score, node] : s->cand) {
        const int32_t c = node_cell_[node];
        if (c >= 0) ScoreCell(c, q, qproj, params_.cell_score_fraction, s, lvl - 1 >= 1);
      }
    }
  }
  TopLeaves(s->touched, s->leaf_best, k, out);
  if (stats != nullptr) *stats = s->stats;
  s->End();
}

void DciTree::QueryGroup(const float* qs, int nq, int k, std::vector<std::vector<ScoredLeaf>>* out,
                         QueryStats* stats) const {
  out->assign(std::max(nq, 0), {});
  if (nq <= 0) return;
  const bool shared = params_.exhaustive_upper && params_.cell_score_fraction >= 1.0 && nq > 1;
  if (!shared || size() == 0 || k <= 0 || cells_.empty() || num_levels() < 2) {
    QueryStats total, one;
    for (int j = 0; j < nq; ++j) {
      Query(qs + static_cast<size_t>(j) * dim_, k, &(*out)[j], &one);
      total.tokens_scored += one.tokens_scored;
      total.leaves_scored += one.leaves_scored;
      total.cells_expanded += one.cells_expanded;
    }
    if (stats != nullptr) *stats = total;
    return;
  }
  struct GroupScratch {
    std::vector<float> best;      // [nq, num_leaves], -inf when untouched
    std::vector<int32_t> touched;
    std::vector<uint8_t> cell_mark;
    std::vector<int32_t> cells;
    std::vector<float> scores;
    std::vector<std::pair<float, int32_t>> cand;
  };
  thread_local GroupScratch g;
  const size_t nl = static_cast<size_t>(num_leaves());
  if (g.best.size() < nl * nq) g.best.assign(nl * nq, -INFINITY);
  if (g.cell_mark.size() < cells_.size()) g.cell_mark.resize(cells_.size(), 0);
  g.touched.clear();
  g.cells.clear();
  QueryStats st;
  auto touch = [&](int32_t leaf, const float* sc, size_t stride) {  // sc[j * stride]: head j's score
    float* row = g.best.data() + static_cast<size_t>(leaf) * nq;
    if (row[0] == -INFINITY) g.touched.push_back(leaf);
    for (int j = 0; j < nq; ++j) row[j] = std::max(row[j], sc[j * stride]);
  };
  const int64_t fov = std::max<int64_t>(params_.fov_min, static_cast<int64_t>(std::ceil(params_.fov_fraction * size())));
  const int top = num_levels() - 1;
  for (int lvl = 1; lvl <= top; ++lvl) {
    const auto& nodes = level_nodes_[lvl];
    const int cnt = static_cast<int>(nodes.size());
    if (cnt == 0) continue;
    g.scores.resize(static_cast<size_t>(cnt) * nq);
    ScoreRowsMulti(kernels::DType::kF32, level_keys_[lvl].data(), cnt, dim_, qs, nq, g.scores.data());
    st.tokens_scored += cnt;
    for (int i = 0; i < cnt; ++i) {
      // Upper tokens: every head's score, one leaf row each (max per head below).
      const int32_t leaf = tok_leaf_[nodes[i]];
      touch(leaf, g.scores.data() + i, cnt);
    }
    if (lvl != 1) continue;
    for (int j = 0; j < nq; ++j) {
      g.cand.clear();
      for (int i = 0; i < cnt; ++i) g.cand.emplace_back(g.scores[static_cast<size_t>(j) * cnt + i], nodes[i]);
      if (static_cast<int64_t>(g.cand.size()) > fov) {
        std::nth_element(g.cand.begin(), g.cand.begin() + fov, g.cand.end(),
                         [](const auto& a, const auto& b) { return a.first > b.first; });
        g.cand.resize(fov);
      }
      for (const auto& [score, node] : g.cand) {
        const int32_t c = node_cell_[node];
        if (c >= 0 && !g.cell_mark[c]) {
          g.cell_mark[c] = 1;
          g.cells.push_back(c);
        }
      }
    }
  }
  std::vector<float>& sc = g.scores;
  sc.resize(static_cast<size_t>(page_size_) * nq);
  for (int32_t c : g.cells) {
    g.cell_mark[c] = 0;
    ++st.cells_expanded;
    for (int32_t leaf : cells_[c].leaves) {
      const int v = leaf_valid_[leaf];
      ScoreRowsMulti(pool_->dtype(), pool_->PageK(leaf_page(leaf, 0)), v, dim_, qs, nq, sc.data());
      st.tokens_scored += v;
      ++st.leaves_scored;
      float* row = g.best.data() + static_cast<size_t>(leaf) * nq;
      if (row[0] == -INFINITY) g.touched.push_back(leaf);
      for (int j = 0; j < nq; ++j)
        for (int s = 0; s < v; ++s) row[j] = std::max(row[j], sc[static_cast<size_t>(j) * v + s]);
    }
  }
  std::vector<float> col(nl, -INFINITY);
  for (int j = 0; j < nq; ++j) {
    for (int32_t leaf : g.touched) col[leaf] = g.best[static_cast<size_t>(leaf) * nq + j];
    TopLeaves(g.touched, col, k, &(*out)[j]);
  }
  for (int32_t leaf : g.touched)
    std::fill_n(g.best.data() + static_cast<size_t>(leaf) * nq, nq, -INFINITY);
  if (stats != nullptr) *stats = st;
}

void DciTree::Oracle(const float* q, int k, std::vector<ScoredLeaf>* out) const {
  out->clear();
  if (size() == 0 || k <= 0) return;
  thread_local Scratch scratch;
  Scratch* s = &scratch;
  s->Begin(num_leaves(), page_size_);
  for (int32_t leaf = 0; leaf < num_leaves(); ++leaf) ScoreLeaf(leaf, q, s, false);
  TopLeaves(s->touched, s->leaf_best, k, out);
  s->End();
}

}  // namespace icecache::kvstore
