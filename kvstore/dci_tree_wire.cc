// DciTree wire form: all metadata, with pages referred to by their index in AllPages() order.
#include <mutex>
#include <string>

#include "kvstore/dci_tree.h"

namespace icecache::kvstore {
namespace {
constexpr uint32_t kTreeMagic = 0x45455254;  // "TREE"
constexpr uint64_t kMaxElems = uint64_t{1} << 34;
}  // namespace

// Field by field (a raw struct would carry its padding bytes, which are indeterminate).
void SerializeDciParams(const DciParams& p, WireWriter* w) {
  w->Put<int32_t>(p.num_simple);
  w->Put<int32_t>(p.num_composite);
  w->Put(p.p1);
  w->Put(p.p2);
  w->Put<int32_t>(p.top_level_max_nodes);
  w->Put<int32_t>(p.exact_parent_max_nodes);
  w->Put<int32_t>(p.dci_parent_candidates);
  w->Put<int32_t>(p.fov_min);
  w->Put(p.fov_fraction);
  w->Put(p.fov_sqrt);
  w->Put(p.group_fov);
  w->Put<uint8_t>(p.centroid_cells ? 1 : 0);
  w->Put(p.centroid_bonus);
  w->Put(p.cell_score_fraction);
  w->Put<uint8_t>(p.exhaustive_upper ? 1 : 0);
  w->Put<uint8_t>(p.bf16_parent_search ? 1 : 0);
  w->Put<uint8_t>(p.int8_parent_search ? 1 : 0);
  w->Put(p.promote_fraction);
  w->Put(p.norm_headroom);
  w->Put<uint64_t>(p.seed);
  w->Put<uint8_t>(static_cast<uint8_t>(p.leaf_layout));
}

Status DeserializeDciParams(WireReader* r, DciParams* p) {
  int32_t i32[6] = {};
  uint8_t flags[4] = {};
  ICE_RETURN_IF_ERROR(r->Get(&i32[0], "tree params num_simple"));
  ICE_RETURN_IF_ERROR(r->Get(&i32[1], "tree params num_composite"));
  ICE_RETURN_IF_ERROR(r->Get(&p->p1, "tree params p1"));
  ICE_RETURN_IF_ERROR(r->Get(&p->p2, "tree params p2"));
  ICE_RETURN_IF_ERROR(r->Get(&i32[2], "tree params top_level_max_nodes"));
  ICE_RETURN_IF_ERROR(r->Get(&i32[3], "tree params exact_parent_max_nodes"));
  ICE_RETURN_IF_ERROR(r->Get(&i32[4], "tree params dci_parent_candidates"));
  ICE_RETURN_IF_ERROR(r->Get(&i32[5], "tree params fov_min"));
  ICE_RETURN_IF_ERROR(r->Get(&p->fov_fraction, "tree params fov_fraction"));
  ICE_RETURN_IF_ERROR(r->Get(&p->fov_sqrt, "tree params fov_sqrt"));
  ICE_RETURN_IF_ERROR(r->Get(&p->group_fov, "tree params group_fov"));
  ICE_RETURN_IF_ERROR(r->Get(&flags[2], "tree params centroid_cells"));
  ICE_RETURN_IF_ERROR(r->Get(&p->centroid_bonus, "tree params centroid_bonus"));
  ICE_RETURN_IF_ERROR(r->Get(&p->cell_score_fraction, "tree params cell_score_fraction"));
  ICE_RETURN_IF_ERROR(r->Get(&flags[0], "tree params exhaustive_upper"));
  ICE_RETURN_IF_ERROR(r->Get(&flags[1], "tree params bf16_parent_search"));
  ICE_RETURN_IF_ERROR(r->Get(&flags[3], "tree params int8_parent_search"));
  ICE_RETURN_IF_ERROR(r->Get(&p->promote_fraction, "tree params promote_fraction"));
  ICE_RETURN_IF_ERROR(r->Get(&p->norm_headroom, "tree params norm_headroom"));
  ICE_RETURN_IF_ERROR(r->Get(&p->seed, "tree params seed"));
  uint8_t layout = 0;
  ICE_RETURN_IF_ERROR(r->Get(&layout, "tree params leaf_layout"));
  if (layout > 1) return DataLossError("sequence wire form: tree params leaf_layout " + std::to_string(layout) + " is unknown");
  p->leaf_layout = static_cast<LeafLayout>(layout);
  if (flags[0] > 1 || flags[1] > 1 || flags[2] > 1 || flags[3] > 1) return DataLossError("sequence wire form: tree params flag is not 0/1");
  p->num_simple = i32[0];
  p->num_composite = i32[1];
  p->top_level_max_nodes = i32[2];
  p->exact_parent_max_nodes = i32[3];
  p->dci_parent_candidates = i32[4];
  p->fov_min = i32[5];
  p->exhaustive_upper = flags[0] != 0;
  p->bf16_parent_search = flags[1] != 0;
  p->centroid_cells = flags[2] != 0;
  p->int8_parent_search = flags[3] != 0;
  return Status::Ok();
}

void DciTree::Serialize(WireWriter* w) const {
  w->Put(kTreeMagic);
  w->Put(kKvWireVersion);
  SerializeDciParams(params_, w);
  w->Put<int32_t>(num_payloads_);
  w->Put<int32_t>(dim_);
  w->Put<int32_t>(page_size_);
  w->Put(first_position_);
  w->Put(max_norm2_);
  w->Put(epoch_);
  w->Put(rng_state_);
  w->PutVector(directions_);
  w->PutVector(level_);
  w->PutVector(parent_);
  w->PutVector(node_cell_);
  w->PutVector(tok_leaf_);
  w->PutVector(tok_slot_);
  w->PutVector(norm2_);
  w->PutVector(proj_raw_);
  w->PutVector(order_proj_);
  w->Put<uint64_t>(level_nodes_.size());
  for (size_t l = 0; l < level_nodes_.size(); ++l) {
    w->PutVector(level_nodes_[l]);
    w->PutVector(level_keys_[l]);
  }
  w->PutVector(level_counts_);
  w->PutVector(leaf_valid_);
  w->PutVector(leaf_cell_);
  w->PutVector(leaf_tokens_);
  w->Put<uint64_t>(cells_.size());
  for (const Cell& c : cells_) {
    w->Put(c.owner);
    w->Put(c.epoch);
    w->Put(c.count);
    w->PutVector(c.leaves);
  }
  if (params_.centroid_cells) {
    std::lock_guard<std::mutex> lock(summaries_.mu);
    w->Put<int64_t>(summaries_.upto.load(std::memory_order_relaxed));
    w->PutVector(summaries_.sum);
    w->PutVector(summaries_.sumsq);
    w->PutVector(summaries_.count);
  }
}

StatusOr<std::unique_ptr<DciTree>> DciTree::Deserialize(WireReader* r, PagePool* pool, const int32_t* pages,
                                                        size_t num_pages, size_t* pages_used) {
  uint32_t magic = 0;
  ICE_RETURN_IF_ERROR(r->Get(&magic, "tree magic"));
  if (magic != kTreeMagic) return DataLossError("sequence wire form: bad tree magic");
  uint32_t version = 0;
  ICE_RETURN_IF_ERROR(r->Get(&version, "tree version"));
  if (version != kKvWireVersion)
    return InvalidArgumentError("sequence wire form: tree version " + std::to_string(version) +
                                " not supported (this build reads " + std::to_string(kKvWireVersion) +
                                "; forms before version 3 carry no tree version; what each version changed: docs/kvstore.md)");
  DciParams params;
  int32_t num_payloads = 0, dim = 0, page_size = 0;
  ICE_RETURN_IF_ERROR(DeserializeDciParams(r, &params));
  ICE_RETURN_IF_ERROR(ValidateDciParams(params).WithContext("sequence wire form"));
  ICE_RETURN_IF_ERROR(r->Get(&num_payloads, "tree num_payloads"));
  ICE_RETURN_IF_ERROR(r->Get(&dim, "tree head_dim"));
  ICE_RETURN_IF_ERROR(r->Get(&page_size, "tree page_size"));
  if (dim != pool->head_dim() || page_size != pool->page_size())
    return InvalidArgumentError("sequence wire form: tree geometry (page_size " + std::to_string(page_size) + ", head_dim " +
                                std::to_string(dim) + ") does not match the destination pool (" +
                                std::to_string(pool->page_size()) + ", " + std::to_string(pool->head_dim()) + ")");
  if (num_payloads < 1 || num_payloads > 64) return DataLossError("sequence wire form: bad tree num_payloads");
  std::unique_ptr<DciTree> t(new DciTree(params, pool, num_payloads));
  ICE_RETURN_IF_ERROR(r->Get(&t->first_position_, "tree first_position"));
  ICE_RETURN_IF_ERROR(r->Get(&t->max_norm2_, "tree max_norm2"));
  ICE_RETURN_IF_ERROR(r->Get(&t->epoch_, "tree epoch"));
  ICE_RETURN_IF_ERROR(r->Get(&t->rng_state_, "tree rng"));
  ICE_RETURN_IF_ERROR(r->GetVector(&t->directions_, "tree directions", kMaxElems));
  if (t->directions_.size() != static_cast<size_t>(params.num_simple) * params.num_composite * (dim + 1))
    return DataLossError("sequence wire form: tree directions have the wrong size");
  ICE_RETURN_IF_ERROR(r->GetVector(&t->level_, "tree levels", kMaxElems));
  const size_t n = t->level_.size();
  ICE_RETURN_IF_ERROR(r->GetVector(&t->parent_, "tree parents", kMaxElems));
  ICE_RETURN_IF_ERROR(r->GetVector(&t->node_cell_, "tree node cells", kMaxElems));
  ICE_RETURN_IF_ERROR(r->GetVector(&t->tok_leaf_, "tree token leaves", kMaxElems));
  ICE_RETURN_IF_ERROR(r->GetVector(&t->tok_slot_, "tree token slots", kMaxElems));
  ICE_RETURN_IF_ERROR(r->GetVector(&t->norm2_, "tree norms", kMaxElems));
  ICE_RETURN_IF_ERROR(r->GetVector(&t->proj_raw_, "tree projections", kMaxElems));
  ICE_RETURN_IF_ERROR(r->GetVector(&t->order_proj_, "tree order projections", kMaxElems));
  for (size_t sz : {t->parent_.size(), t->node_cell_.size(), t->tok_leaf_.size(), t->tok_slot_.size(), t->norm2_.size(),
                    t->proj_raw_.size(), t->order_proj_.size()})
    if (sz != n) return DataLossError("sequence wire form: tree per-token arrays disagree in length");
  uint64_t nlev = 0;
  ICE_RETURN_IF_ERROR(r->Get(&nlev, "tree level count"));
  if (nlev > 127) return DataLossError("sequence wire form: too many tree levels");
  t->level_nodes_.resize(nlev);
  t->level_keys_.resize(nlev);
  for (size_t l = 0; l < nlev; ++l) {
    ICE_RETURN_IF_ERROR(r->GetVector(&t->level_nodes_[l], "tree level nodes", kMaxElems));
    ICE_RETURN_IF_ERROR(r->GetVector(&t->level_keys_[l], "tree level keys", kMaxElems));
    if (t->level_keys_[l].size() != t->level_nodes_[l].size() * dim)
      return DataLossError("sequence wire form: tree level keys have the wrong size");
  }
  t->RebuildLevelRows();
  ICE_RETURN_IF_ERROR(r->GetVector(&t->level_counts_, "tree level counts", 128));
  ICE_RETURN_IF_ERROR(r->GetVector(&t->leaf_valid_, "tree leaf valid", kMaxElems));
  ICE_RETURN_IF_ERROR(r->GetVector(&t->leaf_cell_, "tree leaf cells", kMaxElems));
  ICE_RETURN_IF_ERROR(r->GetVector(&t->leaf_tokens_, "tree leaf tokens", kMaxElems));
  const size_t nl = t->leaf_valid_.size();
  if (t->leaf_cell_.size() != nl || t->leaf_tokens_.size() != nl * page_size)
    return DataLossError("sequence wire form: tree leaf arrays disagree in length");
  uint64_t nc = 0;
  ICE_RETURN_IF_ERROR(r->Get(&nc, "tree cell count"));
  if (nc > n + 1) return DataLossError("sequence wire form: more cells than tokens");
  t->cells_.resize(nc);
  for (Cell& c : t->cells_) {
    ICE_RETURN_IF_ERROR(r->Get(&c.owner, "cell owner"));
    ICE_RETURN_IF_ERROR(r->Get(&c.epoch, "cell epoch"));
    ICE_RETURN_IF_ERROR(r->Get(&c.count, "cell count"));
    ICE_RETURN_IF_ERROR(r->GetVector(&c.leaves, "cell leaves", kMaxElems));
  }
  if (params.centroid_cells) {
    CellSummaries& m = t->summaries_;
    int64_t upto = 0;
    ICE_RETURN_IF_ERROR(r->Get(&upto, "tree summaries token count"));
    ICE_RETURN_IF_ERROR(r->GetVector(&m.sum, "tree summaries sums", kMaxElems));
    ICE_RETURN_IF_ERROR(r->GetVector(&m.sumsq, "tree summaries squared norms", kMaxElems));
    ICE_RETURN_IF_ERROR(r->GetVector(&m.count, "tree summaries counts", kMaxElems));
    const size_t n1 = nlev > 1 ? t->level_nodes_[1].size() : 0;
    if (upto < 0 || static_cast<uint64_t>(upto) > n || m.count.size() > n1 || m.sumsq.size() != m.count.size() ||
        m.sum.size() != m.count.size() * static_cast<size_t>(dim))
      return DataLossError("sequence wire form: tree summaries have the wrong shape");
    int64_t total = 0;
    for (int32_t c : m.count) {
      if (c < 0) return DataLossError("sequence wire form: negative tree summary count");
      total += c;
    }
    if (total > upto) return DataLossError("sequence wire form: tree summaries count more tokens than they cover");
    m.upto.store(upto, std::memory_order_relaxed);
  }
  const size_t need = nl * num_payloads;
  if (num_pages < need)
    return InvalidArgumentError("sequence wire form: tree needs " + std::to_string(need) + " pages, " +
                                std::to_string(num_pages) + " given");
  // Index ranges are checked before the tree takes the pages: an error below must leave them with
  // the caller (the tree's destructor frees its leaf_pages_).
  for (int32_t v : t->tok_leaf_) if (v < 0 || static_cast<size_t>(v) >= nl) return DataLossError("sequence wire form: token leaf out of range");
  for (int32_t v : t->leaf_cell_) if (v < 0 || static_cast<size_t>(v) >= nc) return DataLossError("sequence wire form: leaf cell out of range");
  for (int32_t v : t->leaf_tokens_) if (v < -1 || v >= static_cast<int64_t>(n)) return DataLossError("sequence wire form: leaf token out of range");
  for (int32_t v : t->parent_) if (v < -1 || v >= static_cast<int64_t>(n)) return DataLossError("sequence wire form: parent out of range");
  for (int32_t v : t->node_cell_) if (v < -1 || v >= static_cast<int64_t>(nc)) return DataLossError("sequence wire form: node cell out of range");
  for (int8_t v : t->level_) if (v < 0 || static_cast<size_t>(v) >= t->level_counts_.size()) return DataLossError("sequence wire form: level out of range");
  if (t->level_nodes_.size() != t->level_counts_.size()) return DataLossError("sequence wire form: tree level lists disagree with the level counts");
  for (size_t l = 0; l < t->level_nodes_.size(); ++l) {
    // Level 0 (most tokens) keeps no list; every upper level lists exactly its nodes.
    if (static_cast<int64_t>(t->level_nodes_[l].size()) != (l == 0 ? 0 : t->level_counts_[l]))
      return DataLossError("sequence wire form: tree level " + std::to_string(l) + " lists the wrong number of nodes");
    for (int32_t v : t->level_nodes_[l])
      if (v < 0 || static_cast<size_t>(v) >= n || t->level_[v] != static_cast<int8_t>(l))
        return DataLossError("sequence wire form: tree level node out of range");
  }
  for (const Cell& c : t->cells_) {
    if (c.owner < -1 || c.owner >= static_cast<int64_t>(n)) return DataLossError("sequence wire form: cell owner out of range");
    for (int32_t leaf : c.leaves) if (leaf < 0 || static_cast<size_t>(leaf) >= nl) return DataLossError("sequence wire form: cell leaf out of range");
  }
  t->leaf_pages_.assign(pages, pages + need);
  *pages_used = need;
  Status inv = t->CheckInvariants();
  if (!inv.ok()) {
    t->leaf_pages_.clear();  // the caller still owns the pages
    return DataLossError("sequence wire form: tree fails its invariants: " + inv.message());
  }
  if (params.centroid_cells) t->FoldSummaries(nullptr, 0, true);  // rows from the shipped sums, then catch up
  t->MeanAllLeaves();                                               // from the shipped pages
  return t;
}

}  // namespace icecache::kvstore
