// DciTree construction, parent search, accessors, invariants and release.
#include "kvstore/dci_tree.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "kvstore/dci_index.h"
#include "kvstore/vector_ops.h"

namespace icecache::kvstore {
namespace {

std::string Num(double v) { return std::to_string(v); }
bool PositionLayout(LeafLayout l) { return l == LeafLayout::kPosition; }

}  // namespace

Status ValidateDciParams(const DciParams& p) {
  if (p.num_simple < 1 || p.num_simple > 64) return InvalidArgumentError("DciParams.num_simple must be in [1, 64], got " + Num(p.num_simple));
  if (p.num_composite < 1 || p.num_composite > 64)
    return InvalidArgumentError("DciParams.num_composite must be in [1, 64], got " + Num(p.num_composite));
  if (!(p.p1 > 0 && p.p1 <= 1)) return InvalidArgumentError("DciParams.p1 must be in (0, 1], got " + Num(p.p1));
  if (!(p.p2 > 0 && p.p2 < 1)) return InvalidArgumentError("DciParams.p2 must be in (0, 1), got " + Num(p.p2));
  if (p.top_level_max_nodes < 1) return InvalidArgumentError("DciParams.top_level_max_nodes must be >= 1");
  if (p.exact_parent_max_nodes < 0) return InvalidArgumentError("DciParams.exact_parent_max_nodes must be >= 0");
  if (p.dci_parent_candidates < 1) return InvalidArgumentError("DciParams.dci_parent_candidates must be >= 1");
  if (p.fov_min < 1) return InvalidArgumentError("DciParams.fov_min must be >= 1");
  if (!(p.fov_fraction >= 0 && p.fov_fraction <= 1))
    return InvalidArgumentError("DciParams.fov_fraction must be in [0, 1], got " + Num(p.fov_fraction));
  if (!(p.fov_sqrt >= 0 && p.fov_sqrt <= 1e6))
    return InvalidArgumentError("DciParams.fov_sqrt must be in [0, 1e6], got " + Num(p.fov_sqrt));
  if (!(p.group_fov >= 0 && p.group_fov <= 64))
    return InvalidArgumentError("DciParams.group_fov must be in [0, 64], got " + Num(p.group_fov));
  if (!(p.centroid_bonus >= 0 && p.centroid_bonus <= 100))
    return InvalidArgumentError("DciParams.centroid_bonus must be in [0, 100], got " + Num(p.centroid_bonus));
  if (!(p.cell_score_fraction > 0 && p.cell_score_fraction <= 1))
    return InvalidArgumentError("DciParams.cell_score_fraction must be in (0, 1], got " + Num(p.cell_score_fraction));
  if (!(p.promote_fraction >= 0 && p.promote_fraction < 1))
    return InvalidArgumentError("DciParams.promote_fraction must be in [0, 1), got " + Num(p.promote_fraction));
  if (!(p.norm_headroom >= 1)) return InvalidArgumentError("DciParams.norm_headroom must be >= 1, got " + Num(p.norm_headroom));
  if (static_cast<uint8_t>(p.leaf_layout) > 1)
    return InvalidArgumentError("DciParams.leaf_layout must be kProjection (0) or kPosition (1), got " +
                                std::to_string(static_cast<int>(p.leaf_layout)));
  if (PositionLayout(p.leaf_layout) && p.cell_score_fraction != 1)
    return InvalidArgumentError("DciParams.leaf_layout kPosition needs cell_score_fraction = 1 (a partial cell scan walks "
                                "leaves in projection order), got cell_score_fraction " + Num(p.cell_score_fraction));
  return Status::Ok();
}

StatusOr<DciParams> DciParamsPreset(const std::string& name) {
  if (name == "reference") return DciParams{};
  if (name == "tuned") return DciParams::Tuned();
  if (name == "flat") return DciParams::Flat();
  return InvalidArgumentError("DCI preset must be reference, tuned or flat, got '" + name + "'");
}

DciTree::DciTree(const DciParams& params, PagePool* pool, int num_payloads)
    : params_(params), pool_(pool), num_payloads_(num_payloads), dim_(pool->head_dim()),
      page_size_(pool->page_size()) {}

DciTree::~DciTree() { Release(); }

void DciTree::SetDirections() {
  const int nd = params_.num_simple * params_.num_composite, d1 = dim_ + 1;
  std::mt19937_64 rng(params_.seed);
  std::normal_distribution<float> g(0.f, 1.f);
  directions_.resize(static_cast<size_t>(nd) * d1);
  for (int j = 0; j < nd; ++j) {
    float* u = directions_.data() + static_cast<size_t>(j) * d1;
    double n2 = 0;
    for (int i = 0; i < d1; ++i) {
      u[i] = g(rng);
      n2 += double(u[i]) * u[i];
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(n2));
    for (int i = 0; i < d1; ++i) u[i] *= inv;
  }
  rng_state_ = params_.seed ^ 0x9e3779b97f4a7c15ull;
}

float DciTree::OrderProjection(int32_t t) const {
  return proj_raw_[t] + directions_[dim_] * AugExtra(norm2_[t]);
}

void DciTree::UpperAug(int32_t t, float* out) const {
  const int l = level_[t];
  const auto& nodes = level_nodes_[l];
  const size_t idx = std::lower_bound(nodes.begin(), nodes.end(), t) - nodes.begin();
  std::copy_n(level_keys_[l].data() + idx * dim_, dim_, out);
  out[dim_] = AugExtra(norm2_[t]);
}

StatusOr<std::unique_ptr<DciTree>> DciTree::Build(const DciParams& params, PagePool* pool, int num_payloads,
                                                  const TokenBlock& block) {
  ICE_RETURN_IF_ERROR(ValidateDciParams(params));
  if (pool == nullptr) return InvalidArgumentError("DciTree::Build: pool is null");
  if (num_payloads < 1 || num_payloads > 64)
    return InvalidArgumentError("DciTree::Build: num_payloads must be in [1, 64], got " + Num(num_payloads));
  if (pool->page_size() > 32767) return InvalidArgumentError("DciTree: page_size must be < 32768");
  if (block.count < 0) return InvalidArgumentError("DciTree::Build: negative token count");
  if (block.count > 0 && (block.keys == nullptr || block.values == nullptr || block.row_stride < static_cast<size_t>(pool->head_dim())))
    return InvalidArgumentError("DciTree::Build: keys/values missing or row_stride < head_dim");
  std::unique_ptr<DciTree> tree(new DciTree(params, pool, num_payloads));
  tree->SetDirections();
  tree->first_position_ = block.first_position;
  Status s = tree->BuildFrom(block);
  if (!s.ok()) return s;  // the destructor returns any pages taken
  return tree;
}

Status DciTree::BuildFrom(const TokenBlock& block) {
  const int n = block.count, d = dim_;
  if (n == 0) return Status::Ok();
  const float* keys = block.keys[0];
  const size_t stride = block.row_stride;
  level_.assign(n, 0);
  parent_.assign(n, -1);
  node_cell_.assign(n, -1);
  tok_leaf_.assign(n, -1);
  tok_slot_.assign(n, -1);
  norm2_.resize(n);
  proj_raw_.resize(n);
  order_proj_.resize(n);
  float mx = 0.f;
  for (int t = 0; t < n; ++t) {
    SelfAndCrossDotF32(keys + t * stride, directions_.data(), d, &norm2_[t], &proj_raw_[t]);
    mx = std::max(mx, norm2_[t]);
  }
  max_norm2_ = static_cast<float>(mx * params_.norm_headroom);

  // Level sizes, then a seeded random choice of which tokens go up.
  std::vector<int64_t> sizes{std::min<int64_t>(n, static_cast<int64_t>(std::ceil(n * params_.p1)))};
  while (sizes.back() > params_.top_level_max_nodes) {
    const int64_t next = static_cast<int64_t>(std::ceil(static_cast<double>(sizes.back()) * params_.p2));
    sizes.push_back(std::min(next, sizes.back() - 1));
  }
  const int top = static_cast<int>(sizes.size());
  std::vector<int32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(params_.seed + 1);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t idx = 0;
  level_counts_.assign(top + 1, 0);
  for (int l = top; l >= 1; --l) {
    for (int64_t c = 0; c < sizes[l - 1] && idx < n; ++c) level_[perm[idx++]] = static_cast<int8_t>(l);
  }
  level_nodes_.assign(top + 1, {});
  level_keys_.assign(top + 1, {});
  for (int t = 0; t < n; ++t) {
    const int l = level_[t];
    ++level_counts_[l];
    if (l == 0) continue;
    level_nodes_[l].push_back(t);
    const float* k = keys + t * stride;
    level_keys_[l].insert(level_keys_[l].end(), k, k + d);
  }
  while (level_counts_.size() > 1 && level_counts_.back() == 0) level_counts_.pop_back();
  RebuildLevelRows();

  // Parents: every level below the top attaches to the level above, in one batched search.
  std::vector<std::vector<int32_t>> by_level(top + 1);
  for (int t = 0; t < n; ++t) by_level[level_[t]].push_back(t);
  for (int l = num_levels() - 2; l >= 0; --l) AttachLevel(l, by_level[l], keys, stride);

  // Cells: the root cell holds the top level; every node with children owns one.
  cells_.clear();
  cells_.push_back(Cell{});
  // Each token's cell (cells numbered in order of their first child), then the children of every
  // cell gathered in token order (counting sort) and ordered by projection.
  std::vector<int32_t> cell_of(n);
  for (int t = 0; t < n; ++t) {
    int32_t cell = 0;
    if (parent_[t] >= 0) {
      int32_t& c = node_cell_[parent_[t]];
      if (c < 0) {
        c = static_cast<int32_t>(cells_.size());
        cells_.push_back(Cell{parent_[t], epoch_, 0, {}});
      }
      cell = c;
    }
    cell_of[t] = cell;
  }
  const size_t num_cells = cells_.size();
  std::vector<int32_t> start(num_cells + 1, 0);
  for (int t = 0; t < n; ++t) ++start[cell_of[t] + 1];
  for (size_t c = 0; c < num_cells; ++c) start[c + 1] += start[c];
  std::vector<int32_t> members(n), fill(start.begin(), start.end() - 1);
  for (int t = 0; t < n; ++t) members[fill[cell_of[t]]++] = t;
  int64_t total_leaves = 0;
  for (size_t c = 0; c < num_cells; ++c) total_leaves += (start[c + 1] - start[c] + page_size_ - 1) / page_size_;
  std::vector<int32_t> pages;
  ICE_RETURN_IF_ERROR(pool_->AllocateMany(total_leaves * num_payloads_, &pages)
                          .WithContext("DciTree::Build (" + std::to_string(n) + " tokens, " +
                                       std::to_string(total_leaves) + " leaves)"));
  leaf_pages_ = std::move(pages);
  leaf_valid_.assign(total_leaves, 0);
  leaf_cell_.assign(total_leaves, -1);
  leaf_tokens_.assign(total_leaves * page_size_, -1);
  int32_t next_leaf = 0;
  std::vector<std::pair<float, int32_t>> ch;  // (projection, token): sorted by both, as the cell's order
  const bool by_position = PositionLayout(params_.leaf_layout);
  for (size_t c = 0; c < num_cells; ++c) {
    ch.clear();
    for (int32_t i = start[c]; i < start[c + 1]; ++i) {
      const int32_t t = members[i];
      order_proj_[t] = OrderProjection(t);
      ch.emplace_back(order_proj_[t], t);
    }
    // members[] is in token order, so ch is too: the position layout keeps that order.
    if (!by_position) std::sort(ch.begin(), ch.end());
    const int64_t cnt = static_cast<int64_t>(ch.size());
    const int64_t nl = (cnt + page_size_ - 1) / page_size_;
    size_t pos = 0;
    for (int64_t i = 0; i < nl; ++i) {
      const int32_t leaf = next_leaf++;
      cells_[c].leaves.push_back(leaf);
      leaf_cell_[leaf] = static_cast<int32_t>(c);
      const int take = by_position ? static_cast<int>(std::min<int64_t>(page_size_, cnt - static_cast<int64_t>(pos)))
                            : static_cast<int>(cnt / nl + (i < cnt % nl ? 1 : 0));
      for (int s = 0; s < take; ++s, ++pos) {
        const int32_t t = ch[pos].second;
        leaf_tokens_[static_cast<size_t>(leaf) * page_size_ + s] = t;
        tok_leaf_[t] = leaf;
        tok_slot_[t] = static_cast<int16_t>(s);
      }
      leaf_valid_[leaf] = take;
    }
    cells_[c].count = static_cast<int32_t>(cnt);
  }
  // K/V into the pages in token order: the source rows stream in sequentially and each row lands
  // in its page with non-temporal stores (a page-order pass would gather the source at random).
  for (int t = 0; t < n; ++t) WriteToken(tok_leaf_[t], tok_slot_[t], block, t, /*stream=*/true);
  StoreFence();
  if (params_.centroid_cells) FoldSummaries(keys, stride, false);
  MeanAllLeaves();
  return Status::Ok();
}

void DciTree::ResetSummaries() {
  std::lock_guard<std::mutex> lock(summaries_.mu);
  CellSummaries& m = summaries_;
  m.upto.store(0, std::memory_order_release);
  m.sum.clear();
  m.sumsq.clear();
  m.count.clear();
  m.rows.clear();
  m.bonus.clear();
}

void DciTree::RefreshSummaries() const {
  if (summaries_.upto.load(std::memory_order_acquire) == size()) return;
  FoldSummaries(nullptr, 0, false);
}

void DciTree::FoldSummaries(const float* keys, size_t stride, bool all_rows) const {
  CellSummaries& m = summaries_;
  const int64_t n = size();
  std::lock_guard<std::mutex> lock(m.mu);
  const int64_t from = m.upto.load(std::memory_order_relaxed);
  if (from == n && !all_rows) return;
  const size_t rb = pool_->row_bytes(), d = static_cast<size_t>(dim_);
  static const std::vector<int32_t> kNone;
  const std::vector<int32_t>& l1 = level_nodes_.size() > 1 ? level_nodes_[1] : kNone;
  const size_t n1 = l1.size(), old_n1 = all_rows ? 0 : m.count.size();
  m.sum.resize(n1 * d, 0.f);
  m.sumsq.resize(n1, 0.0);
  m.count.resize(n1, 0);
  m.rows.resize(n1 * rb);
  m.bonus.resize(n1, 0.f);
  std::vector<uint8_t> dirty(n1, 0);
  for (size_t i = old_n1; i < n1; ++i) dirty[i] = 1;
  std::vector<float> key(d);
  std::vector<uint8_t> stored(keys != nullptr ? rb : 0);
  for (int64_t t = from; t < n; ++t) {
    const int32_t p = parent_[t];
    if (level_[t] != 0 || p < 0 || level_[p] != 1) continue;
    const size_t i = std::lower_bound(l1.begin(), l1.end(), p) - l1.begin();
    if (keys != nullptr) {  // the page's value: the key rounded to the pool dtype
      RowFromF32(pool_->dtype(), keys + static_cast<size_t>(t) * stride, stored.data(), dim_);
      RowToF32(pool_->dtype(), stored.data(), key.data(), dim_);
    } else {
      RowToF32(pool_->dtype(), pool_->KRow(leaf_page(tok_leaf_[t], 0), tok_slot_[t]), key.data(), dim_);
    }
    float* acc = m.sum.data() + i * d;
    for (size_t e = 0; e < d; ++e) acc[e] += key[e];
    m.sumsq[i] += DotF32(key.data(), key.data(), dim_);
    ++m.count[i];
    dirty[i] = 1;
  }
  std::vector<float> mean(d);
  for (size_t i = 0; i < n1; ++i) {
    if (!dirty[i]) continue;
    uint8_t* row = m.rows.data() + i * rb;
    const int c = m.count[i];
    if (c == 0) {
      std::copy_n(level_rows_[1].data() + i * rb, rb, row);
      m.bonus[i] = 0.f;
      continue;
    }
    const float inv = 1.f / static_cast<float>(c);
    for (size_t e = 0; e < d; ++e) mean[e] = m.sum[i * d + e] * inv;
    RowFromF32(pool_->dtype(), mean.data(), row, dim_);
    const double log_term = 2.0 * std::log(static_cast<double>(c));
    const double var = std::max(0.0, m.sumsq[i] / c - static_cast<double>(DotF32(mean.data(), mean.data(), dim_)));
    m.bonus[i] = static_cast<float>(std::sqrt(var) * std::sqrt(log_term / dim_));
  }
  m.upto.store(n, std::memory_order_release);
}

void DciTree::RebuildLevelRows() {
  const size_t rb = pool_->row_bytes();
  level_rows_.assign(level_keys_.size(), {});
  level_rows_i8_.assign(level_keys_.size(), {});
  for (size_t l = 0; l < level_keys_.size(); ++l) {
    const size_t rows = level_keys_[l].size() / dim_;
    level_rows_[l].resize(rows * rb);
    RowFromF32(pool_->dtype(), level_keys_[l].data(), level_rows_[l].data(), static_cast<int>(rows * dim_));
    for (size_t r = 0; r < rows; ++r) AppendUpperI8(static_cast<int>(l), level_rows_[l].data() + r * rb);
  }
}

void DciTree::AppendUpperI8(int level, const void* row) {
  RowBlocksI8& b = level_rows_i8_[level];
  if (b.dim == 0) b.Reset(dim_);
  std::vector<float> v(dim_);
  RowToF32(pool_->dtype(), row, v.data(), dim_);  // the values the exact rescoring scores
  b.Append(v.data());
}

void DciTree::WriteToken(int32_t leaf, int slot, const TokenBlock& block, int i, bool stream) {
  NoteWritten(leaf);
  auto write = stream ? StreamRowFromF32 : RowFromF32;
  for (int p = 0; p < num_payloads_; ++p) {
    const int32_t page = leaf_page(leaf, p);
    write(pool_->dtype(), block.keys[p] + static_cast<size_t>(i) * block.row_stride, pool_->KRow(page, slot), dim_);
    write(pool_->dtype(), block.values[p] + static_cast<size_t>(i) * block.row_stride, pool_->VRow(page, slot), dim_);
  }
}

void DciTree::RefreshLevelMatrix(int level, LevelMatrix* m, bool bf16) const {
  const auto& nodes = level_nodes_[level];
  const int nu = static_cast<int>(nodes.size());
  const int d = dim_, pairs = (d + 1) / 2;
  if (m->epoch == epoch_ && nu == m->rows && m->bf16 == bf16) return;
  if (m->epoch != epoch_ || nu > m->ld || m->bf16 != bf16) {
    // Re-layout with headroom so that nodes added by insertions only fill columns.
    m->ld = (nu + nu / 4 + 32 + 31) / 32 * 32;
    m->bf16 = bf16;
    if (bf16) {
      m->rows_t.clear();
      m->rows_p.assign(static_cast<size_t>(pairs) * m->ld, 0);
    } else {
      m->rows_p.clear();
      m->rows_t.assign(static_cast<size_t>(d) * m->ld, 0.f);
    }
    m->extra.assign(m->ld, -INFINITY);
    m->rows = 0;
    m->epoch = epoch_;
  }
  std::vector<uint32_t> packed(bf16 ? pairs : 0);
  for (int r = m->rows; r < nu; ++r) {
    const float* k = level_keys_[level].data() + static_cast<size_t>(r) * d;
    if (bf16) {
      packed[pairs - 1] = 0;  // an odd dim's pad half stays 0
      RowFromF32(kernels::DType::kBF16, k, packed.data(), d);
      for (int j = 0; j < pairs; ++j) m->rows_p[static_cast<size_t>(j) * m->ld + r] = packed[j];
    } else {
      for (int j = 0; j < d; ++j) m->rows_t[static_cast<size_t>(j) * m->ld + r] = k[j];
    }
    m->extra[r] = AugExtra(norm2_[nodes[r]]);
  }
  m->rows = nu;
}

DciIndex* DciTree::LevelIndex(int level) {
  if (static_cast<int>(level_index_.size()) <= level) level_index_.resize(level + 1);
  CachedIndex& c = level_index_[level];
  const auto& nodes = level_nodes_[level];
  const int d1 = dim_ + 1;
  if (!c.index || c.epoch != epoch_) {
    c.index = std::make_unique<DciIndex>(d1, directions_.data(), params_.num_simple, params_.num_composite);
    c.epoch = epoch_;
    c.rows = 0;
  }
  std::vector<float> a(d1);
  for (int r = c.rows; r < static_cast<int>(nodes.size()); ++r) {
    UpperAug(nodes[r], a.data());
    c.index->Add(r, a.data());
  }
  c.rows = static_cast<int>(nodes.size());
  return c.index.get();
}

int32_t DciTree::FindParent(int level, const float* aug) {
  const auto& nodes = level_nodes_[level];
  const auto& keys = level_keys_[level];
  const int nu = static_cast<int>(nodes.size());
  if (nu == 0) return -1;
  auto score = [&](int r) {
    return DotF32(keys.data() + static_cast<size_t>(r) * dim_, aug, dim_) +
           aug[dim_] * AugExtra(norm2_[nodes[r]]);
  };
  int best = 0;
  float best_s = -INFINITY;
  if (nu <= params_.exact_parent_max_nodes) {
    for (int r = 0; r < nu; ++r) {
      const float s = score(r);
      if (s > best_s) { best_s = s; best = r; }
    }
    return nodes[best];
  }
  // Prioritized DCI over the level's augmented keys. For an augmented key the query side of the
  // NN transform is the key itself.
  thread_local std::vector<int32_t> cand;
  LevelIndex(level)->Candidates(aug, params_.dci_parent_candidates, &cand);
  for (int32_t r : cand) {
    const float s = score(r);
    if (s > best_s || (s == best_s && r < best)) { best_s = s; best = r; }
  }
  return nodes[best];
}

void DciTree::Release() {
  if (!leaf_pages_.empty()) pool_->FreeMany(leaf_pages_).IgnoreError();
  leaf_pages_.clear();
  leaf_valid_.clear();
  leaf_cell_.clear();
  leaf_tokens_.clear();
  cells_.clear();
  level_.clear();
  parent_.clear();
  node_cell_.clear();
  tok_leaf_.clear();
  tok_slot_.clear();
  norm2_.clear();
  proj_raw_.clear();
  order_proj_.clear();
  level_nodes_.clear();
  level_keys_.clear();
  level_rows_.clear();
  level_rows_i8_.clear();
  level_counts_.clear();
  level_index_.clear();
  level1_matrix_ = LevelMatrix{};
  ResetSummaries();
  means_ = LeafMeans{};
}

std::vector<int64_t> DciTree::LeafPositions(int32_t leaf) const {
  std::vector<int64_t> out(leaf_valid_[leaf]);
  for (int s = 0; s < leaf_valid_[leaf]; ++s) out[s] = first_position_ + leaf_tokens_[static_cast<size_t>(leaf) * page_size_ + s];
  return out;
}

TokenLocation DciTree::Locate(int64_t position) const {
  const int64_t t = position - first_position_;
  return TokenLocation{tok_leaf_[t], tok_slot_[t]};
}

Status DciTree::CheckInvariants() const {
  const int64_t n = size();
  auto fail = [](const std::string& m) { return InternalError("DciTree invariant: " + m); };
  std::vector<uint8_t> seen(n, 0);
  int64_t total = 0;
  for (int32_t leaf = 0; leaf < num_leaves(); ++leaf) {
    const int v = leaf_valid_[leaf];
    if (v < 1 || v > page_size_) return fail("leaf " + std::to_string(leaf) + " has " + std::to_string(v) + " valid slots");
    for (int p = 0; p < num_payloads_; ++p)
      if (!pool_->IsAllocated(leaf_page(leaf, p))) return fail("leaf page not allocated in the pool");
    for (int s = 0; s < page_size_; ++s) {
      const int32_t t = leaf_tokens_[static_cast<size_t>(leaf) * page_size_ + s];
      if (s >= v) {
        if (t != -1) return fail("slot past valid holds a token");
        continue;
      }
      if (t < 0 || t >= n) return fail("slot holds an out-of-range token");
      if (seen[t]++) return fail("token " + std::to_string(t) + " in two slots");
      if (tok_leaf_[t] != leaf || tok_slot_[t] != s) return fail("token->(page, slot) map disagrees for token " + std::to_string(t));
      ++total;
    }
  }
  if (total != n) return fail("leaves hold " + std::to_string(total) + " tokens, tree has " + std::to_string(n));
  const bool by_position = PositionLayout(params_.leaf_layout);
  std::vector<int64_t> counts(level_counts_.size(), 0);
  for (int64_t t = 0; t < n; ++t) {
    if (level_[t] < 0 || level_[t] >= num_levels()) return fail("bad level");
    ++counts[level_[t]];
    const int32_t cell = leaf_cell_[tok_leaf_[t]];
    const int32_t owner = cells_[cell].owner;
    if (owner != parent_[t]) return fail("token " + std::to_string(t) + " sits in a cell not of its parent");
    if (parent_[t] >= 0 && level_[parent_[t]] != level_[t] + 1) return fail("parent not one level up");
    if (parent_[t] < 0 && level_[t] != num_levels() - 1) return fail("parentless token below the top level");
  }
  if (counts != level_counts_) return fail("level counts disagree");
  for (size_t c = 0; c < cells_.size(); ++c) {
    const Cell& cell = cells_[c];
    if (cell.owner >= 0 && node_cell_[cell.owner] != static_cast<int32_t>(c)) return fail("cell owner map disagrees");
    float prev = -INFINITY;
    int32_t prev_t = -1;
    int64_t cell_count = 0;
    for (int32_t leaf : cell.leaves) cell_count += leaf_valid_[leaf];
    if (cell_count != cell.count) return fail("cell child count disagrees");
    for (int32_t leaf : cell.leaves) {
      if (leaf_cell_[leaf] != static_cast<int32_t>(c)) return fail("leaf listed in a cell it does not belong to");
      for (int s = 0; s < leaf_valid_[leaf]; ++s) {
        const int32_t t = leaf_tokens_[static_cast<size_t>(leaf) * page_size_ + s];
        if (by_position) {
          if (t <= prev_t) return fail("cell " + std::to_string(c) + " leaves not in token order");
          prev_t = t;
          continue;
        }
        const float p = order_proj_[t];
        if (p < prev) return fail("cell " + std::to_string(c) + " leaves not in projection order");
        prev = p;
      }
    }
    if (params_.leaf_layout == LeafLayout::kPosition)
      for (size_t i = 0; i + 1 < cell.leaves.size(); ++i)
        if (leaf_valid_[cell.leaves[i]] != page_size_) return fail("cell " + std::to_string(c) + " has a partial leaf before its last");
    if (cell.epoch == epoch_) {
      for (int32_t leaf : cell.leaves)
        for (int s = 0; s < leaf_valid_[leaf]; ++s) {
          const int32_t t = leaf_tokens_[static_cast<size_t>(leaf) * page_size_ + s];
          if (std::fabs(order_proj_[t] - OrderProjection(t)) > 1e-3f * (1.f + std::fabs(order_proj_[t])))
            return fail("cached projection stale in an up-to-date cell");
        }
    }
  }
  return Status::Ok();
}

}  // namespace icecache::kvstore
