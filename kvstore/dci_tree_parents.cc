// DciTree's batched parent search at build: every node of a level attaches to its nearest node
// one level up (exact search on fp32, bf16 or int8 keys; prioritized DCI above exact_parent_max_nodes).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kvstore/dci_tree.h"
#include "kvstore/vector_ops.h"

namespace icecache::kvstore {

void DciTree::AttachLevel(int l, const std::vector<int32_t>& members, const float* keys, size_t stride) {
  if (members.empty()) return;
  const int d = dim_;
  // The sticky rule on level 0, after the search, in token order (members is) so that each key
  // sees its predecessor's final parent.
  auto stick = [&] {
    if (l != 0 || params_.sticky_margin <= 0) return;
    std::vector<float> aug(d + 1);
    for (int32_t t : members) {
      std::copy_n(keys + t * stride, d, aug.data());
      aug[d] = AugExtra(norm2_[t]);
      parent_[t] = StickyParent(t, aug.data(), parent_[t]);
    }
  };
  const auto& upper = level_nodes_[l + 1];
  const int nu = static_cast<int>(upper.size());
  if (nu > params_.exact_parent_max_nodes) {
    std::vector<float> aug(d + 1);
    for (int32_t t : members) {
      std::copy_n(keys + t * stride, d, aug.data());
      aug[d] = AugExtra(norm2_[t]);
      parent_[t] = FindParent(l + 1, aug.data());
    }
    stick();
    return;
  }
  const int pairs = (d + 1) / 2, quads = I8Quads(d);
  const bool i8 = params_.int8_parent_search && quads <= kI8MaxQuads;
  const bool bf16 = params_.bf16_parent_search && !i8;
  LevelMatrix mat;
  std::vector<uint32_t> rows_q;
  if (i8) {
    std::vector<float> ex(nu);
    for (int r = 0; r < nu; ++r) ex[r] = AugExtra(norm2_[upper[r]]);
    mat.ld = (nu + 31) / 32 * 32;
    rows_q.assign(static_cast<size_t>(quads) * mat.ld, 0);
    QuantizeRowsI8(level_keys_[l + 1].data(), nu, d, ex.data(), mat.ld, rows_q.data());
  } else {
    RefreshLevelMatrix(l + 1, &mat, bf16);
  }
  constexpr int kChunk = 256;
  std::vector<float> xs(bf16 || i8 ? 0 : static_cast<size_t>(kChunk) * d);
  std::vector<uint32_t> xs_bf16(bf16 ? static_cast<size_t>(kChunk) * pairs : 0, 0);
  std::vector<uint32_t> xs_q(i8 ? static_cast<size_t>(kChunk) * quads : 0);
  std::vector<int32_t> xs_sum(i8 ? kChunk : 0);
  std::vector<float> extra(kChunk);
  std::vector<int32_t> best(kChunk);
  for (size_t b = 0; b < members.size(); b += kChunk) {
    const int cnt = static_cast<int>(std::min<size_t>(kChunk, members.size() - b));
    for (int i = 0; i < cnt; ++i) {
      const int32_t t = members[b + i];
      extra[i] = AugExtra(norm2_[t]);
      if (i8) {
        xs_sum[i] = QuantizeKeyI8(keys + t * stride, d, extra[i], xs_q.data() + static_cast<size_t>(i) * quads, nullptr,
                                  kI8ParentKeyMax);
      } else if (bf16) {
        RowFromF32(kernels::DType::kBF16, keys + t * stride, xs_bf16.data() + static_cast<size_t>(i) * pairs, d);
      } else {
        std::copy_n(keys + t * stride, d, xs.data() + static_cast<size_t>(i) * d);
      }
    }
    if (i8) {
      ArgmaxDotI8(xs_q.data(), xs_sum.data(), cnt, rows_q.data(), mat.ld, nu, quads, best.data());
    } else if (bf16) {
      ArgmaxAugDotBf16(xs_bf16.data(), extra.data(), cnt, mat.rows_p.data(), mat.ld, mat.extra.data(), nu, pairs,
                       best.data());
    } else {
      ArgmaxAugDot(xs.data(), d, extra.data(), cnt, mat.rows_t.data(), mat.ld, mat.extra.data(), nu, d, best.data());
    }
    for (int i = 0; i < cnt; ++i) parent_[members[b + i]] = upper[best[i]];
  }
  stick();
}

void DciTree::RefineCells(const std::vector<int32_t>& members, const float* keys, size_t stride) {
  if (params_.refine_passes <= 0 || params_.sticky_margin > 0 || num_levels() < 2 || members.empty()) return;
  const std::vector<int32_t>& l1 = level_nodes_[1];
  const int nu = static_cast<int>(l1.size());
  if (nu < 2 || nu > params_.exact_parent_max_nodes) return;
  const size_t d = static_cast<size_t>(dim_);
  const int nc = std::min(params_.refine_candidates, nu);
  constexpr int kBatch = 8;  // means or tokens scored together (ScoreRowsMulti: the same floats as one at a time)
  std::vector<int32_t> row_of(size(), -1);  // level-1 node -> its row in l1
  for (int r = 0; r < nu; ++r) row_of[l1[r]] = r;
  std::vector<float> means(nu * d), half(nu), scores(kBatch * static_cast<size_t>(nu)), cand(nc * d), toks(kBatch * d),
      tok(kBatch * static_cast<size_t>(nc));
  std::vector<int32_t> count(nu), start(nu + 1), fill(nu), by_cell(members.size()), near(nu * static_cast<size_t>(nc));
  std::vector<std::pair<float, int32_t>> top(nc);
  for (int pass = 0; pass < params_.refine_passes; ++pass) {
    // The cells' means (children only; an empty cell keeps its owner's key) and |m|^2 / 2.
    std::fill(means.begin(), means.end(), 0.f);
    std::fill(count.begin(), count.end(), 0);
    for (int32_t t : members) {
      const int r = row_of[parent_[t]];
      ++count[r];
      const float* k = keys + t * stride;
      float* m = means.data() + r * d;
      for (size_t e = 0; e < d; ++e) m[e] += k[e];
    }
    for (int r = 0; r < nu; ++r) {
      float* m = means.data() + r * d;
      if (count[r] == 0) {
        std::copy_n(keys + static_cast<size_t>(l1[r]) * stride, d, m);
      } else {
        const float inv = 1.f / static_cast<float>(count[r]);
        for (size_t e = 0; e < d; ++e) m[e] *= inv;
      }
      half[r] = 0.5f * DotF32(m, m, dim_);
    }
    // Each cell's candidates: its own mean, then the nc - 1 means nearest to it (m_a . m_r -
    // |m_r|^2 / 2 largest; ties to the lower row), best first, kept in a sorted list of nc.
    for (int a0 = 0; a0 < nu; a0 += kBatch) {
      const int na = std::min(kBatch, nu - a0);
      ScoreRowsMulti(kernels::DType::kF32, means.data(), nu, dim_, means.data() + a0 * d, na, scores.data());
      for (int j = 0; j < na; ++j) {
        const int a = a0 + j;
        const float* sj = scores.data() + static_cast<size_t>(j) * nu;
        top.assign(nc, {-INFINITY, -1});
        top[0] = {INFINITY, a};
        int filled = 1;
        for (int r = 0; r < nu; ++r) {
          if (r == a) continue;
          const float v = sj[r] - half[r];
          if (filled == nc && !(v > top[nc - 1].first)) continue;
          int i = filled < nc ? filled++ : nc - 1;
          for (; i > 1 && v > top[i - 1].first; --i) top[i] = top[i - 1];
          top[i] = {v, r};
        }
        for (int i = 0; i < nc; ++i) near[static_cast<size_t>(a) * nc + i] = top[i].second;
      }
    }
    // Members grouped by cell (counting sort, token order within a cell), then each moved to its
    // nearest candidate mean (ties keep the earlier candidate: the own cell first).
    start[0] = 0;
    for (int r = 0; r < nu; ++r) start[r + 1] = start[r] + count[r];
    std::copy(start.begin(), start.end() - 1, fill.begin());
    for (int32_t t : members) by_cell[fill[row_of[parent_[t]]]++] = t;
    for (int a = 0; a < nu; ++a) {
      if (start[a] == start[a + 1]) continue;
      const int32_t* nb = near.data() + static_cast<size_t>(a) * nc;
      for (int i = 0; i < nc; ++i) std::copy_n(means.data() + nb[i] * d, d, cand.data() + i * d);
      for (int32_t i0 = start[a]; i0 < start[a + 1]; i0 += kBatch) {
        const int nt = std::min<int32_t>(kBatch, start[a + 1] - i0);
        for (int j = 0; j < nt; ++j) std::copy_n(keys + by_cell[i0 + j] * stride, d, toks.data() + j * d);
        ScoreRowsMulti(kernels::DType::kF32, cand.data(), nc, dim_, toks.data(), nt, tok.data());
        for (int j = 0; j < nt; ++j) {
          const float* sj = tok.data() + static_cast<size_t>(j) * nc;
          int best = 0;
          float best_s = sj[0] - half[nb[0]];
          for (int c = 1; c < nc; ++c) {
            const float v = sj[c] - half[nb[c]];
            if (v > best_s) {
              best_s = v;
              best = c;
            }
          }
          parent_[by_cell[i0 + j]] = l1[nb[best]];
        }
      }
    }
  }
}

float DciTree::AugScore(int32_t node, const float* aug) const {
  const int l = level_[node];
  const auto& nodes = level_nodes_[l];
  const size_t idx = std::lower_bound(nodes.begin(), nodes.end(), node) - nodes.begin();
  return DotF32(level_keys_[l].data() + idx * dim_, aug, dim_) + aug[dim_] * AugExtra(norm2_[node]);
}

int32_t DciTree::StickyParent(int32_t t, const float* aug, int32_t best) const {
  if (params_.sticky_margin <= 0 || t == 0 || best < 0) return best;
  const int32_t pred = t - 1;
  const int32_t cand = level_[pred] == 1 ? pred : level_[pred] == 0 ? parent_[pred] : -1;
  if (cand < 0 || cand == best) return best;
  // Both augmented vectors have squared norm M, so |a - b|^2 = 2 (M - a . b).
  const double m = max_norm2_;
  const double far_best = std::max(0.0, m - AugScore(best, aug));
  const double far_cand = m - AugScore(cand, aug);
  return far_cand <= (1.0 + params_.sticky_margin) * far_best ? cand : best;
}

}  // namespace icecache::kvstore
