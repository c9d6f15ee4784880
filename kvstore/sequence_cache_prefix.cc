// SequenceCache::ClonePrefix: a prefix of a sequence rebuilt as a cache of its own.
#include <vector>

#include "kernels/kv_pages.h"
#include "kvstore/sequence_cache.h"

namespace icecache::kvstore {

StatusOr<std::unique_ptr<SequenceCache>> SequenceCache::ClonePrefix(int64_t n, ThreadPool* threads) const {
  if (n < 1 || n > n_) {
    return InvalidArgumentError("ClonePrefix: " + std::to_string(n) + " tokens of a sequence of " + std::to_string(n_));
  }
  if (n == n_) return Clone();
  if (broken_) return FailedPreconditionError("SequenceCache is broken after a failed append; release it");
  if (build_n_ >= 0) return FailedPreconditionError("ClonePrefix during a layered build");
  ICE_ASSIGN_OR_RETURN(std::unique_ptr<SequenceCache> out, Create(options_, pool_));
  ICE_RETURN_IF_ERROR(out->BeginBuild(n));
  const int nkv = options_.num_kv_heads;
  const size_t rows = static_cast<size_t>(n);
  std::vector<int64_t> slots(rows * nkv);
  // One ICE group (or dense layer) at a time: its K/V read back, then built.
  for (int first = 0; first < options_.num_layers;) {
    int count = 1;
    while (!EndsGroup(first + count - 1)) ++count;
    std::vector<std::vector<float>> k(count), v(count);
    std::vector<const float*> kp(count), vp(count);
    for (int i = 0; i < count; ++i) {
      const int layer = first + i;
      for (int64_t pos = 0; pos < n; ++pos) {
        for (int head = 0; head < nkv; ++head) {
          int32_t page = -1;
          const TokenLocation loc = LocateToken(layer, head, pos, &page);
          slots[static_cast<size_t>(pos) * nkv + head] = static_cast<int64_t>(page) * page_size_ + loc.slot;
        }
      }
      k[i].resize(rows * nkv * head_dim_);
      v[i].resize(rows * nkv * head_dim_);
      kernels::GatherKvParams g;
      g.pages = pool_->base();
      g.kv_dtype = pool_->dtype();
      g.slot_ids = slots.data();
      g.k = k[i].data();
      g.v = v[i].data();
      g.rows = static_cast<int>(n);
      g.num_heads = nkv;
      g.head_dim = head_dim_;
      g.page_size = page_size_;
      ICE_RETURN_IF_ERROR(kernels::GatherKv(g, kernels::Backend::kCpu));
      kp[i] = k[i].data();
      vp[i] = v[i].data();
    }
    ICE_RETURN_IF_ERROR(out->BuildLayers(first, count, kp.data(), vp.data(), threads));
    first += count;
  }
  ICE_RETURN_IF_ERROR(out->FinishBuild());
  return out;
}

}  // namespace icecache::kvstore
