#include "decode_worker/icecache_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "kernels/attention.h"
#include "kernels/kv_pages.h"

namespace icecache::decode {

using model::SequenceId;

namespace {

using Clock = std::chrono::steady_clock;

// Adds the time since `t0` to *acc and restarts t0.
void Lap(Clock::time_point* t0, double* acc) {
  const Clock::time_point now = Clock::now();
  *acc += std::chrono::duration<double>(now - *t0).count();
  *t0 = now;
}

}  // namespace

StatusOr<std::unique_ptr<IceCacheBackend>> IceCacheBackend::Create(const model::AttentionShape& shape,
                                                                   kvstore::PagePool* pool,
                                                                   const IceCacheBackendOptions& options) {
  const kernels::Device device = kernels::ResolveDevice(options.device);
  if (options.device_cache_pages < 0) return InvalidArgumentError("device_cache_pages must be >= 0");
  ICE_RETURN_IF_ERROR(kernels::UseDevice(device));  // the cache's memory on this device
  std::unique_ptr<kernels::PageResidencyCache> cache;
  if (options.device_cache_pages > 0) {
    ICE_ASSIGN_OR_RETURN(cache, kernels::PageResidencyCache::Create(device.backend, options.device_cache_pages,
                                                                    pool->page_bytes()));
  } else if (!kernels::MemoryIsHost(device.backend)) {
    return InvalidArgumentError("the IceCache backend on " + kernels::DeviceName(device) +
                                " needs a device page cache (cache.device_cache_pages > 0)");
  }
  return std::unique_ptr<IceCacheBackend>(new IceCacheBackend(shape, pool, device, std::move(cache)));
}

IceCacheBackend::IceCacheBackend(const model::AttentionShape& shape, kvstore::PagePool* pool, kernels::Device device,
                                 std::unique_ptr<kernels::PageResidencyCache> cache)
    : shape_(shape), pool_(pool), device_(device), device_cache_(std::move(cache)), retriever_(kvstore::RetrievalPolicy{}) {}

IceCacheBackend::~IceCacheBackend() = default;  // each SequenceCache frees its pages

Status IceCacheBackend::Import(SequenceId id, std::unique_ptr<kvstore::SequenceCache> cache,
                               kvstore::RetrievalPolicy policy) {
  const int budget_pages = policy.budget_pages;
  const kvstore::RetrievalMode mode = policy.mode;
  if (seqs_.count(id)) return AlreadyExistsError("sequence " + std::to_string(id) + " exists");
  const auto& o = cache->options();
  if (o.num_layers != shape_.num_layers || o.num_kv_heads != shape_.num_kv_heads ||
      cache->pool() != pool_ || pool_->head_dim() != shape_.head_dim) {
    return InvalidArgumentError("shipped sequence geometry (layers " + std::to_string(o.num_layers) + ", kv heads " +
                                std::to_string(o.num_kv_heads) + ", head_dim " + std::to_string(pool_->head_dim()) +
                                ") does not match this decode worker's model (" + std::to_string(shape_.num_layers) +
                                ", " + std::to_string(shape_.num_kv_heads) + ", " + std::to_string(shape_.head_dim) +
                                ")");
  }
  const bool sparse = o.dense_layers < o.num_layers;
  if (sparse && budget_pages < o.sink_pages + o.window_pages) {
    return InvalidArgumentError("budget of " + std::to_string(budget_pages) + " pages is less than sink + window = " +
                                std::to_string(o.sink_pages + o.window_pages) + " pages");
  }
  if (sparse && mode != kvstore::RetrievalMode::kFull && cache->token_order() != (mode == kvstore::RetrievalMode::kQuest)) {
    return InvalidArgumentError(cache->token_order() ? "a token-order (Quest layout) sequence is served in mode full or quest only"
                                                     : "mode quest needs a sequence built with the token-order layout");
  }
  if (policy.rest_cells < 0) return InvalidArgumentError("rest_cells must be >= 0");
  Sequence s;
  s.cache = std::move(cache);
  s.policy = policy;
  s.policy.budget_pages = std::max(budget_pages, 1);
  s.policy.scale = shape_.scale;
  seqs_.emplace(id, std::move(s));
  return Status::Ok();
}

Status IceCacheBackend::AddSequence(SequenceId id) {
  return FailedPreconditionError("IceCacheBackend sequences are imported from a prefill worker, not added empty");
}

void IceCacheBackend::InvalidateAll(Sequence& s) {
  if (device_cache_ == nullptr) return;
  for (int64_t p : s.resident) device_cache_->Invalidate(p);
  s.resident.clear();
}

Status IceCacheBackend::RemoveSequence(SequenceId id) {
  if (in_step_) return FailedPreconditionError("RemoveSequence during a step");
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence " + std::to_string(id) + " not found");
  // Its pages go back to the pool and may hold another sequence's KV next: forget their copies.
  InvalidateAll(it->second);
  seqs_.erase(it);
  return Status::Ok();
}

StatusOr<std::unique_ptr<kvstore::SequenceCache>> IceCacheBackend::ReleaseSequence(SequenceId id) {
  if (in_step_) return FailedPreconditionError("ReleaseSequence during a step");
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence " + std::to_string(id) + " not found");
  if (!it->second.error.ok()) return FailedPreconditionError("sequence " + std::to_string(id) + " is broken");
  InvalidateAll(it->second);  // the device copies are not kept with a retained sequence
  std::unique_ptr<kvstore::SequenceCache> cache = std::move(it->second.cache);
  seqs_.erase(it);
  return cache;
}

Status IceCacheBackend::SetMode(SequenceId id, kvstore::RetrievalMode mode) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence " + std::to_string(id) + " not found");
  const kvstore::SequenceCache& c = *it->second.cache;
  const bool sparse = c.options().dense_layers < c.options().num_layers;
  if (sparse && mode != kvstore::RetrievalMode::kFull && c.token_order() != (mode == kvstore::RetrievalMode::kQuest)) {
    return InvalidArgumentError("retrieval mode does not match the sequence's layout");
  }
  it->second.policy.mode = mode;
  return Status::Ok();
}

StatusOr<int> IceCacheBackend::SequenceLength(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence " + std::to_string(id) + " not found");
  return static_cast<int>(it->second.cache->num_tokens());
}

StatusOr<SequenceKvStats> IceCacheBackend::Stats(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence " + std::to_string(id) + " not found");
  return it->second.stats;
}

StatusOr<int64_t> IceCacheBackend::PagesHeld(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence " + std::to_string(id) + " not found");
  return it->second.cache->pages_held();
}

Status IceCacheBackend::SequenceError(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence " + std::to_string(id) + " not found");
  return it->second.error;
}

DevicePageCacheStats IceCacheBackend::device_cache_stats() const {
  DevicePageCacheStats s;
  if (device_cache_ == nullptr) return s;
  const kernels::PageGatherStats& g = device_cache_->stats();
  s.hits = g.hits;
  s.misses = g.pages_copied;
  s.h2d_bytes = g.bytes_copied;
  s.slots = device_cache_->residency().num_slots();
  s.bytes = static_cast<int64_t>(s.slots) * static_cast<int64_t>(device_cache_->page_bytes());
  return s;
}

Status IceCacheBackend::BeginStep(std::span<const model::StepSegment> segments) {
  if (in_step_) return FailedPreconditionError("BeginStep called twice without EndStep");
  std::unordered_set<SequenceId> seen;
  std::vector<Sequence*> seqs;
  for (const auto& seg : segments) {
    auto it = seqs_.find(seg.seq_id);
    if (it == seqs_.end()) return NotFoundError("sequence " + std::to_string(seg.seq_id) + " not found");
    if (!seen.insert(seg.seq_id).second) return InvalidArgumentError("sequence listed twice in one step");
    if (seg.num_tokens != 1) {
      return InvalidArgumentError("the IceCache decode backend takes one new token per sequence per step; "
                                  "prompts are prefilled on prefill workers");
    }
    if (!it->second.error.ok()) return it->second.error;
    seqs.push_back(&it->second);
  }
  const size_t row = static_cast<size_t>(shape_.num_kv_heads) * shape_.head_dim;
  step_k_.resize(shape_.num_layers);
  step_v_.resize(shape_.num_layers);
  selection_.resize(shape_.num_layers);
  for (int l = 0; l < shape_.num_layers; ++l) {
    step_k_[l].assign(seqs.size() * row, 0.f);
    step_v_[l].assign(seqs.size() * row, 0.f);
  }
  step_caches_.clear();
  step_policies_.clear();
  for (Sequence* s : seqs) {
    step_caches_.push_back(s->cache.get());
    step_policies_.push_back(s->policy);
  }
  token_written_.assign(seqs.size() * shape_.num_layers * shape_.num_kv_heads, -1);
  step_seqs_ = std::move(seqs);
  in_step_ = true;
  return Status::Ok();
}

Status IceCacheBackend::AttendRows(const kvstore::PageSelection& sel, size_t first, size_t last, const float* q,
                                   float* out) {
  const int kvh = shape_.num_kv_heads, nq = shape_.num_q_heads, hd = shape_.head_dim;
  const int32_t begin = sel.page_indptr[first * kvh];
  const int32_t end = sel.page_indptr[last * kvh];
  const int count = end - begin;
  // [indptr | ids | valid] of these rows, uploaded in one copy.
  lists_.clear();
  for (size_t u = first * kvh; u <= last * kvh; ++u) lists_.push_back(sel.page_indptr[u] - begin);
  const void* pages = pool_->base();
  if (device_cache_ != nullptr) {
    const Clock::time_point g0 = Clock::now();
    host_pages_.assign(sel.page_ids.begin() + begin, sel.page_ids.begin() + end);
    slots_.resize(count);
    ICE_RETURN_IF_ERROR(device_cache_->Gather(pool_->base(), host_pages_.data(), count, slots_.data()));
    lists_.insert(lists_.end(), slots_.begin(), slots_.end());
    pages = device_cache_->device_pages();
    for (size_t b = first; b < last; ++b) {
      Sequence& s = *step_seqs_[b];
      for (int32_t e = sel.page_indptr[b * kvh]; e < sel.page_indptr[(b + 1) * kvh]; ++e) s.resident.insert(sel.page_ids[e]);
    }
    const double g = std::chrono::duration<double>(Clock::now() - g0).count();
    timings_.gather += g;
    timings_.attention -= g;  // Attend's attention lap spans this call: count the gather once
  } else {
    lists_.insert(lists_.end(), sel.page_ids.begin() + begin, sel.page_ids.begin() + end);
  }
  lists_.insert(lists_.end(), sel.page_valid.begin() + begin, sel.page_valid.begin() + end);
  ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(device_.backend, lists_.size() * sizeof(int32_t), &lists_dev_));
  ICE_RETURN_IF_ERROR(lists_dev_.CopyFromHost(lists_.data(), lists_.size() * sizeof(int32_t)));
  const int32_t* dev = lists_dev_.as<int32_t>();
  const size_t nlists = (last - first) * kvh + 1;
  kernels::PagedDecodeAttentionParams a;
  a.q = q + first * nq * hd;
  a.pages = pages;
  a.kv_dtype = pool_->dtype();
  a.page_indptr = dev;
  a.page_ids = dev + nlists;
  a.page_valid = dev + nlists + count;
  a.out = out + first * nq * hd;
  a.lse = lse_.as<float>() + first * nq;
  a.batch = static_cast<int>(last - first);
  a.num_q_heads = nq;
  a.num_kv_heads = kvh;
  a.head_dim = hd;
  a.page_size = pool_->page_size();
  a.scale = shape_.scale;
  return kernels::PagedDecodeAttention(a, device_.backend);
}

Status IceCacheBackend::Attend(int layer, const float* q, const float* k, const float* v, float* out) {
  if (!in_step_) return FailedPreconditionError("Attend outside a step");
  const int hd = shape_.head_dim;
  const int kvh = shape_.num_kv_heads;
  const int nq = shape_.num_q_heads;
  const size_t batch = step_seqs_.size();
  const kernels::Backend be = device_.backend;
  Clock::time_point t0 = Clock::now();
  const size_t kv_bytes = batch * kvh * hd * sizeof(float);
  ICE_RETURN_IF_ERROR(kernels::CopyToHost(be, step_k_[layer].data(), k, kv_bytes));
  ICE_RETURN_IF_ERROR(kernels::CopyToHost(be, step_v_[layer].data(), v, kv_bytes));

  // Selection on the host. ICE(r) followers reuse their leader layer's selection; a tree query
  // and the rest estimate need q on the host.
  int leader = -1;
  bool query = false;
  for (size_t b = 0; b < batch; ++b) {
    const kvstore::SequenceCache* c = step_caches_[b];
    if (c->IsDense(layer)) continue;
    if (c->LeaderOf(layer) != layer) {
      leader = c->LeaderOf(layer);
    } else {
      query = true;
    }
    if (step_policies_[b].estimate_rest) query = true;
  }
  const float* q_host = nullptr;
  if (query) {
    q_host_.resize(batch * nq * hd);
    ICE_RETURN_IF_ERROR(kernels::CopyToHost(be, q_host_.data(), q, q_host_.size() * sizeof(float)));
    q_host = q_host_.data();
  }
  Lap(&t0, &timings_.kv_to_host);
  kvstore::PageSelection& sel = selection_[layer];
  ICE_RETURN_IF_ERROR(retriever_.SelectBatch(step_caches_, step_policies_, layer, q_host, nq, &sel,
                                             leader >= 0 ? &selection_[leader] : nullptr));
  for (size_t b = 0; b < batch; ++b) {
    Sequence& s = *step_seqs_[b];
    if (!s.cache->IsDense(layer)) s.stats.pages_fetched += sel.page_indptr[(b + 1) * kvh] - sel.page_indptr[b * kvh];
    for (int g = 0; g < kvh; ++g) s.stats.retrieval_seconds += sel.unit_seconds[b * kvh + g];
  }
  Lap(&t0, &timings_.selection);

  // Attention on the device, in groups of sequences whose pages fit the device cache at once.
  ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(be, batch * nq * sizeof(float), &lse_));
  const int64_t slots = device_cache_ == nullptr ? std::numeric_limits<int64_t>::max()
                                                 : device_cache_->residency().num_slots();
  size_t first = 0;
  while (first < batch) {
    size_t last = first;
    while (last < batch && sel.page_indptr[(last + 1) * kvh] - sel.page_indptr[first * kvh] <= slots) ++last;
    if (last == first) {
      return ResourceExhaustedError("one sequence needs " +
                                    std::to_string(sel.page_indptr[(first + 1) * kvh] - sel.page_indptr[first * kvh]) +
                                    " device pages in layer " + std::to_string(layer) + ", more than the " +
                                    std::to_string(slots) + " of the device page cache (cache.device_cache_pages)");
    }
    ICE_RETURN_IF_ERROR(AttendRows(sel, first, last, q, out));
    first = last;
  }

  // The leaves left out, estimated on the host (PageSelection::rest_*): merged into the paged result.
  if (sel.has_rest) {
    const size_t rows = batch * nq;
    const size_t bytes = rows * (hd + 1) * sizeof(float);
    ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(be, bytes, &rest_dev_));
    ICE_RETURN_IF_ERROR(rest_dev_.CopyFromHost(sel.rest_out.data(), rows * hd * sizeof(float)));
    ICE_RETURN_IF_ERROR(rest_dev_.CopyFromHost(sel.rest_lse.data(), rows * sizeof(float), rows * hd * sizeof(float)));
    float* rest = rest_dev_.as<float>();
    kernels::MergeStatesParams ms;
    ms.out = out;
    ms.lse = lse_.as<float>();
    ms.out2 = rest;
    ms.lse2 = rest + rows * hd;
    ms.rows = static_cast<int>(rows);
    ms.head_dim = hd;
    ICE_RETURN_IF_ERROR(kernels::MergeStates(ms, be));
  }
  // The new token (not yet in the cache): softmax over pages ∪ {new} from the paged result.
  kernels::MergeTokenParams m;
  m.q = q;
  m.k_new = k;
  m.v_new = v;
  m.lse = lse_.as<float>();
  m.out = out;
  m.batch = static_cast<int>(batch);
  m.num_q_heads = nq;
  m.num_kv_heads = kvh;
  m.head_dim = hd;
  m.scale = shape_.scale;
  Status st = kernels::MergeToken(m, be);
  Lap(&t0, &timings_.attention);
  if (st.ok() && device_cache_ != nullptr) {
    st = WriteTokenOnDevice(layer, k, v);
    Lap(&t0, &timings_.gather);
  }
  return st;
}

Status IceCacheBackend::WriteTokenOnDevice(int layer, const float* k, const float* v) {
  const int kvh = shape_.num_kv_heads, layers = shape_.num_layers, ps = pool_->page_size();
  const size_t batch = step_seqs_.size();
  token_slots_.assign(batch * kvh, -1);
  bool any = false;
  for (size_t b = 0; b < batch; ++b) {
    for (int g = 0; g < kvh; ++g) {
      int32_t page = -1;
      const kvstore::TokenLocation loc = step_seqs_[b]->cache->NextTokenLocation(layer, g, &page);
      if (page < 0) continue;
      const int32_t slot = device_cache_->residency().SlotOf(page);
      if (slot < 0) continue;
      token_slots_[b * kvh + g] = static_cast<int64_t>(slot) * ps + loc.slot;
      token_written_[(b * layers + layer) * kvh + g] = page;
      any = true;
    }
  }
  if (!any) return Status::Ok();
  const size_t bytes = token_slots_.size() * sizeof(int64_t);
  ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(device_.backend, bytes, &token_slots_dev_));
  ICE_RETURN_IF_ERROR(token_slots_dev_.CopyFromHost(token_slots_.data(), bytes));
  kernels::StoreKvParams p;
  p.k = k;
  p.v = v;
  p.pages = device_cache_->mutable_device_pages();
  p.kv_dtype = pool_->dtype();
  p.slot_ids = token_slots_dev_.as<int64_t>();
  p.rows = static_cast<int>(batch);
  p.num_heads = kvh;
  p.head_dim = shape_.head_dim;
  p.page_size = ps;
  return kernels::StoreKv(p, device_.backend);
}

void IceCacheBackend::EndStep(bool commit) {
  Clock::time_point t0 = Clock::now();
  if (commit) {
    const size_t row = static_cast<size_t>(shape_.num_kv_heads) * shape_.head_dim;
    std::vector<const float*> kp(shape_.num_layers), vp(shape_.num_layers);
    for (size_t b = 0; b < step_seqs_.size(); ++b) {
      Sequence& s = *step_seqs_[b];
      for (int l = 0; l < shape_.num_layers; ++l) {
        kp[l] = step_k_[l].data() + b * row;
        vp[l] = step_v_[l].data() + b * row;
      }
      Status st = s.cache->Append(kp.data(), vp.data());
      if (!st.ok()) {
        s.error = st;
        InvalidateAll(s);
        continue;
      }
      if (device_cache_ == nullptr) continue;
      // The device copies of pages that changed are stale: the tree leaves the window push wrote
      // and the window pages it freed (SequenceCache::pages_changed), and the page that took the
      // token in every (layer, kv head) unless step 5 wrote it on the device.
      for (int32_t p : s.cache->pages_changed()) {
        if (s.resident.erase(p) > 0) device_cache_->Invalidate(p);
      }
      const int64_t pos = s.cache->num_tokens() - 1;
      const int32_t* written = token_written_.data() + b * shape_.num_layers * shape_.num_kv_heads;
      for (int l = 0; l < shape_.num_layers; ++l) {
        for (int g = 0; g < shape_.num_kv_heads; ++g) {
          int32_t page = -1;
          s.cache->LocateToken(l, g, pos, &page);
          if (page >= 0 && page != written[l * shape_.num_kv_heads + g]) device_cache_->Invalidate(page);
        }
      }
    }
  }
  step_seqs_.clear();
  in_step_ = false;
  ++timings_.steps;
  Lap(&t0, &timings_.append);
}

}  // namespace icecache::decode
