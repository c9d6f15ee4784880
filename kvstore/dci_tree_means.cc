// DciTree leaf means and the rest estimate (DciTree::EstimateRest): the attention of the leaves a
// selection leaves out, estimated from each leaf's mean key and mean value (docs/kvstore.md,
// "Rest estimate").
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kvstore/dci_tree.h"
#include "kvstore/vector_ops.h"

namespace icecache::kvstore {

void DciTree::MeanLeaf(int32_t leaf) {
  const int v = leaf_valid_[leaf];
  const size_t d = static_cast<size_t>(dim_), rb = pool_->row_bytes();
  thread_local std::vector<float> rows, mean;
  rows.resize(static_cast<size_t>(std::max(v, 1)) * d);
  for (int p = 0; p < num_payloads_; ++p) {
    const int32_t page = leaf_page(leaf, p);
    for (int which = 0; which < 2; ++which) {
      mean.assign(d, 0.f);
      if (v > 0) {
        RowToF32(pool_->dtype(), which == 0 ? pool_->PageK(page) : pool_->PageV(page), rows.data(), v * dim_);
        for (int s = 0; s < v; ++s) {
          const float* r = rows.data() + s * d;
          for (size_t e = 0; e < d; ++e) mean[e] += r[e];
        }
        const float inv = 1.f / static_cast<float>(v);
        for (size_t e = 0; e < d; ++e) mean[e] *= inv;
      }
      auto& dst = which == 0 ? means_.key[p] : means_.value[p];
      RowFromF32(pool_->dtype(), mean.data(), dst.data() + static_cast<size_t>(leaf) * rb, dim_);
    }
  }
}

void DciTree::MeanCell(int32_t cell) {
  const size_t d = static_cast<size_t>(dim_), rb = pool_->row_bytes();
  thread_local std::vector<float> row, sum_k, sum_v;
  row.resize(d);
  int32_t total = 0;
  for (int32_t leaf : cells_[cell].leaves) total += leaf_valid_[leaf];
  means_.cell_log_count[cell] = total > 0 ? std::log(static_cast<float>(total)) : -std::numeric_limits<float>::infinity();
  for (int p = 0; p < num_payloads_; ++p) {
    sum_k.assign(d, 0.f);
    sum_v.assign(d, 0.f);
    for (int32_t leaf : cells_[cell].leaves) {
      const float w = static_cast<float>(leaf_valid_[leaf]) / static_cast<float>(std::max(total, 1));
      if (w == 0.f) continue;
      RowToF32(pool_->dtype(), means_.key[p].data() + static_cast<size_t>(leaf) * rb, row.data(), dim_);
      for (size_t e = 0; e < d; ++e) sum_k[e] += w * row[e];
      RowToF32(pool_->dtype(), means_.value[p].data() + static_cast<size_t>(leaf) * rb, row.data(), dim_);
      for (size_t e = 0; e < d; ++e) sum_v[e] += w * row[e];
    }
    RowFromF32(pool_->dtype(), sum_k.data(), means_.cell_key[p].data() + static_cast<size_t>(cell) * rb, dim_);
    RowFromF32(pool_->dtype(), sum_v.data(), means_.cell_value[p].data() + static_cast<size_t>(cell) * rb, dim_);
  }
}

void DciTree::MeanAllLeaves() {
  means_ = LeafMeans{};  // rows sized (zeros: an empty cell's) by the refresh of every leaf
  means_.dirty.resize(num_leaves());
  for (int32_t leaf = 0; leaf < num_leaves(); ++leaf) means_.dirty[leaf] = leaf;
  RefreshDirtyMeans();
}

void DciTree::RefreshDirtyMeans() {
  const size_t rb = pool_->row_bytes();
  const size_t bytes = static_cast<size_t>(num_leaves()) * rb, cell_bytes = static_cast<size_t>(num_cells()) * rb;
  means_.key.resize(num_payloads_);
  means_.value.resize(num_payloads_);
  means_.cell_key.resize(num_payloads_);
  means_.cell_value.resize(num_payloads_);
  for (int p = 0; p < num_payloads_; ++p) {
    means_.key[p].resize(bytes, 0);
    means_.value[p].resize(bytes, 0);
    means_.cell_key[p].resize(cell_bytes, 0);
    means_.cell_value[p].resize(cell_bytes, 0);
  }
  means_.cell_log_count.resize(num_cells(), -std::numeric_limits<float>::infinity());
  std::sort(means_.dirty.begin(), means_.dirty.end());
  means_.dirty.erase(std::unique(means_.dirty.begin(), means_.dirty.end()), means_.dirty.end());
  thread_local std::vector<int32_t> cells;
  cells.clear();
  for (int32_t leaf : means_.dirty) {
    MeanLeaf(leaf);
    cells.push_back(leaf_cell_[leaf]);
  }
  std::sort(cells.begin(), cells.end());
  cells.erase(std::unique(cells.begin(), cells.end()), cells.end());
  for (int32_t c : cells)
    if (c >= 0) MeanCell(c);
  means_.dirty.clear();
}

void DciTree::EstimateRest(const float* qs, int nq, float scale, int payload, const int32_t* skip, int nskip,
                           int expand_cells, float* out, float* lse) const {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int32_t n = num_leaves(), nc = num_cells();
  const size_t d = static_cast<size_t>(dim_), rb = pool_->row_bytes();
  std::fill_n(out, static_cast<size_t>(nq) * d, 0.f);
  std::fill_n(lse, nq, kNegInf);
  if (n == 0 || nq <= 0) return;
  thread_local std::vector<uint8_t> skipped, expanded;
  thread_local std::vector<float> xl, xc, log_count, z, best;
  thread_local std::vector<int32_t> leaves, order;
  thread_local std::vector<uint8_t> kbuf, vbuf;
  skipped.assign(n, 0);
  for (int i = 0; i < nskip; ++i)
    if (skip[i] >= 0 && skip[i] < n) skipped[skip[i]] = 1;
  log_count.resize(page_size_ + 1);
  for (int v = 1; v <= page_size_; ++v) log_count[v] = std::log(static_cast<float>(v));
  // Two sets of groups: leaves (rows lk / lv, nl of them) and whole cells (the cell rows, every
  // cell's weight -inf unless it is estimated as a whole).
  const bool by_cell = expand_cells > 0 && expand_cells < nc;
  const uint8_t* lk = means_.key[payload].data();
  const uint8_t* lv = means_.value[payload].data();
  int32_t nl = n;
  if (by_cell) {
    // Cells by their mean key's best score over the heads; the best expand_cells, and every cell
    // holding a skipped leaf (so that no selected token is also counted in a cell's mean), go
    // leaf by leaf.
    xc.resize(static_cast<size_t>(nq) * nc);
    ScoreRowsMulti(pool_->dtype(), means_.cell_key[payload].data(), nc, dim_, qs, nq, xc.data());
    best.assign(nc, kNegInf);
    const float* log_count_c = means_.cell_log_count.data();  // -inf for an empty cell
    for (int j = 0; j < nq; ++j) {
      float* x = xc.data() + static_cast<size_t>(j) * nc;
      for (int32_t c = 0; c < nc; ++c) {
        x[c] = scale * x[c] + log_count_c[c];
        best[c] = std::max(best[c], x[c]);
      }
    }
    order.resize(nc);
    for (int32_t c = 0; c < nc; ++c) order[c] = c;
    std::nth_element(order.begin(), order.begin() + expand_cells, order.end(),
                     [&](int32_t a, int32_t b) { return best[a] > best[b] || (best[a] == best[b] && a < b); });
    expanded.assign(nc, 0);
    for (int i = 0; i < expand_cells; ++i) expanded[order[i]] = 1;
    for (int i = 0; i < nskip; ++i)
      if (skip[i] >= 0 && skip[i] < n) expanded[leaf_cell_[skip[i]]] = 1;
    leaves.clear();
    for (int32_t c = 0; c < nc; ++c) {
      if (!expanded[c]) continue;
      for (int32_t leaf : cells_[c].leaves) leaves.push_back(leaf);
      for (int j = 0; j < nq; ++j) xc[static_cast<size_t>(j) * nc + c] = kNegInf;
    }
    nl = static_cast<int32_t>(leaves.size());
    kbuf.resize(static_cast<size_t>(nl) * rb);
    vbuf.resize(kbuf.size());
    for (int32_t i = 0; i < nl; ++i) {
      std::memcpy(kbuf.data() + i * rb, lk + static_cast<size_t>(leaves[i]) * rb, rb);
      std::memcpy(vbuf.data() + i * rb, lv + static_cast<size_t>(leaves[i]) * rb, rb);
    }
    lk = kbuf.data();
    lv = vbuf.data();
  }
  auto leaf_id = [&](int32_t i) { return by_cell ? leaves[i] : i; };
  xl.resize(static_cast<size_t>(nq) * nl);
  ScoreRowsMulti(pool_->dtype(), lk, nl, dim_, qs, nq, xl.data());
  z.assign(nq, 0.f);
  for (int j = 0; j < nq; ++j) {
    float* x = xl.data() + static_cast<size_t>(j) * nl;
    float* y = by_cell ? xc.data() + static_cast<size_t>(j) * nc : nullptr;
    float m = kNegInf;
    for (int32_t i = 0; i < nl; ++i) {
      const int32_t leaf = leaf_id(i);
      const int v = leaf_valid_[leaf];
      x[i] = skipped[leaf] || v == 0 ? kNegInf : scale * x[i] + log_count[v];
      m = std::max(m, x[i]);
    }
    if (y != nullptr)
      for (int32_t c = 0; c < nc; ++c) m = std::max(m, y[c]);
    if (!(m > kNegInf)) {  // nothing left for this head
      std::fill_n(x, nl, 0.f);
      if (y != nullptr) std::fill_n(y, nc, 0.f);
      continue;
    }
    z[j] = ExpShiftSum(x, nl, m) + (y != nullptr ? ExpShiftSum(y, nc, m) : 0.f);
    lse[j] = m + std::log(z[j]);
  }
  AddWeightedRows(pool_->dtype(), lv, nl, dim_, xl.data(), nq, out);
  if (by_cell) AddWeightedRows(pool_->dtype(), means_.cell_value[payload].data(), nc, dim_, xc.data(), nq, out);
  for (int j = 0; j < nq; ++j) {
    if (!(lse[j] > kNegInf)) continue;
    const float inv = 1.f / z[j];  // out = sum w v / sum w, w = exp(x - m)
    for (size_t e = 0; e < d; ++e) out[static_cast<size_t>(j) * d + e] *= inv;
  }
}

}  // namespace icecache::kvstore
