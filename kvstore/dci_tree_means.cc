// DciTree leaf means and the rest estimate (DciTree::EstimateRest): the attention of the leaves a
// selection leaves out, estimated from each leaf's mean key and mean value (docs/kvstore.md,
// "Rest estimate").
#include <algorithm>
#include <cmath>
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

void DciTree::MeanAllLeaves() {
  means_.dirty.clear();
  const size_t bytes = static_cast<size_t>(num_leaves()) * pool_->row_bytes();
  means_.key.assign(num_payloads_, std::vector<uint8_t>(bytes, 0));
  means_.value.assign(num_payloads_, std::vector<uint8_t>(bytes, 0));
  for (int32_t leaf = 0; leaf < num_leaves(); ++leaf) MeanLeaf(leaf);
}

void DciTree::RefreshDirtyMeans() {
  const size_t bytes = static_cast<size_t>(num_leaves()) * pool_->row_bytes();
  means_.key.resize(num_payloads_);
  means_.value.resize(num_payloads_);
  for (int p = 0; p < num_payloads_; ++p) {
    means_.key[p].resize(bytes, 0);
    means_.value[p].resize(bytes, 0);
  }
  std::sort(means_.dirty.begin(), means_.dirty.end());
  means_.dirty.erase(std::unique(means_.dirty.begin(), means_.dirty.end()), means_.dirty.end());
  for (int32_t leaf : means_.dirty) MeanLeaf(leaf);
  means_.dirty.clear();
}

const void* DciTree::LeafMeanKey(int32_t leaf, int payload) const {
  return means_.key[payload].data() + static_cast<size_t>(leaf) * pool_->row_bytes();
}

const void* DciTree::LeafMeanValue(int32_t leaf, int payload) const {
  return means_.value[payload].data() + static_cast<size_t>(leaf) * pool_->row_bytes();
}

void DciTree::EstimateRest(const float* qs, int nq, float scale, int payload, const int32_t* skip, int nskip,
                           float* out, float* lse) const {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int32_t n = num_leaves();
  const size_t d = static_cast<size_t>(dim_);
  std::fill_n(out, static_cast<size_t>(nq) * d, 0.f);
  std::fill_n(lse, nq, kNegInf);
  if (n == 0 || nq <= 0) return;
  thread_local std::vector<uint8_t> skipped;
  thread_local std::vector<float> x, log_count, z;
  skipped.assign(n, 0);
  for (int i = 0; i < nskip; ++i)
    if (skip[i] >= 0 && skip[i] < n) skipped[skip[i]] = 1;
  log_count.resize(page_size_ + 1);
  for (int v = 1; v <= page_size_; ++v) log_count[v] = std::log(static_cast<float>(v));
  // Every head's scores against every leaf's mean key in one pass, then per head the log-weights,
  // their max, exp and sum, then every head's weighted sum of the mean values in one pass.
  x.resize(static_cast<size_t>(nq) * n);
  z.assign(nq, 0.f);
  ScoreRowsMulti(pool_->dtype(), means_.key[payload].data(), n, dim_, qs, nq, x.data());
  for (int j = 0; j < nq; ++j) {
    float* xj = x.data() + static_cast<size_t>(j) * n;
    float m = kNegInf;
    for (int32_t l = 0; l < n; ++l) {
      const int v = leaf_valid_[l];
      xj[l] = skipped[l] || v == 0 ? kNegInf : scale * xj[l] + log_count[v];
      m = std::max(m, xj[l]);
    }
    if (!(m > kNegInf)) {  // every leaf skipped: no weight for this head
      std::fill_n(xj, n, 0.f);
      continue;
    }
    z[j] = ExpShiftSum(xj, n, m);
    lse[j] = m + std::log(z[j]);
  }
  AddWeightedRows(pool_->dtype(), means_.value[payload].data(), n, dim_, x.data(), nq, out);
  for (int j = 0; j < nq; ++j) {
    if (!(lse[j] > kNegInf)) continue;
    const float inv = 1.f / z[j];  // out = sum_l w_l v_l / sum_l w_l, w_l = exp(x_l - m)
    for (size_t e = 0; e < d; ++e) out[static_cast<size_t>(j) * d + e] *= inv;
  }
}

}  // namespace icecache::kvstore
