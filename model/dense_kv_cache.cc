#include "model/dense_kv_cache.h"

#include <algorithm>
#include <cassert>
#include <string>
#include <unordered_set>

#include "kernels/attention.h"

namespace icecache::model {

DenseKvCache::DenseKvCache(const AttentionShape& shape, const DenseKvCacheOptions& options)
    : shape_(shape), options_(options) {
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
    pool_.resize(static_cast<size_t>(pool_pages_ + grow) * page_bytes());
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

void DenseKvCache::WriteNewKv(int layer, const float* k, const float* v) {
  const int hkv = shape_.num_kv_heads, hd = shape_.head_dim, ps = options_.page_size;
  const size_t esz = kernels::DTypeSize(options_.kv_dtype);
  for (size_t i = 0; i < step_.size(); ++i) {
    Sequence* s = step_seqs_[i];
    for (int t = 0; t < step_[i].num_tokens; ++t) {
      const int pos = s->length + t;
      const size_t row = static_cast<size_t>(step_row_[i] + t);
      for (int g = 0; g < hkv; ++g) {
        const int32_t page = s->pages[static_cast<size_t>(layer) * hkv + g][pos / ps];
        uint8_t* base = PagePtr(page);
        const int slot = pos % ps;
        const float* ksrc = k + (row * hkv + g) * hd;
        const float* vsrc = v + (row * hkv + g) * hd;
        kernels::ConvertFromF32(options_.kv_dtype, ksrc, base + static_cast<size_t>(slot) * hd * esz, hd);
        kernels::ConvertFromF32(options_.kv_dtype, vsrc, base + static_cast<size_t>(ps + slot) * hd * esz, hd);
      }
    }
  }
}

Status DenseKvCache::Attend(int layer, const float* q, const float* k, const float* v, float* out) {
  if (!in_step_) return FailedPreconditionError("DenseKvCache: Attend outside a step");
  if (layer < 0 || layer >= shape_.num_layers) return InvalidArgumentError("DenseKvCache: layer out of range");
  WriteNewKv(layer, k, v);
  if (!decode_segs_.empty()) ICE_RETURN_IF_ERROR(DecodeAttention(layer, q, out));
  for (size_t i = 0; i < step_.size(); ++i) {
    if (step_[i].num_tokens > 1) ICE_RETURN_IF_ERROR(PrefillSegmentAttention(layer, i, q, k, v, out));
  }
  return Status::Ok();
}

Status DenseKvCache::DecodeAttention(int layer, const float* q, float* out) {
  const int hq = shape_.num_q_heads, hkv = shape_.num_kv_heads, hd = shape_.head_dim, ps = options_.page_size;
  const int batch = static_cast<int>(decode_segs_.size());
  indptr_.assign(1, 0);
  page_ids_.clear();
  page_valid_.clear();
  for (size_t seg : decode_segs_) {
    const Sequence* s = step_seqs_[seg];
    const int len = s->length + 1;
    const int npages = (len + ps - 1) / ps;
    for (int g = 0; g < hkv; ++g) {
      const auto& list = s->pages[static_cast<size_t>(layer) * hkv + g];
      for (int p = 0; p < npages; ++p) {
        page_ids_.push_back(list[p]);
        page_valid_.push_back(std::min(ps, len - p * ps));
      }
      indptr_.push_back(static_cast<int32_t>(page_ids_.size()));
    }
  }
  const size_t row_elems = static_cast<size_t>(hq) * hd;
  const float* dq = q;
  float* dout = out;
  if (!decode_rows_contiguous_) {
    dq_.resize(batch * row_elems);
    dout_.resize(batch * row_elems);
    for (int b = 0; b < batch; ++b) {
      std::copy_n(q + step_row_[decode_segs_[b]] * row_elems, row_elems, dq_.data() + b * row_elems);
    }
    dq = dq_.data();
    dout = dout_.data();
  }
  kernels::PagedDecodeAttentionParams p;
  p.q = dq;
  p.pages = pool_.data();
  p.kv_dtype = options_.kv_dtype;
  p.page_indptr = indptr_.data();
  p.page_ids = page_ids_.data();
  p.page_valid = page_valid_.data();
  p.out = dout;
  p.batch = batch;
  p.num_q_heads = hq;
  p.num_kv_heads = hkv;
  p.head_dim = hd;
  p.page_size = ps;
  p.scale = shape_.scale;
  ICE_RETURN_IF_ERROR(kernels::PagedDecodeAttention(p, kernels::Backend::kCpu));
  if (!decode_rows_contiguous_) {
    for (int b = 0; b < batch; ++b) {
      std::copy_n(dout_.data() + b * row_elems, row_elems, out + step_row_[decode_segs_[b]] * row_elems);
    }
  }
  return Status::Ok();
}

Status DenseKvCache::PrefillSegmentAttention(int layer, size_t seg, const float* q, const float* k, const float* v,
                                             float* out) {
  const int hq = shape_.num_q_heads, hkv = shape_.num_kv_heads, hd = shape_.head_dim, ps = options_.page_size;
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
  if (s->length == 0) {
    p.k = k + row * hkv * hd;
    p.v = v + row * hkv * hd;
  } else {
    // Earlier tokens exist: gather this layer's K/V from the pages into [kv_len, hkv, hd].
    const size_t esz = kernels::DTypeSize(options_.kv_dtype);
    gk_.resize(static_cast<size_t>(kv_len) * hkv * hd);
    gv_.resize(gk_.size());
    for (int g = 0; g < hkv; ++g) {
      const auto& list = s->pages[static_cast<size_t>(layer) * hkv + g];
      for (int pos = 0; pos < kv_len; ++pos) {
        const uint8_t* base = PagePtr(list[pos / ps]);
        const int slot = pos % ps;
        float* kd = gk_.data() + (static_cast<size_t>(pos) * hkv + g) * hd;
        float* vd = gv_.data() + (static_cast<size_t>(pos) * hkv + g) * hd;
        kernels::ConvertToF32(options_.kv_dtype, base + static_cast<size_t>(slot) * hd * esz, kd, hd);
        kernels::ConvertToF32(options_.kv_dtype, base + static_cast<size_t>(ps + slot) * hd * esz, vd, hd);
      }
    }
    p.k = gk_.data();
    p.v = gv_.data();
  }
  return kernels::PrefillAttention(p, kernels::Backend::kCpu);
}

Status DenseKvCache::ReadKv(SequenceId id, int layer, int kv_head, float* k, float* v) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("DenseKvCache: unknown sequence " + std::to_string(id));
  if (layer < 0 || layer >= shape_.num_layers || kv_head < 0 || kv_head >= shape_.num_kv_heads) {
    return InvalidArgumentError("DenseKvCache: layer or kv head out of range");
  }
  const int hd = shape_.head_dim, ps = options_.page_size;
  const size_t esz = kernels::DTypeSize(options_.kv_dtype);
  const auto& list = it->second.pages[static_cast<size_t>(layer) * shape_.num_kv_heads + kv_head];
  for (int pos = 0; pos < it->second.length; ++pos) {
    const uint8_t* base = PagePtr(list[pos / ps]);
    const int slot = pos % ps;
    kernels::ConvertToF32(options_.kv_dtype, base + static_cast<size_t>(slot) * hd * esz, k + static_cast<size_t>(pos) * hd, hd);
    kernels::ConvertToF32(options_.kv_dtype, base + static_cast<size_t>(ps + slot) * hd * esz, v + static_cast<size_t>(pos) * hd, hd);
  }
  return Status::Ok();
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
