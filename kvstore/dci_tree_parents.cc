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
}

}  // namespace icecache::kvstore
