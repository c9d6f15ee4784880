// DciTree's batched parent search at build: every node of a level attaches to its nearest node
// one level up (exact search on fp32, bf16 or int8 keys; prioritized DCI above exact_parent_max_nodes).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kvstore/dci_tree.h"
#include "kvstore/vector_ops.h"

namespace icecache::kvstore {
namespace {

// Rows in ArgmaxAugDotI8's layout: [quads, ld] words of four s8 entries, and per column the
// entries' sum, the row's scale and its augmented extra (-inf in the padding columns).
struct I8Rows {
  int ld = 0;
  std::vector<uint32_t> q;
  std::vector<int32_t> sum;
  std::vector<float> scale, extra;

  void Reset(int rows, int quads) {
    ld = (rows + 31) / 32 * 32;
    q.assign(static_cast<size_t>(quads) * ld, 0);
    sum.assign(ld, 0);
    scale.assign(ld, 0.f);
    extra.assign(ld, -INFINITY);
  }
};

// keys: [n, d] fp32; extra: [n].
void QuantizeRows(const float* keys, int n, int d, const float* extra, I8Rows* out) {
  const int quads = (d + 3) / 4;
  out->Reset(n, quads);
  std::vector<int8_t> q(static_cast<size_t>(quads) * 4, 0);
  for (int r = 0; r < n; ++r) {
    out->scale[r] = QuantizeRowI8(keys + static_cast<size_t>(r) * d, d, q.data());
    out->sum[r] = std::accumulate(q.begin(), q.begin() + d, 0);
    out->extra[r] = extra[r];
    for (int j = 0; j < quads; ++j) std::memcpy(&out->q[static_cast<size_t>(j) * out->ld + r], &q[4 * j], 4);
  }
}

// A key as ArgmaxAugDotI8's x: int8 quads offset to u8 (dims padded with value 0). Its extra is
// divided by its scale (which does not move the arg-max). q: [quads * 4] scratch, pad bytes 0.
void QuantizeKey(const float* key, int d, int quads, float* extra, int8_t* q, uint32_t* dst) {
  const float s = QuantizeRowI8(key, d, q);
  if (s > 0.f) *extra /= s;
  std::memcpy(dst, q, static_cast<size_t>(quads) * 4);
  for (int j = 0; j < quads; ++j) dst[j] ^= 0x80808080u;  // s8 + 128 as u8, bytewise
}

}  // namespace

void DciTree::AttachLevel(int l, const std::vector<int32_t>& members, const float* keys, size_t stride) {
  if (members.empty()) return;
  const int d = dim_;
  const auto& upper = level_nodes_[l + 1];
  const int nu = static_cast<int>(upper.size());
  if (nu > params_.exact_parent_max_nodes) {
    std::vector<float> aug(d + 1);
    for (int32_t t : members) {
      std::copy_n(keys + t * stride, d, aug.data());
      aug[d] = AugExtra(norm2_[t]);
      parent_[t] = FindParent(l + 1, aug.data());
    }
    return;
  }
  const bool i8 = params_.int8_parent_search;
  // Exact batched search: members gathered in chunks into a contiguous block (level 0 is almost
  // every token), fp32, bf16 pairs (an odd dim's pad stays 0) or int8 quads.
  const bool bf16 = params_.bf16_parent_search && !i8;
  const int pairs = (d + 1) / 2, quads = (d + 3) / 4;
  LevelMatrix mat;
  I8Rows rows;
  if (i8) {
    std::vector<float> ex(nu);
    for (int r = 0; r < nu; ++r) ex[r] = AugExtra(norm2_[upper[r]]);
    QuantizeRows(level_keys_[l + 1].data(), nu, d, ex.data(), &rows);
  } else {
    RefreshLevelMatrix(l + 1, &mat, bf16);
  }
  constexpr int kChunk = 256;
  std::vector<int8_t> q(static_cast<size_t>(quads) * 4, 0);
  std::vector<float> xs(bf16 || i8 ? 0 : static_cast<size_t>(kChunk) * d);
  std::vector<uint32_t> xs_bf16(bf16 ? static_cast<size_t>(kChunk) * pairs : 0, 0);
  std::vector<uint32_t> xs_q(i8 ? static_cast<size_t>(kChunk) * quads : 0);
  std::vector<float> extra(kChunk);
  std::vector<int32_t> best(kChunk);
  for (size_t b = 0; b < members.size(); b += kChunk) {
    const int cnt = static_cast<int>(std::min<size_t>(kChunk, members.size() - b));
    for (int i = 0; i < cnt; ++i) {
      const int32_t t = members[b + i];
      extra[i] = AugExtra(norm2_[t]);
      if (i8) {
        QuantizeKey(keys + t * stride, d, quads, &extra[i], q.data(), xs_q.data() + static_cast<size_t>(i) * quads);
      } else if (bf16) {
        RowFromF32(kernels::DType::kBF16, keys + t * stride, xs_bf16.data() + static_cast<size_t>(i) * pairs, d);
      } else {
        std::copy_n(keys + t * stride, d, xs.data() + static_cast<size_t>(i) * d);
      }
    }
    if (i8) {
      ArgmaxAugDotI8(xs_q.data(), extra.data(), cnt, rows.q.data(), rows.ld, rows.sum.data(), rows.scale.data(),
                     rows.extra.data(), nu, quads, best.data());
    } else if (bf16) {
      ArgmaxAugDotBf16(xs_bf16.data(), extra.data(), cnt, mat.rows_p.data(), mat.ld, mat.extra.data(), nu, pairs,
                       best.data());
    } else {
      ArgmaxAugDot(xs.data(), d, extra.data(), cnt, mat.rows_t.data(), mat.ld, mat.extra.data(), nu, d, best.data());
    }
    for (int i = 0; i < cnt; ++i) parent_[members[b + i]] = upper[best[i]];
  }
}

}  // namespace icecache::kvstore
