#include "model/dense_kv_cache.h"

#include <algorithm>
#include <cassert>
#include <string>
#include <unordered_set>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/kv_pages.h"

namespace icecache::model {

DenseKvCache::DenseKvCache(const AttentionShape& shape, const DenseKvCacheOptions& options)
    : shape_(shape), options_(options), device_(kernels::ResolveDevice(options.device)) {
  assert(shape.num_layers > 0 && shape.num_q_heads > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0);
  assert(shape.num_q_heads % shape.num_kv_heads == 0 && options.page_size >= 1);
}

size_t DenseKvCache::page_bytes() const {
  return static_cast<size_t>(2) * options_.page_size * shape_.head_dim * kernels::DTypeSize(options_.kv_dtype);
}

Status DenseKvCache::AddSequence(SequenceId id) {
  if (in_step_) return FailedPreconditionError("DenseKvCache: AddSequence during a step");
  if (seqs_.count(id)) return AlreadyExistsError("DenseKvCache: sequence " + std::to_string(id) + " already exists");
  Sequence s;
  s.pages.resize(static_cast<size_t>(shape_.num_layers) * shape_.num_kv_heads);
  seqs_.emplace(id, std::move(s));
  return Status::Ok();
}

Status DenseKvCache::RemoveSequence(SequenceId id) {
  if (in_step_) return FailedPreconditionError("DenseKvCache: RemoveSequence during a step");
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("DenseKvCache: unknown sequence " + std::to_string(id));
  for (auto& list : it->second.pages) {
    for (int32_t p : list) FreePage(p);
  }
  seqs_.erase(it);
  return Status::Ok();
}

StatusOr<int> DenseKvCache::SequenceLength(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("DenseKvCache: unknown sequence " + std::to_string(id));
  return it->second.length;
}

Status DenseKvCache::AllocatePage(int32_t* page) {
  if (free_pages_.empty()) {
    if (options_.max_pages > 0 && pool_pages_ >= options_.max_pages) {
      return ResourceExhaustedError("DenseKvCache: KV page pool is full (" + std::to_string(options_.max_pages) +
                                    " pages of " + std::to_string(options_.page_size) + " tokens)");
    }
    int64_t grow = std::max<int64_t>(64, pool_pages_);
    if (options_.max_pages > 0) grow = std::min(grow, options_.max_pages - pool_pages_);
    if (pool_pages_ + grow > INT32_MAX) return ResourceExhaustedError("DenseKvCache: page id space exhausted");
    // Grow the device pool: a larger buffer, the old pages copied over.
    ICE_ASSIGN_OR_RETURN(kernels::DeviceBuffer bigger,
                         kernels::DeviceBuffer::Allocate(device_.backend, static_cast<size_t>(pool_pages_ + grow) * page_bytes()));
    if (pool_pages_ > 0) ICE_RETURN_IF_ERROR(bigger.CopyFrom(pool_, static_cast<size_t>(pool_pages_) * page_bytes()));
    pool_ = std::move(bigger);
    for (int64_t p = pool_pages_ + grow - 1; p >= pool_pages_; --p) free_pages_.push_back(static_cast<int32_t>(p));
    pool_pages_ += grow;
  }
  *page = free_pages_.back();
  free_pages_.pop_back();
  ++pages_in_use_;
  return Status::Ok();
}

void DenseKvCache::FreePage(int32_t page) {
  free_pages_.push_back(page);
  --pages_in_use_;
}

Status DenseKvCache::BeginStep(std::span<const StepSegment> segments) {
  if (in_step_) return FailedPreconditionError("DenseKvCache: BeginStep while a step is in progress");
  if (segments.empty()) return InvalidArgumentError("DenseKvCache: empty step");
  std::unordered_set<SequenceId> seen;
  std::vector<Sequence*> seqs;
  for (const StepSegment& s : segments) {
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) return NotFoundError("DenseKvCache: unknown sequence " + std::to_string(s.seq_id));
    if (!seen.insert(s.seq_id).second) {
      return InvalidArgumentError("DenseKvCache: sequence " + std::to_string(s.seq_id) + " appears twice in one step");
    }
    if (s.num_tokens < 1) return InvalidArgumentError("DenseKvCache: a segment must bring at least one token");
    seqs.push_back(&it->second);
  }
  // Reserve pages; on failure give back what this call took.
  std::vector<std::pair<Sequence*, size_t>> added;  // (sequence, pages per list before)
  const int ps = options_.page_size;
  for (size_t i = 0; i < segments.size(); ++i) {
    Sequence* s = seqs[i];
    const size_t need = static_cast<size_t>((s->length + segments[i].num_tokens + ps - 1) / ps);
    const size_t have = s->pages[0].size();
    if (need <= have) continue;
    added.emplace_back(s, have);
    for (auto& list : s->pages) {
      while (list.size() < need) {
        int32_t p;
        Status st = AllocatePage(&p);
        if (!st.ok()) {
          for (auto& [seq, before] : added) {
            for (auto& l : seq->pages) {
              while (l.size() > before) {
                FreePage(l.back());
                l.pop_back();
              }
            }
          }
          return st;
        }
        list.push_back(p);
      }
    }
  }
  step_.assign(segments.begin(), segments.end());
  step_seqs_ = std::move(seqs);
  step_row_.resize(step_.size());
  decode_segs_.clear();
  int row = 0;
  for (size_t i = 0; i < step_.size(); ++i) {
    step_row_[i] = row;
    row += step_[i].num_tokens;
    if (step_[i].num_tokens == 1) decode_segs_.push_back(i);
  }
  decode_rows_contiguous_ = decode_segs_.size() == step_.size();
  in_step_ = true;
  return Status::Ok();
}

template <typename T>
Status DenseKvCache::Upload(const std::vector<T>& host, kernels::DeviceBuffer* buf) const {
  const size_t bytes = host.size() * sizeof(T);
  ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(device_.backend, bytes == 0 ? sizeof(T) : bytes, buf));
  return buf->CopyFromHost(host.data(), bytes);
}

Status DenseKvCache::GatherHeads(const Sequence& s, int layer, int first_head, int num_heads, int len) const {
  const int ps = options_.page_size, hkv = shape_.num_kv_heads, hd = shape_.head_dim;
  read_slots_.clear();
  for (int pos = 0; pos < len; ++pos) {
    for (int g = first_head; g < first_head + num_heads; ++g) {
      const int32_t page = s.pages[static_cast<size_t>(layer) * hkv + g][pos / ps];
      read_slots_.push_back(static_cast<int64_t>(page) * ps + pos % ps);
    }
  }
  ICE_RETURN_IF_ERROR(Upload(read_slots_, &slots_dev_));
  const size_t bytes = static_cast<size_t>(len) * num_heads * hd * sizeof(float);
  ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(device_.backend, bytes, &gk_));
  ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(device_.backend, bytes, &gv_));
  kernels::GatherKvParams g;
  g.pages = pool_.data();
  g.kv_dtype = options_.kv_dtype;
  g.slot_ids = slots_dev_.as<int64_t>();
  g.k = gk_.as<float>();
  g.v = gv_.as<float>();
  g.rows = len;
  g.num_heads = num_heads;
  g.head_dim = hd;
  g.page_size = ps;
  return kernels::GatherKv(g, device_.backend);
}

Status DenseKvCache::WriteNewKv(int layer, const float* k, const float* v) {
  const int hkv = shape_.num_kv_heads, ps = options_.page_size;
  int rows = 0;
  slots_.clear();
  for (size_t i = 0; i < step_.size(); ++i) {
    const Sequence* s = step_seqs_[i];
    for (int t = 0; t < step_[i].num_tokens; ++t) {
      const int pos = s->length + t;
      for (int g = 0; g < hkv; ++g) {
        const int32_t page = s->pages[static_cast<size_t>(layer) * hkv + g][pos / ps];
        slots_.push_back(static_cast<int64_t>(page) * ps + pos % ps);
      }
    }
    rows += step_[i].num_tokens;
  }
  ICE_RETURN_IF_ERROR(Upload(slots_, &slots_dev_));
  kernels::StoreKvParams p;
  p.k = k;
  p.v = v;
  p.pages = pool_.data();
  p.kv_dtype = options_.kv_dtype;
  p.slot_ids = slots_dev_.as<int64_t>();
  p.rows = rows;
  p.num_heads = hkv;
  p.head_dim = shape_.head_dim;
  p.page_size = ps;
  return kernels::StoreKv(p, device_.backend);
}

Status DenseKvCache::Attend(int layer, const float* q, const float* k, const float* v, float* out) {
  if (!in_step_) return FailedPreconditionError("DenseKvCache: Attend outside a step");
  if (layer < 0 || layer >= shape_.num_layers) return InvalidArgumentError("DenseKvCache: layer out of range");
  ICE_RETURN_IF_ERROR(WriteNewKv(layer, k, v));
  if (!decode_segs_.empty()) ICE_RETURN_IF_ERROR(DecodeAttention(layer, q, out));
  for (size_t i = 0; i < step_.size(); ++i) {
    if (step_[i].num_tokens > 1) ICE_RETURN_IF_ERROR(PrefillSegmentAttention(layer, i, q, k, v, out));
  }
  return Status::Ok();
}

Status DenseKvCache::DecodeAttention(int layer, const float* q, float* out) {
  const int hq = shape_.num_q_heads, hkv = shape_.num_kv_heads, hd = shape_.head_dim, ps = options_.page_size;
  // One batched call when the decode rows are the whole step; else one call per decode segment
  // (a step mixing prefill and decode segments), each over its own rows.
  const size_t calls = decode_rows_contiguous_ ? 1 : decode_segs_.size();
  for (size_t c = 0; c < calls; ++c) {
    const size_t first = decode_rows_contiguous_ ? 0 : c;
    const size_t last = decode_rows_contiguous_ ? decode_segs_.size() : c + 1;
    std::vector<int32_t> indptr(1, 0), ids, valid;
    for (size_t i = first; i < last; ++i) {
      const Sequence* s = step_seqs_[decode_segs_[i]];
      const int len = s->length + 1;
      const int npages = (len + ps - 1) / ps;
      for (int g = 0; g < hkv; ++g) {
        const auto& list = s->pages[static_cast<size_t>(layer) * hkv + g];
        for (int p = 0; p < npages; ++p) {
          ids.push_back(list[p]);
          valid.push_back(std::min(ps, len - p * ps));
        }
        indptr.push_back(static_cast<int32_t>(ids.size()));
      }
    }
    // [indptr | ids | valid] in one upload.
    lists_.assign(indptr.begin(), indptr.end());
    lists_.insert(lists_.end(), ids.begin(), ids.end());
    lists_.insert(lists_.end(), valid.begin(), valid.end());
    ICE_RETURN_IF_ERROR(Upload(lists_, &lists_dev_));
    const int32_t* dev = lists_dev_.as<int32_t>();
    const size_t row = static_cast<size_t>(step_row_[decode_segs_[first]]) * hq * hd;
    kernels::PagedDecodeAttentionParams p;
    p.q = q + row;
    p.pages = pool_.data();
    p.kv_dtype = options_.kv_dtype;
    p.page_indptr = dev;
    p.page_ids = dev + indptr.size();
    p.page_valid = dev + indptr.size() + ids.size();
    p.out = out + row;
    p.batch = static_cast<int>(last - first);
    p.num_q_heads = hq;
    p.num_kv_heads = hkv;
    p.head_dim = hd;
    p.page_size = ps;
    p.scale = shape_.scale;
    ICE_RETURN_IF_ERROR(kernels::PagedDecodeAttention(p, device_.backend));
  }
  return Status::Ok();
}

Status DenseKvCache::PrefillSegmentAttention(int layer, size_t seg, const float* q, const float* k, const float* v,
                                             float* out) {
  const int hq = shape_.num_q_heads, hkv = shape_.num_kv_heads, hd = shape_.head_dim;
  const Sequence* s = step_seqs_[seg];
  const int n = step_[seg].num_tokens;
  const int kv_len = s->length + n;
  const size_t row = static_cast<size_t>(step_row_[seg]);
  kernels::PrefillAttentionParams p;
  p.q = q + row * hq * hd;
  p.out = out + row * hq * hd;
  p.q_len = n;
  p.kv_len = kv_len;
  p.num_q_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = hd;
  p.scale = shape_.scale;
  p.bf16 = kernels::UseBf16Attention(options_.kv_dtype);  // bf16 products on AMX (attention.h)
  if (s->length == 0) {
    p.k = k + row * hkv * hd;
    p.v = v + row * hkv * hd;
  } else {
    // Earlier tokens exist: gather this layer's K/V from the pages into [kv_len, hkv, hd].
    ICE_RETURN_IF_ERROR(GatherHeads(*s, layer, 0, hkv, kv_len));
    p.k = gk_.as<float>();
    p.v = gv_.as<float>();
  }
  return kernels::PrefillAttention(p, device_.backend);
}

Status DenseKvCache::ReadHeads(SequenceId id, int layer, int first_head, int num_heads, float* k, float* v) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("DenseKvCache: unknown sequence " + std::to_string(id));
  if (layer < 0 || layer >= shape_.num_layers) return InvalidArgumentError("DenseKvCache: layer out of range");
  const int len = it->second.length;
  if (len == 0) return Status::Ok();
  ICE_RETURN_IF_ERROR(GatherHeads(it->second, layer, first_head, num_heads, len));
  const size_t bytes = static_cast<size_t>(len) * num_heads * shape_.head_dim * sizeof(float);
  ICE_RETURN_IF_ERROR(gk_.CopyToHost(k, bytes));
  return gv_.CopyToHost(v, bytes);
}

Status DenseKvCache::ReadKv(SequenceId id, int layer, int kv_head, float* k, float* v) const {
  if (kv_head < 0 || kv_head >= shape_.num_kv_heads) return InvalidArgumentError("DenseKvCache: kv head out of range");
  return ReadHeads(id, layer, kv_head, 1, k, v);
}

Status DenseKvCache::ReadLayerKv(SequenceId id, int layer, float* k, float* v) const {
  return ReadHeads(id, layer, 0, shape_.num_kv_heads, k, v);
}

void DenseKvCache::EndStep(bool commit) {
  if (!in_step_) return;
  if (commit) {
    for (size_t i = 0; i < step_.size(); ++i) step_seqs_[i]->length += step_[i].num_tokens;
  }
  in_step_ = false;
  step_.clear();
  step_seqs_.clear();
}

}  // namespace icecache::model
