// SequenceCache wire form. Layout (little-endian):
//   magic "ICKV" u32, version u32, options, page geometry, token counts,
//   then per (layer, head): sink / window / dense page counts and, for tree owners, the tree
//   metadata (DciTree::Serialize). Pages are never referenced by id: they are consumed in order
//   from the shipped page list (sink, window, dense, tree leaves x payloads per (layer, head)).
#include <algorithm>
#include <cstring>
#include <string>

#include "kvstore/sequence_cache.h"
#include "kvstore/wire.h"

namespace icecache::kvstore {
namespace {
constexpr uint32_t kMagic = 0x564b4349;  // "ICKV"
}

Status SequenceCache::CheckWireInvariants() const {
  const int64_t ps = page_size_;
  const int64_t sink_cap = static_cast<int64_t>(options_.sink_pages) * ps;
  auto pages_for = [ps](int64_t tokens) { return static_cast<uint64_t>((tokens + ps - 1) / ps); };
  auto bad = [](const std::string& what) { return DataLossError("sequence wire form: " + what); };
  if (sink_tokens_ != std::min(n_, sink_cap)) return bad("sink tokens do not match the sink size");
  // Without sparse layers the window is never evicted and only the dense lists matter.
  if (options_.num_layers > options_.dense_layers) {
    if (sink_tokens_ < sink_cap && window_start_ != n_) return bad("a window or tree before the sink is full");
    if (options_.window_pages > 0) {
      if ((window_start_ - sink_tokens_) % ps != 0) return bad("tree tokens are not whole pages");
      if (n_ - window_start_ > static_cast<int64_t>(options_.window_pages) * ps) {
        return bad("window longer than window_pages");
      }
    }
  }
  for (int layer = 0; layer < options_.num_layers; ++layer) {
    for (int head = 0; head < options_.num_kv_heads; ++head) {
      const HeadState& h = Head(layer, head);
      const std::string where = " (layer " + std::to_string(layer) + ", head " + std::to_string(head) + ")";
      if (IsDense(layer)) {
        if (h.dense.size() != pages_for(n_) || !h.sink.empty() || !h.window.empty() || h.tree) {
          return bad("dense pages do not match the token count" + where);
        }
        continue;
      }
      if (!h.dense.empty() || h.sink.size() != pages_for(sink_tokens_) || h.window.size() != pages_for(n_ - window_start_)) {
        return bad("sink/window pages do not match the token counts" + where);
      }
      const bool leader = LeaderOf(layer) == layer;
      if (!leader && h.tree) return bad("a tree on an ICE follower layer" + where);
      if (!leader) continue;
      const int64_t tree_tokens = window_start_ - sink_tokens_;
      if (!h.tree) {
        if (tree_tokens > 0) return bad("a sparse layer with tree tokens but no tree" + where);
        continue;
      }
      if (h.tree->size() != tree_tokens || h.tree->first_position() != sink_tokens_) {
        return bad("the tree's token range does not match the sink and window" + where);
      }
      if (h.tree->num_payloads() != GroupSize(layer)) return bad("the tree's payload count does not match" + where);
    }
  }
  return Status::Ok();
}

StatusOr<SequenceWire> SequenceCache::Serialize() const {
  if (broken_) return FailedPreconditionError("SequenceCache is broken after a failed append; release it");
  if (token_order())
    return FailedPreconditionError("SequenceCache: the token-order layout (the Quest baseline) has no wire form");
  WireWriter w;
  SequenceWire out;
  w.Put(kMagic);
  w.Put(kWireVersion);
  w.Put<int32_t>(options_.num_layers);
  w.Put<int32_t>(options_.num_kv_heads);
  w.Put<int32_t>(options_.dense_layers);
  w.Put<int32_t>(options_.sink_pages);
  w.Put<int32_t>(options_.window_pages);
  w.Put<int32_t>(options_.ice_group);
  SerializeDciParams(options_.dci, &w);
  w.Put<int32_t>(page_size_);
  w.Put<int32_t>(head_dim_);
  w.Put<int32_t>(static_cast<int32_t>(pool_->dtype()));
  w.Put(n_);
  w.Put(sink_tokens_);
  w.Put(window_start_);
  for (const HeadState& h : heads_) {
    w.Put<uint64_t>(h.sink.size());
    w.Put<uint64_t>(h.window.size());
    w.Put<uint64_t>(h.dense.size());
    w.Put<uint8_t>(h.tree ? 1 : 0);
    out.pages.insert(out.pages.end(), h.sink.begin(), h.sink.end());
    out.pages.insert(out.pages.end(), h.window.begin(), h.window.end());
    out.pages.insert(out.pages.end(), h.dense.begin(), h.dense.end());
    if (h.tree) {
      h.tree->Serialize(&w);
      const std::vector<int32_t> tp = h.tree->AllPages();
      out.pages.insert(out.pages.end(), tp.begin(), tp.end());
    }
  }
  out.metadata = std::move(w.buffer());
  return out;
}

StatusOr<std::unique_ptr<SequenceCache>> SequenceCache::Deserialize(const uint8_t* metadata, size_t size,
                                                                    const int32_t* pages, size_t num_pages,
                                                                    PagePool* pool) {
  if (pool == nullptr) return InvalidArgumentError("SequenceCache::Deserialize: pool is null");
  WireReader r(metadata, size);
  uint32_t magic = 0, version = 0;
  ICE_RETURN_IF_ERROR(r.Get(&magic, "magic"));
  if (magic != kMagic) return DataLossError("sequence wire form: bad magic (not an icecache sequence)");
  ICE_RETURN_IF_ERROR(r.Get(&version, "version"));
  if (version != kWireVersion)
    return InvalidArgumentError("sequence wire form: version " + std::to_string(version) + " not supported (this build reads " +
                                std::to_string(kWireVersion) + ")");
  SequenceCacheOptions o;
  int32_t ps = 0, hd = 0, dt = 0;
  ICE_RETURN_IF_ERROR(r.Get(&o.num_layers, "num_layers"));
  ICE_RETURN_IF_ERROR(r.Get(&o.num_kv_heads, "num_kv_heads"));
  ICE_RETURN_IF_ERROR(r.Get(&o.dense_layers, "dense_layers"));
  ICE_RETURN_IF_ERROR(r.Get(&o.sink_pages, "sink_pages"));
  ICE_RETURN_IF_ERROR(r.Get(&o.window_pages, "window_pages"));
  ICE_RETURN_IF_ERROR(r.Get(&o.ice_group, "ice_group"));
  ICE_RETURN_IF_ERROR(DeserializeDciParams(&r, &o.dci));
  ICE_RETURN_IF_ERROR(r.Get(&ps, "page_size"));
  ICE_RETURN_IF_ERROR(r.Get(&hd, "head_dim"));
  ICE_RETURN_IF_ERROR(r.Get(&dt, "dtype"));
  if (ps != pool->page_size() || hd != pool->head_dim() || dt != static_cast<int32_t>(pool->dtype()))
    return InvalidArgumentError("sequence wire form: page geometry (page_size " + std::to_string(ps) + ", head_dim " +
                                std::to_string(hd) + ", dtype " + std::to_string(dt) +
                                ") does not match the destination pool");
  ICE_ASSIGN_OR_RETURN(std::unique_ptr<SequenceCache> c, Create(o, pool));
  ICE_RETURN_IF_ERROR(r.Get(&c->n_, "num_tokens"));
  ICE_RETURN_IF_ERROR(r.Get(&c->sink_tokens_, "sink_tokens"));
  ICE_RETURN_IF_ERROR(r.Get(&c->window_start_, "window_start"));
  if (c->n_ < 0 || c->sink_tokens_ < 0 || c->sink_tokens_ > c->n_ || c->window_start_ < c->sink_tokens_ ||
      c->window_start_ > c->n_)
    return DataLossError("sequence wire form: inconsistent token counts");
  size_t used = 0;
  Status err;
  auto take = [&](std::vector<int32_t>* list, uint64_t count) -> Status {
    if (count > num_pages - used)
      return InvalidArgumentError("sequence wire form: needs more pages than the " + std::to_string(num_pages) + " given");
    list->assign(pages + used, pages + used + count);
    used += count;
    return Status::Ok();
  };
  for (size_t i = 0; i < c->heads_.size() && err.ok(); ++i) {
    HeadState& h = c->heads_[i];
    uint64_t ns = 0, nw = 0, nd = 0;
    uint8_t has_tree = 0;
    err = r.Get(&ns, "sink page count");
    if (err.ok()) err = r.Get(&nw, "window page count");
    if (err.ok()) err = r.Get(&nd, "dense page count");
    if (err.ok()) err = r.Get(&has_tree, "tree flag");
    if (err.ok()) err = take(&h.sink, ns);
    if (err.ok()) err = take(&h.window, nw);
    if (err.ok()) err = take(&h.dense, nd);
    if (err.ok() && has_tree) {
      size_t tree_pages = 0;
      auto tree = DciTree::Deserialize(&r, pool, pages + used, num_pages - used, &tree_pages);
      if (tree.ok()) {
        h.tree = std::move(tree).value();
        used += tree_pages;
      } else {
        err = tree.status();
      }
    }
  }
  if (err.ok() && !r.done()) err = DataLossError("sequence wire form: trailing bytes after the last head");
  if (err.ok()) err = c->CheckWireInvariants();
  if (err.ok() && used != num_pages)
    err = InvalidArgumentError("sequence wire form: " + std::to_string(num_pages) + " pages given, " +
                               std::to_string(used) + " described");
  if (!err.ok()) {
    // The caller keeps ownership of the pages: detach them before the cache is destroyed.
    for (HeadState& h : c->heads_) {
      h.sink.clear();
      h.window.clear();
      h.dense.clear();
      if (h.tree) h.tree->DetachPages();
    }
    return err;
  }
  return c;
}

StatusOr<std::unique_ptr<SequenceCache>> SequenceCache::Clone() const {
  // The wire form describes everything a decode continues from; copying the pages it lists into
  // fresh ones and reading the form back over them gives an independent cache.
  if (build_n_ >= 0) return FailedPreconditionError("SequenceCache::Clone: a layered build is in progress");
  ICE_ASSIGN_OR_RETURN(SequenceWire w, Serialize());
  std::vector<int32_t> dst;
  ICE_RETURN_IF_ERROR(
      pool_->AllocateMany(static_cast<int64_t>(w.pages.size()), &dst).WithContext("SequenceCache::Clone"));
  for (size_t i = 0; i < dst.size(); ++i) std::memcpy(pool_->PageK(dst[i]), pool_->PageK(w.pages[i]), pool_->page_bytes());
  auto c = Deserialize(w.metadata.data(), w.metadata.size(), dst.data(), dst.size(), pool_);
  if (!c.ok()) {
    pool_->FreeMany(dst).IgnoreError();
    return c.status().WithContext("SequenceCache::Clone");
  }
  (*c)->built_layers_ = built_layers_;
  return c;
}

}  // namespace icecache::kvstore
