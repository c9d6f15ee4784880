// DciTree leaf summaries (DciParams::leaf_rank): per-leaf centroid + spread or bounding box,
// computed from the leaf's page, and their scoring for a query.
#include <algorithm>
#include <cmath>

#include "kvstore/dci_tree.h"
#include "kvstore/vector_ops.h"

namespace icecache::kvstore {

void DciTree::FoldLeaf(int32_t leaf, int from, float* sum, double* sumsq) {
  LeafSummaries& m = leaf_sums_;
  const int v = leaf_valid_[leaf];
  const size_t d = static_cast<size_t>(dim_);
  thread_local std::vector<float> keys, row;
  if (v > from) {
    keys.resize(static_cast<size_t>(v - from) * d);
    RowToF32(pool_->dtype(), pool_->KRow(leaf_page(leaf, 0), from), keys.data(), (v - from) * dim_);  // rows [v - from, head_dim]
  }
  for (int s = 0; s < v - from; ++s) {
    const float* k = keys.data() + s * d;
    for (size_t e = 0; e < d; ++e) sum[e] += k[e];
    *sumsq += DotF32(k, k, dim_);
  }
  row.assign(d, 0.f);
  float bonus = 0.f;
  if (v > 0) {
    const float inv = 1.f / static_cast<float>(v);
    for (size_t e = 0; e < d; ++e) row[e] = sum[e] * inv;
    const double var = std::max(0.0, *sumsq / v - static_cast<double>(DotF32(row.data(), row.data(), dim_)));
    bonus = static_cast<float>(std::sqrt(var) * std::sqrt(2.0 * std::log(static_cast<double>(v)) / dim_));
  }
  RowFromF32(pool_->dtype(), row.data(), m.rows.data() + static_cast<size_t>(leaf) * m.row_bytes, dim_);
  m.bonus[leaf] = bonus;
}

void DciTree::SummarizeLeaf(int32_t leaf) {
  LeafSummaries& m = leaf_sums_;
  const size_t d = static_cast<size_t>(dim_);
  if (params_.leaf_rank == LeafRank::kCentroid) {
    if (params_.leaf_layout == LeafLayout::kPosition) {
      // Fold into the cell's open-leaf state: from where it stopped when `leaf` is the one it
      // holds (only slots past that were added since), from scratch otherwise.
      const size_t c = static_cast<size_t>(leaf_cell_[leaf]);
      if (m.open_leaf.size() <= c) {
        const size_t nc = std::max(c + 1, cells_.size());
        m.open_leaf.resize(nc, -1);
        m.open_count.resize(nc, 0);
        m.open_sum.resize(nc * d, 0.f);
        m.open_sumsq.resize(nc, 0.0);
      }
      float* sum = m.open_sum.data() + c * d;
      if (m.open_leaf[c] != leaf || m.open_count[c] > leaf_valid_[leaf]) {
        m.open_leaf[c] = leaf;
        m.open_count[c] = 0;
        std::fill_n(sum, d, 0.f);
        m.open_sumsq[c] = 0.0;
      }
      FoldLeaf(leaf, m.open_count[c], sum, &m.open_sumsq[c]);
      m.open_count[c] = leaf_valid_[leaf];
      return;
    }
    thread_local std::vector<float> sum;
    sum.assign(d, 0.f);
    double sumsq = 0;
    FoldLeaf(leaf, 0, sum.data(), &sumsq);
    return;
  }
  // kBox: [hi, lo] over the leaf's keys.
  const int v = leaf_valid_[leaf];
  thread_local std::vector<float> keys, row;
  keys.resize(static_cast<size_t>(std::max(v, 1)) * d);
  row.assign(2 * d, 0.f);
  if (v > 0) {
    RowToF32(pool_->dtype(), pool_->PageK(leaf_page(leaf, 0)), keys.data(), v * dim_);  // rows [v, head_dim]
    float* hi = row.data();
    float* lo = row.data() + d;
    std::copy_n(keys.data(), d, hi);
    std::copy_n(keys.data(), d, lo);
    for (int s = 1; s < v; ++s) {
      const float* k = keys.data() + s * d;
      for (size_t e = 0; e < d; ++e) {
        hi[e] = std::max(hi[e], k[e]);
        lo[e] = std::min(lo[e], k[e]);
      }
    }
  }
  RowFromF32(pool_->dtype(), row.data(), m.rows.data() + static_cast<size_t>(leaf) * m.row_bytes, m.dim);
  m.bonus[leaf] = 0.f;
}

void DciTree::SummarizeAllLeaves() {
  LeafSummaries& m = leaf_sums_;
  m.dim = params_.leaf_rank == LeafRank::kBox ? 2 * dim_ : dim_;
  m.row_bytes = static_cast<size_t>(m.dim) * DTypeSize(pool_->dtype());
  m.rows.assign(static_cast<size_t>(num_leaves()) * m.row_bytes, 0);
  m.bonus.assign(num_leaves(), 0.f);
  m.dirty.clear();
  m.open_leaf.assign(cells_.size(), -1);
  m.open_count.assign(cells_.size(), 0);
  m.open_sum.assign(cells_.size() * static_cast<size_t>(dim_), 0.f);
  m.open_sumsq.assign(cells_.size(), 0.0);
  for (int32_t leaf = 0; leaf < num_leaves(); ++leaf) SummarizeLeaf(leaf);
}

void DciTree::RefreshDirtyLeaves() {
  if (!leaf_rank_on()) return;
  LeafSummaries& m = leaf_sums_;
  if (m.dim == 0) {  // an empty tree's first insertion
    SummarizeAllLeaves();
    return;
  }
  m.rows.resize(static_cast<size_t>(num_leaves()) * m.row_bytes, 0);
  m.bonus.resize(num_leaves(), 0.f);
  std::sort(m.dirty.begin(), m.dirty.end());
  m.dirty.erase(std::unique(m.dirty.begin(), m.dirty.end()), m.dirty.end());
  for (int32_t leaf : m.dirty) SummarizeLeaf(leaf);
  m.dirty.clear();
}

void DciTree::ScoreLeafSummaries(const std::vector<int32_t>& cells, const float* qs, int nq,
                                 std::vector<int32_t>* leaves, std::vector<float>* score) const {
  const LeafSummaries& m = leaf_sums_;
  leaves->clear();
  // Staged so that the independent misses of every cell overlap: headers, leaf lists, rows.
  for (int32_t c : cells) __builtin_prefetch(&cells_[c]);
  for (int32_t c : cells) __builtin_prefetch(cells_[c].leaves.data());
  for (int32_t c : cells)
    for (int32_t leaf : cells_[c].leaves) {
      __builtin_prefetch(m.rows.data() + static_cast<size_t>(leaf) * m.row_bytes);
      leaves->push_back(leaf);
    }
  // Empty leaves (none in a tree built or grown by this code, but cheap to rule out) are dropped.
  leaves->erase(std::remove_if(leaves->begin(), leaves->end(), [&](int32_t leaf) { return leaf_valid_[leaf] == 0; }),
                leaves->end());
  // A cell's build-time leaves have consecutive ids: runs of consecutive rows are scored at once.
  const size_t n = leaves->size(), d = static_cast<size_t>(dim_);
  score->resize(n * nq);
  // The query in the summaries' space: q (kCentroid) or [max(q, 0), min(q, 0)] (kBox).
  thread_local std::vector<float> qv, w, out;
  const bool box = params_.leaf_rank == LeafRank::kBox;
  qv.assign(static_cast<size_t>(nq) * m.dim, 0.f);
  w.assign(nq, 0.f);
  for (int j = 0; j < nq; ++j) {
    const float* q = qs + j * d;
    float* o = qv.data() + static_cast<size_t>(j) * m.dim;
    if (box) {
      for (size_t e = 0; e < d; ++e) {
        o[e] = std::max(q[e], 0.f);
        o[d + e] = std::min(q[e], 0.f);
      }
    } else {
      std::copy_n(q, d, o);
      w[j] = static_cast<float>(params_.leaf_bonus) * std::sqrt(DotF32(q, q, dim_));
    }
  }
  for (size_t i = 0; i < n;) {
    size_t e = i + 1;
    while (e < n && (*leaves)[e] == (*leaves)[e - 1] + 1) ++e;
    const int run = static_cast<int>(e - i);
    const uint8_t* rows = m.rows.data() + static_cast<size_t>((*leaves)[i]) * m.row_bytes;
    out.resize(static_cast<size_t>(run) * nq);
    if (nq == 1) {
      ScoreRows(pool_->dtype(), rows, run, m.dim, qv.data(), out.data());
    } else {
      ScoreRowsMulti(pool_->dtype(), rows, run, m.dim, qv.data(), nq, out.data());
    }
    for (int j = 0; j < nq; ++j)
      for (int r = 0; r < run; ++r)
        (*score)[j * n + i + r] = out[static_cast<size_t>(j) * run + r] + w[j] * m.bonus[(*leaves)[i + r]];
    i = e;
  }
}

}  // namespace icecache::kvstore
