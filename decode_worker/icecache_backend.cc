#include "decode_worker/icecache_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "kernels/attention.h"
#include "kvstore/retriever.h"

namespace icecache::decode {

using model::SequenceId;

namespace {
constexpr int64_t kParallelSelectTokens = 32768;  // tree tokens of a layer's queries, summed
}  // namespace

IceCacheBackend::IceCacheBackend(const model::AttentionShape& shape, kvstore::PagePool* pool)
    : shape_(shape), pool_(pool) {}

IceCacheBackend::~IceCacheBackend() = default;  // each SequenceCache frees its pages

Status IceCacheBackend::Import(SequenceId id, std::unique_ptr<kvstore::SequenceCache> cache, int budget_pages) {
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
  if (sparse && budget_pages <= o.sink_pages + o.window_pages) {
    return InvalidArgumentError("budget of " + std::to_string(budget_pages) + " pages must exceed sink + window = " +
                                std::to_string(o.sink_pages + o.window_pages) + " pages");
  }
  Sequence s;
  s.cache = std::move(cache);
  s.budget_pages = budget_pages;
  s.leader_pick.resize(shape_.num_kv_heads);
  seqs_.emplace(id, std::move(s));
  return Status::Ok();
}

Status IceCacheBackend::AddSequence(SequenceId id) {
  return FailedPreconditionError("IceCacheBackend sequences are imported from a prefill worker, not added empty");
}

Status IceCacheBackend::RemoveSequence(SequenceId id) {
  if (in_step_) return FailedPreconditionError("RemoveSequence during a step");
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence " + std::to_string(id) + " not found");
  seqs_.erase(it);
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
  for (int l = 0; l < shape_.num_layers; ++l) {
    step_k_[l].assign(seqs.size() * row, 0.f);
    step_v_[l].assign(seqs.size() * row, 0.f);
  }
  step_seqs_ = std::move(seqs);
  in_step_ = true;
  return Status::Ok();
}

void IceCacheBackend::SelectLeaves(const kvstore::DciTree& tree, const float* q_group, int k,
                                   std::vector<std::vector<kvstore::ScoredLeaf>>* per_head,
                                   std::vector<int32_t>* picked) const {
  picked->clear();
  const int32_t n = tree.num_leaves();
  if (n <= k) {
    for (int32_t i = 0; i < n; ++i) picked->push_back(i);
    return;
  }
  const int group = shape_.num_q_heads / shape_.num_kv_heads;
  // The group's heads share one traversal of the tree (each page scored once for all of them).
  tree.QueryGroup(q_group, group, k, per_head);
  *picked = kvstore::MergeRankByRank(*per_head, k);
}

void IceCacheBackend::SelectAll(int layer, const float* q) {
  const int kvh = shape_.num_kv_heads;
  const int group = shape_.num_q_heads / kvh;
  const int hd = shape_.head_dim;
  // One task per (sequence, kv head) whose leader layer is this one.
  select_tasks_.clear();
  for (size_t b = 0; b < step_seqs_.size(); ++b) {
    const kvstore::SequenceCache& c = *step_seqs_[b]->cache;
    if (c.IsDense(layer) || c.LeaderOf(layer) != layer) continue;
    for (int g = 0; g < kvh; ++g) {
      if (c.tree(layer, g) != nullptr) select_tasks_.push_back({static_cast<int>(b), g, 0.0});
    }
  }
  const int tasks = static_cast<int>(select_tasks_.size());
  if (tasks == 0) return;
  // Trees are independent and Query is const: the tasks run on the kernels' OpenMP threads, when
  // there is enough work to pay for waking them (a query over a few thousand tokens takes tens of
  // microseconds, about what a parallel region costs on a loaded host).
  int64_t tokens = 0;
  for (const SelectTask& task : select_tasks_) tokens += step_seqs_[task.b]->cache->tree(layer, task.g)->size();
  const bool parallel = tasks > 1 && tokens >= kParallelSelectTokens;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int t = 0; t < tasks; ++t) {
    thread_local std::vector<std::vector<kvstore::ScoredLeaf>> per_head;
    SelectTask& task = select_tasks_[t];
    Sequence& s = *step_seqs_[task.b];
    const kvstore::SequenceCache& c = *s.cache;
    const auto t0 = std::chrono::steady_clock::now();
    const int kk = s.budget_pages - c.options().sink_pages - c.options().window_pages;
    SelectLeaves(*c.tree(layer, task.g), q + (task.b * shape_.num_q_heads + static_cast<size_t>(task.g) * group) * hd,
                 kk, &per_head, &s.leader_pick[task.g]);
    task.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  for (const SelectTask& task : select_tasks_) step_seqs_[task.b]->stats.retrieval_seconds += task.seconds;
}

Status IceCacheBackend::Attend(int layer, const float* q, const float* k, const float* v, float* out) {
  if (!in_step_) return FailedPreconditionError("Attend outside a step");
  const int hd = shape_.head_dim;
  const int kvh = shape_.num_kv_heads;
  const int nq = shape_.num_q_heads;
  const int group = nq / kvh;
  const size_t batch = step_seqs_.size();
  std::memcpy(step_k_[layer].data(), k, batch * kvh * hd * sizeof(float));
  std::memcpy(step_v_[layer].data(), v, batch * kvh * hd * sizeof(float));

  SelectAll(layer, q);
  indptr_.assign(1, 0);
  ids_.clear();
  valid_.clear();
  for (size_t b = 0; b < batch; ++b) {
    Sequence& s = *step_seqs_[b];
    const kvstore::SequenceCache& c = *s.cache;
    const bool dense = c.IsDense(layer);
    const int payload = dense ? 0 : c.PayloadOf(layer);
    for (int g = 0; g < kvh; ++g) {
      const size_t before = ids_.size();
      if (dense) {
        const auto& pages = c.dense_pages(layer, g);
        for (size_t i = 0; i < pages.size(); ++i) {
          ids_.push_back(pages[i]);
          valid_.push_back(c.dense_valid(i));
        }
      } else {
        const auto& sink = c.sink_pages(layer, g);
        for (size_t i = 0; i < sink.size(); ++i) {
          ids_.push_back(sink[i]);
          valid_.push_back(c.sink_valid(i));
        }
        const kvstore::DciTree* tree = c.tree(layer, g);
        if (tree != nullptr) {
          // Picked by SelectAll at this layer, or at its ICE(r) leader.
          for (int32_t leaf : s.leader_pick[g]) {
            ids_.push_back(tree->leaf_page(leaf, payload));
            valid_.push_back(tree->leaf_valid(leaf));
          }
        }
        const auto& window = c.window_pages(layer, g);
        for (size_t i = 0; i < window.size(); ++i) {
          ids_.push_back(window[i]);
          valid_.push_back(c.window_valid(i));
        }
        s.stats.pages_fetched += static_cast<int64_t>(ids_.size() - before);
      }
      indptr_.push_back(static_cast<int32_t>(ids_.size()));
    }
  }
  lse_.assign(batch * nq, 0.f);
  kernels::PagedDecodeAttentionParams a;
  a.q = q;
  a.pages = pool_->base();
  a.kv_dtype = pool_->dtype();
  a.page_indptr = indptr_.data();
  a.page_ids = ids_.data();
  a.page_valid = valid_.data();
  a.out = out;
  a.lse = lse_.data();
  a.batch = static_cast<int>(batch);
  a.num_q_heads = nq;
  a.num_kv_heads = kvh;
  a.head_dim = hd;
  a.page_size = pool_->page_size();
  a.scale = shape_.scale;
  ICE_RETURN_IF_ERROR(kernels::PagedDecodeAttention(a));

  // Merge the new token (not yet in the cache): softmax over pages ∪ {new} from the paged result.
  for (size_t b = 0; b < batch; ++b) {
    for (int h = 0; h < nq; ++h) {
      const int g = h / group;
      const float* qh = q + (b * nq + h) * hd;
      const float* kn = k + (b * kvh + g) * hd;
      const float* vn = v + (b * kvh + g) * hd;
      float* o = out + (b * nq + h) * hd;
      float dot = 0.f;
      for (int d = 0; d < hd; ++d) dot += qh[d] * kn[d];
      const float s_new = dot * shape_.scale;
      const float lse = ids_.empty() ? -std::numeric_limits<float>::infinity() : lse_[b * nq + h];
      const bool no_pages = indptr_[b * kvh + g] == indptr_[b * kvh + g + 1] || !std::isfinite(lse);
      if (no_pages) {
        std::memcpy(o, vn, hd * sizeof(float));
        continue;
      }
      const float m = std::max(lse, s_new);
      const float w_old = std::exp(lse - m);
      const float w_new = std::exp(s_new - m);
      const float inv = 1.f / (w_old + w_new);
      for (int d = 0; d < hd; ++d) o[d] = (o[d] * w_old + vn[d] * w_new) * inv;
    }
  }
  return Status::Ok();
}

void IceCacheBackend::EndStep(bool commit) {
  if (commit) {
    const size_t row = static_cast<size_t>(shape_.num_kv_heads) * shape_.head_dim;
    std::vector<const float*> kp(shape_.num_layers), vp(shape_.num_layers);
    for (size_t b = 0; b < step_seqs_.size(); ++b) {
      for (int l = 0; l < shape_.num_layers; ++l) {
        kp[l] = step_k_[l].data() + b * row;
        vp[l] = step_v_[l].data() + b * row;
      }
      Status st = step_seqs_[b]->cache->Append(kp.data(), vp.data());
      if (!st.ok()) step_seqs_[b]->error = st;
    }
  }
  step_seqs_.clear();
  in_step_ = false;
}

}  // namespace icecache::decode
