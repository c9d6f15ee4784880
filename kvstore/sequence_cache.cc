#include "kvstore/sequence_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include "kvstore/vector_ops.h"

namespace icecache::kvstore {
namespace {

void SortUnique(std::vector<int32_t>* v) {
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
}

}  // namespace

SequenceCache::SequenceCache(const SequenceCacheOptions& options, PagePool* pool)
    : options_(options), pool_(pool), page_size_(pool->page_size()), head_dim_(pool->head_dim()),
      heads_(static_cast<size_t>(options.num_layers) * options.num_kv_heads) {}

SequenceCache::~SequenceCache() { Release(); }

StatusOr<std::unique_ptr<SequenceCache>> SequenceCache::Create(const SequenceCacheOptions& options, PagePool* pool) {
  if (pool == nullptr) return InvalidArgumentError("SequenceCache: pool is null");
  if (options.num_layers < 1 || options.num_layers > 4096)
    return InvalidArgumentError("SequenceCache: num_layers must be in [1, 4096], got " + std::to_string(options.num_layers));
  if (options.num_kv_heads < 1 || options.num_kv_heads > 4096)
    return InvalidArgumentError("SequenceCache: num_kv_heads must be in [1, 4096], got " + std::to_string(options.num_kv_heads));
  if (options.dense_layers < 0) return InvalidArgumentError("SequenceCache: dense_layers must be >= 0");
  if (options.sink_pages < 0 || options.window_pages < 0)
    return InvalidArgumentError("SequenceCache: sink_pages and window_pages must be >= 0");
  if (options.ice_group < 1 || options.ice_group > 64)
    return InvalidArgumentError("SequenceCache: ice_group must be in [1, 64], got " + std::to_string(options.ice_group));
  ICE_RETURN_IF_ERROR(ValidateDciParams(options.dci).WithContext("SequenceCache"));
  if (options.layout != SparseLayout::kDciTree && options.layout != SparseLayout::kTokenOrder)
    return InvalidArgumentError("SequenceCache: unknown layout " + std::to_string(static_cast<int>(options.layout)));
  if (options.layout == SparseLayout::kTokenOrder && options.ice_group != 1)
    return InvalidArgumentError("SequenceCache: the token-order layout has no ICE(r) groups (ice_group must be 1)");
  SequenceCacheOptions o = options;
  o.dense_layers = std::min(o.dense_layers, o.num_layers);
  return std::unique_ptr<SequenceCache>(new SequenceCache(o, pool));
}

StatusOr<std::vector<std::unique_ptr<SequenceCache>>> SequenceCache::SplitByHead(std::unique_ptr<SequenceCache> whole,
                                                                                  int parts) {
  if (whole == nullptr) return InvalidArgumentError("SequenceCache::SplitByHead: no cache");
  const int kv = whole->options_.num_kv_heads;
  if (parts < 1 || (kv % parts != 0 && parts % kv != 0)) {
    return InvalidArgumentError("SequenceCache::SplitByHead: " + std::to_string(kv) +
                                " kv heads neither split into nor replicate onto " + std::to_string(parts) +
                                " equal parts");
  }
  if (whole->broken_) return FailedPreconditionError("SequenceCache::SplitByHead: the cache is broken");
  if (whole->build_n_ >= 0) return FailedPreconditionError("SequenceCache::SplitByHead: a layered build is in progress");
  std::vector<std::unique_ptr<SequenceCache>> out;
  if (parts == 1) {
    out.push_back(std::move(whole));
    return out;
  }
  if (parts > kv) {
    // Replication: part p = h * rep + c is copy c of head h. Copies 1.. are made first, so that a
    // full pool leaves `whole` as it was; each copy then splits into its kv single-head parts.
    const int rep = parts / kv;
    std::vector<std::unique_ptr<SequenceCache>> copies(static_cast<size_t>(rep));
    for (int c = 1; c < rep; ++c) {
      auto copy = whole->Clone();
      if (!copy.ok()) return copy.status().WithContext("SequenceCache::SplitByHead: replicating kv heads");
      copies[c] = std::move(copy).value();
    }
    copies[0] = std::move(whole);
    out.resize(static_cast<size_t>(parts));
    for (int c = 0; c < rep; ++c) {
      ICE_ASSIGN_OR_RETURN(auto heads, SplitByHead(std::move(copies[c]), kv));
      for (int h = 0; h < kv; ++h) out[static_cast<size_t>(h) * rep + c] = std::move(heads[h]);
    }
    return out;
  }
  const int per = kv / parts;
  for (int p = 0; p < parts; ++p) {
    SequenceCacheOptions o = whole->options_;
    o.num_kv_heads = per;
    std::unique_ptr<SequenceCache> c(new SequenceCache(o, whole->pool_));
    c->n_ = whole->n_;
    c->sink_tokens_ = whole->sink_tokens_;
    c->window_start_ = whole->window_start_;
    c->built_layers_ = whole->built_layers_;
    for (int l = 0; l < o.num_layers; ++l) {
      for (int h = 0; h < per; ++h) std::swap(c->Head(l, h), whole->Head(l, p * per + h));  // leaves whole's empty
    }
    out.push_back(std::move(c));
  }
  whole->Release();  // holds no pages any more: only resets the counters
  return out;
}

int SequenceCache::LeaderOf(int layer) const {
  if (IsDense(layer)) return layer;
  const int rel = layer - options_.dense_layers;
  return options_.dense_layers + rel / options_.ice_group * options_.ice_group;
}

int SequenceCache::GroupSize(int leader) const {
  return std::min(options_.ice_group, options_.num_layers - leader);
}

const DciTree* SequenceCache::tree(int layer, int head) const {
  if (IsDense(layer)) return nullptr;
  return Head(LeaderOf(layer), head).tree.get();
}

int64_t SequenceCache::pages_held() const {
  int64_t total = 0;
  for (const HeadState& h : heads_) {
    total += static_cast<int64_t>(h.sink.size() + h.window.size() + h.dense.size() + h.middle.size());
    if (h.tree) total += static_cast<int64_t>(h.tree->num_leaves()) * h.tree->num_payloads();
  }
  return total;
}

void SequenceCache::Release() {
  for (HeadState& h : heads_) {
    for (auto* list : {&h.sink, &h.window, &h.dense, &h.middle}) {
      pool_->FreeMany(*list).IgnoreError();
      list->clear();
    }
    h.tree.reset();
    h.bounds.clear();
  }
  n_ = sink_tokens_ = window_start_ = 0;
  broken_ = false;
  build_n_ = -1;
  built_layers_ = 0;
}

Status SequenceCache::FillList(std::vector<int32_t>* pages, const float* k, const float* v, size_t stride, int64_t count) {
  const int64_t np = (count + page_size_ - 1) / page_size_;
  ICE_RETURN_IF_ERROR(pool_->AllocateMany(np, pages));
  for (int64_t t = 0; t < count; ++t) {
    const int32_t page = (*pages)[t / page_size_];
    const int slot = static_cast<int>(t % page_size_);
    RowFromF32(pool_->dtype(), k + t * stride, pool_->KRow(page, slot), head_dim_);
    RowFromF32(pool_->dtype(), v + t * stride, pool_->VRow(page, slot), head_dim_);
  }
  return Status::Ok();
}

void SequenceCache::SetBounds(HeadState* h, size_t i, int valid) {
  const size_t d = static_cast<size_t>(head_dim_);
  if (h->bounds.size() < (i + 1) * 2 * d) h->bounds.resize((i + 1) * 2 * d);
  float* lo = h->bounds.data() + i * 2 * d;
  float* hi = lo + d;
  thread_local std::vector<float> row;
  row.resize(d);
  std::fill(lo, lo + d, std::numeric_limits<float>::infinity());
  std::fill(hi, hi + d, -std::numeric_limits<float>::infinity());
  for (int slot = 0; slot < valid; ++slot) {
    RowToF32(pool_->dtype(), pool_->KRow(h->middle[i], slot), row.data(), head_dim_);
    for (size_t c = 0; c < d; ++c) {
      lo[c] = std::min(lo[c], row[c]);
      hi[c] = std::max(hi[c], row[c]);
    }
  }
}

Status SequenceCache::Build(const float* const* k, const float* const* v, int64_t n, ThreadPool* threads) {
  ICE_RETURN_IF_ERROR(BeginBuild(n));
  ICE_RETURN_IF_ERROR(BuildLayers(0, options_.num_layers, k, v, threads));
  return FinishBuild();
}

Status SequenceCache::BeginBuild(int64_t n) {
  if (broken_) return FailedPreconditionError("SequenceCache is broken after a failed append; release it");
  if (n_ != 0 || build_n_ >= 0) return FailedPreconditionError("SequenceCache::Build: the cache already holds tokens");
  if (n < 0 || n > INT32_MAX) return InvalidArgumentError("SequenceCache::Build: bad token count " + std::to_string(n));
  const int64_t ps = page_size_;
  sink_tokens_ = std::min<int64_t>(n, static_cast<int64_t>(options_.sink_pages) * ps);
  const int64_t rest = n - sink_tokens_;
  const int64_t chunks = (rest + ps - 1) / ps;
  window_start_ = std::min<int64_t>(n, sink_tokens_ + ps * std::max<int64_t>(0, chunks - options_.window_pages));
  const bool sink_full = sink_tokens_ == static_cast<int64_t>(options_.sink_pages) * ps;
  if (!sink_full) window_start_ = n;  // no window or tree until the sink is full
  build_n_ = n;
  built_layers_ = 0;
  return Status::Ok();
}

Status SequenceCache::FinishBuild() {
  if (build_n_ < 0 || built_layers_ != options_.num_layers) {
    return FailedPreconditionError("SequenceCache::FinishBuild: " + std::to_string(built_layers_) + " of " +
                                   std::to_string(options_.num_layers) + " layers built");
  }
  n_ = build_n_;
  build_n_ = -1;
  return Status::Ok();
}

Status SequenceCache::BuildLayers(int first_layer, int count, const float* const* k, const float* const* v,
                                  ThreadPool* threads) {
  if (build_n_ < 0) return FailedPreconditionError("SequenceCache::BuildLayers: no BeginBuild");
  if (first_layer != built_layers_ || count < 1 || first_layer + count > options_.num_layers ||
      !EndsGroup(first_layer + count - 1)) {
    Release();
    return InvalidArgumentError("SequenceCache::BuildLayers: layers [" + std::to_string(first_layer) + ", " +
                                std::to_string(first_layer + count) + ") do not continue at layer " +
                                std::to_string(built_layers_) + " and end an ICE group");
  }
  const int64_t n = build_n_;
  if (n > 0 && (k == nullptr || v == nullptr)) {
    Release();
    return InvalidArgumentError("SequenceCache::Build: k/v missing");
  }
  const bool sink_full = sink_tokens_ == static_cast<int64_t>(options_.sink_pages) * page_size_;
  const size_t stride = static_cast<size_t>(options_.num_kv_heads) * head_dim_;
  const int nkv = options_.num_kv_heads;

  std::mutex mu;
  Status first;
  auto task = [&](size_t idx) {
    const int layer = first_layer + static_cast<int>(idx / nkv), head = static_cast<int>(idx % nkv);
    HeadState& h = Head(layer, head);
    const size_t off = static_cast<size_t>(head) * head_dim_;
    Status s;
    if (IsDense(layer)) {
      s = FillList(&h.dense, k[layer - first_layer] + off, v[layer - first_layer] + off, stride, n);
    } else {
      s = FillList(&h.sink, k[layer - first_layer] + off, v[layer - first_layer] + off, stride, sink_tokens_);
      if (s.ok()) {
        s = FillList(&h.window, k[layer - first_layer] + window_start_ * stride + off,
                     v[layer - first_layer] + window_start_ * stride + off, stride, n - window_start_);
      }
      if (s.ok() && token_order() && sink_full) {
        const int64_t middle = window_start_ - sink_tokens_;
        s = FillList(&h.middle, k[layer - first_layer] + sink_tokens_ * stride + off,
                     v[layer - first_layer] + sink_tokens_ * stride + off, stride, middle);
        for (size_t i = 0; s.ok() && i < h.middle.size(); ++i) SetBounds(&h, i, ListValid(i, middle));
      } else if (s.ok() && LeaderOf(layer) == layer && sink_full) {
        const int g = GroupSize(layer);
        std::vector<const float*> ks(g), vs(g);
        for (int p = 0; p < g; ++p) {
          ks[p] = k[layer - first_layer + p] + sink_tokens_ * stride + off;
          vs[p] = v[layer - first_layer + p] + sink_tokens_ * stride + off;
        }
        TokenBlock block{sink_tokens_, static_cast<int>(window_start_ - sink_tokens_), ks.data(), vs.data(), stride};
        auto tree = DciTree::Build(options_.dci, pool_, g, block);
        if (tree.ok()) {
          h.tree = std::move(tree).value();
        } else {
          s = tree.status();
        }
      }
    }
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first.ok()) first = s.WithContext("SequenceCache::Build layer " + std::to_string(layer) + " head " + std::to_string(head));
    }
  };
  const size_t tasks = static_cast<size_t>(count) * nkv;
  if (threads != nullptr) {
    threads->ParallelFor(0, tasks, task);
  } else {
    for (size_t i = 0; i < tasks; ++i) task(i);
  }
  if (!first.ok()) {
    Release();
    return first;
  }
  built_layers_ += count;
  return Status::Ok();
}

Status SequenceCache::AppendToList(std::vector<int32_t>* pages, int64_t index_in_list, const float* k, const float* v) {
  const int slot = static_cast<int>(index_in_list % page_size_);
  if (slot == 0) {
    ICE_ASSIGN_OR_RETURN(int32_t page, pool_->Allocate());
    pages->push_back(page);
  }
  const int32_t page = pages->back();
  RowFromF32(pool_->dtype(), k, pool_->KRow(page, slot), head_dim_);
  RowFromF32(pool_->dtype(), v, pool_->VRow(page, slot), head_dim_);
  return Status::Ok();
}

Status SequenceCache::EvictWindowPage() {
  // The oldest window page of every sparse (layer, head) goes into its tree; pages freed after.
  // Token order: the page itself becomes the last middle page.
  const int nkv = options_.num_kv_heads, ps = page_size_;
  if (token_order()) {
    for (int layer = options_.dense_layers; layer < options_.num_layers; ++layer) {
      for (int head = 0; head < nkv; ++head) {
        HeadState& h = Head(layer, head);
        h.middle.push_back(h.window.front());
        h.window.erase(h.window.begin());
        SetBounds(&h, h.middle.size() - 1, ps);
      }
    }
    window_start_ += ps;
    return Status::Ok();
  }
  std::vector<float> kbuf, vbuf;
  for (int layer = options_.dense_layers; layer < options_.num_layers; ++layer) {
    if (LeaderOf(layer) != layer) continue;
    const int g = GroupSize(layer);
    kbuf.resize(static_cast<size_t>(g) * ps * head_dim_);
    vbuf.resize(kbuf.size());
    for (int head = 0; head < nkv; ++head) {
      std::vector<const float*> ks(g), vs(g);
      for (int p = 0; p < g; ++p) {
        const int32_t page = Head(layer + p, head).window.front();
        float* kd = kbuf.data() + static_cast<size_t>(p) * ps * head_dim_;
        float* vd = vbuf.data() + static_cast<size_t>(p) * ps * head_dim_;
        RowToF32(pool_->dtype(), pool_->PageK(page), kd, ps * head_dim_);
        RowToF32(pool_->dtype(), pool_->PageV(page), vd, ps * head_dim_);
        ks[p] = kd;
        vs[p] = vd;
      }
      TokenBlock block{window_start_, ps, ks.data(), vs.data(), static_cast<size_t>(head_dim_)};
      Status st = Head(layer, head).tree->Insert(block, &tree_written_);
      pages_changed_.insert(pages_changed_.end(), tree_written_.begin(), tree_written_.end());
      ICE_RETURN_IF_ERROR(st);
    }
  }
  for (int layer = options_.dense_layers; layer < options_.num_layers; ++layer) {
    for (int head = 0; head < nkv; ++head) {
      auto& w = Head(layer, head).window;
      pages_changed_.push_back(w.front());
      pool_->Free(w.front()).IgnoreError();
      w.erase(w.begin());
    }
  }
  window_start_ += ps;
  SortUnique(&pages_changed_);
  return Status::Ok();
}

Status SequenceCache::BeginToken() {
  if (broken_) return FailedPreconditionError("SequenceCache is broken after a failed append; release it");
  pages_changed_.clear();
  const int nkv = options_.num_kv_heads, ps = page_size_;
  const int64_t sink_cap = static_cast<int64_t>(options_.sink_pages) * ps;
  const bool to_sink = n_ < sink_cap;
  if (!to_sink && options_.window_pages == 0 && options_.num_layers > options_.dense_layers)
    return FailedPreconditionError(
        "SequenceCache::BeginToken: with window_pages = 0 a token goes straight into the tree and needs all "
        "layers' K/V at once; use Append");
  Status s;
  if (!to_sink && (n_ - window_start_) % ps == 0 && (n_ - window_start_) / ps == options_.window_pages &&
      options_.num_layers > options_.dense_layers) {
    s = EvictWindowPage();
  }
  for (int layer = 0; s.ok() && layer < options_.num_layers; ++layer) {
    for (int head = 0; s.ok() && head < nkv; ++head) {
      HeadState& h = Head(layer, head);
      int64_t index;
      const NextList which = NextTokenList(layer, &index);  // kWindow here past the sink (checked above)
      std::vector<int32_t>* list = which == NextList::kDense ? &h.dense : which == NextList::kSink ? &h.sink : &h.window;
      if (which == NextList::kWindow) {
        if (!h.tree && LeaderOf(layer) == layer && !token_order()) {
          auto tree = DciTree::Build(options_.dci, pool_, GroupSize(layer), TokenBlock{window_start_, 0, nullptr, nullptr, 0});
          if (!tree.ok()) {
            s = tree.status();
            break;
          }
          h.tree = std::move(tree).value();
        }
      }
      if (index % ps == 0) {
        auto page = pool_->Allocate();
        if (!page.ok()) {
          s = page.status();
          break;
        }
        list->push_back(*page);
      }
    }
  }
  if (!s.ok()) {
    broken_ = true;
    return s.WithContext("SequenceCache::BeginToken at position " + std::to_string(n_));
  }
  ++n_;
  if (to_sink) sink_tokens_ = window_start_ = n_;
  return Status::Ok();
}

Status SequenceCache::WriteLayer(int layer, const float* k, const float* v) {
  if (broken_) return FailedPreconditionError("SequenceCache is broken after a failed append; release it");
  if (n_ == 0) return FailedPreconditionError("SequenceCache::WriteLayer: no token begun");
  if (layer < 0 || layer >= options_.num_layers)
    return InvalidArgumentError("SequenceCache::WriteLayer: layer " + std::to_string(layer) + " out of range");
  if (k == nullptr || v == nullptr) return InvalidArgumentError("SequenceCache::WriteLayer: k/v missing");
  const int64_t pos = n_ - 1;
  if (!IsDense(layer) && pos >= sink_tokens_ && pos < window_start_)
    return FailedPreconditionError("SequenceCache::WriteLayer: the last token is already in the tree");
  for (int head = 0; head < options_.num_kv_heads; ++head) {
    int32_t page = -1;
    const TokenLocation loc = LocateToken(layer, head, pos, &page);
    RowFromF32(pool_->dtype(), k + static_cast<size_t>(head) * head_dim_, pool_->KRow(page, loc.slot), head_dim_);
    RowFromF32(pool_->dtype(), v + static_cast<size_t>(head) * head_dim_, pool_->VRow(page, loc.slot), head_dim_);
  }
  return Status::Ok();
}

Status SequenceCache::Append(const float* const* k, const float* const* v) {
  if (broken_) return FailedPreconditionError("SequenceCache is broken after a failed append; release it");
  if (k == nullptr || v == nullptr) return InvalidArgumentError("SequenceCache::Append: k/v missing");
  const int64_t sink_cap = static_cast<int64_t>(options_.sink_pages) * page_size_;
  if (n_ < sink_cap || options_.window_pages > 0 || options_.num_layers == options_.dense_layers) {
    ICE_RETURN_IF_ERROR(BeginToken());
    for (int layer = 0; layer < options_.num_layers; ++layer) ICE_RETURN_IF_ERROR(WriteLayer(layer, k[layer], v[layer]));
    return Status::Ok();
  }
  // window_pages == 0: the token goes straight into every tree (leaders carry the followers' K/V).
  pages_changed_.clear();
  const int nkv = options_.num_kv_heads;
  Status s;
  for (int layer = 0; s.ok() && layer < options_.num_layers; ++layer) {
    for (int head = 0; s.ok() && head < nkv; ++head) {
      HeadState& h = Head(layer, head);
      const float* kr = k[layer] + static_cast<size_t>(head) * head_dim_;
      const float* vr = v[layer] + static_cast<size_t>(head) * head_dim_;
      if (IsDense(layer)) {
        s = AppendToList(&h.dense, n_, kr, vr);
      } else if (token_order()) {
        const int64_t index = n_ - sink_tokens_;
        s = AppendToList(&h.middle, index, kr, vr);
        if (s.ok()) SetBounds(&h, h.middle.size() - 1, static_cast<int>(index % page_size_) + 1);
      } else {
        if (LeaderOf(layer) != layer) continue;
        const int g = GroupSize(layer);
        std::vector<const float*> ks(g), vs(g);
        for (int p = 0; p < g; ++p) {
          ks[p] = k[layer + p] + static_cast<size_t>(head) * head_dim_;
          vs[p] = v[layer + p] + static_cast<size_t>(head) * head_dim_;
        }
        if (!h.tree) {
          auto tree = DciTree::Build(options_.dci, pool_, g, TokenBlock{n_, 0, nullptr, nullptr, 0});
          if (!tree.ok()) {
            s = tree.status();
            break;
          }
          h.tree = std::move(tree).value();
        }
        s = h.tree->Insert(TokenBlock{n_, 1, ks.data(), vs.data(), static_cast<size_t>(head_dim_)}, &tree_written_);
        pages_changed_.insert(pages_changed_.end(), tree_written_.begin(), tree_written_.end());
      }
    }
  }
  SortUnique(&pages_changed_);
  if (!s.ok()) {
    broken_ = true;
    return s.WithContext("SequenceCache::Append at position " + std::to_string(n_));
  }
  ++n_;
  window_start_ = n_;
  return Status::Ok();
}

TokenLocation SequenceCache::LocateToken(int layer, int head, int64_t pos, int32_t* page) const {
  const HeadState& h = Head(layer, head);
  if (IsDense(layer)) {
    *page = h.dense[pos / page_size_];
    return TokenLocation{-1, static_cast<int32_t>(pos % page_size_)};
  }
  if (pos < sink_tokens_) {
    *page = h.sink[pos / page_size_];
    return TokenLocation{-1, static_cast<int32_t>(pos % page_size_)};
  }
  if (pos >= window_start_) {
    *page = h.window[(pos - window_start_) / page_size_];
    return TokenLocation{-1, static_cast<int32_t>((pos - window_start_) % page_size_)};
  }
  if (token_order()) {
    *page = h.middle[(pos - sink_tokens_) / page_size_];
    return TokenLocation{-1, static_cast<int32_t>((pos - sink_tokens_) % page_size_)};
  }
  const DciTree* t = tree(layer, head);
  const TokenLocation loc = t->Locate(pos);
  *page = t->leaf_page(loc.leaf, PayloadOf(layer));
  return loc;
}

SequenceCache::NextList SequenceCache::NextTokenList(int layer, int64_t* index) const {
  const int64_t sink_cap = static_cast<int64_t>(options_.sink_pages) * page_size_;
  *index = n_;
  if (IsDense(layer)) return NextList::kDense;
  if (n_ < sink_cap) return NextList::kSink;
  *index = n_ - window_start_;
  return options_.window_pages > 0 ? NextList::kWindow : NextList::kTree;
}

TokenLocation SequenceCache::NextTokenLocation(int layer, int head, int32_t* page) const {
  *page = -1;
  const HeadState& h = Head(layer, head);
  int64_t index;
  const NextList which = NextTokenList(layer, &index);
  if (which == NextList::kTree) return TokenLocation{};  // straight into the tree
  const std::vector<int32_t>* list = which == NextList::kDense ? &h.dense : which == NextList::kSink ? &h.sink : &h.window;
  if (index % page_size_ == 0 || list->empty()) return TokenLocation{};  // a new page
  *page = list->back();
  return TokenLocation{-1, static_cast<int32_t>(index % page_size_)};
}

Status CopyPages(const PagePool& src, const std::vector<int32_t>& src_ids, PagePool* dst,
                 const std::vector<int32_t>& dst_ids) {
  if (src.page_bytes() != dst->page_bytes() || src.page_size() != dst->page_size() || src.dtype() != dst->dtype())
    return InvalidArgumentError("CopyPages: pools differ in page geometry or dtype");
  if (src_ids.size() != dst_ids.size()) return InvalidArgumentError("CopyPages: id lists differ in length");
  for (size_t i = 0; i < src_ids.size(); ++i) {
    if (src_ids[i] < 0 || src_ids[i] >= src.capacity_pages() || dst_ids[i] < 0 || dst_ids[i] >= dst->capacity_pages())
      return InvalidArgumentError("CopyPages: page id out of range at index " + std::to_string(i));
    std::memcpy(dst->PageK(dst_ids[i]), src.PageK(src_ids[i]), src.page_bytes());
  }
  return Status::Ok();
}

}  // namespace icecache::kvstore
