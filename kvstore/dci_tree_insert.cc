// DciTree insertion: parent search, joining a cell in projection order, leaf splits, re-keying.
#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <string>

#include "kvstore/dci_tree.h"
#include "kvstore/vector_ops.h"

namespace icecache::kvstore {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

Status DciTree::Insert(const TokenBlock& block, std::vector<int32_t>* written_pages) {
  if (written_pages == nullptr) {
    Status s = InsertBlock(block);
    RefreshDirtyMeans();
    return s;
  }
  written_pages->clear();
  written_ = written_pages;
  Status s = InsertBlock(block);
  RefreshDirtyMeans();
  written_ = nullptr;
  std::sort(written_pages->begin(), written_pages->end());
  written_pages->erase(std::unique(written_pages->begin(), written_pages->end()), written_pages->end());
  return s;
}

void DciTree::NoteWritten(int32_t leaf) {
  means_.dirty.push_back(leaf);
  if (written_ == nullptr) return;
  for (int p = 0; p < num_payloads_; ++p) written_->push_back(leaf_page(leaf, p));
}

Status DciTree::InsertBlock(const TokenBlock& block) {
  if (block.count < 0) return InvalidArgumentError("DciTree::Insert: negative token count");
  if (block.count == 0) return Status::Ok();
  if (block.keys == nullptr || block.values == nullptr || block.row_stride < static_cast<size_t>(dim_))
    return InvalidArgumentError("DciTree::Insert: keys/values missing or row_stride < head_dim");
  if (block.first_position != end_position())
    return InvalidArgumentError("DciTree::Insert: block starts at position " + std::to_string(block.first_position) +
                                " but the tree ends at " + std::to_string(end_position()));
  int i = 0;
  // The first token of an empty tree founds the top level on its own.
  for (; i < block.count && (size() == 0 || num_levels() < 2); ++i) ICE_RETURN_IF_ERROR(InsertOne(block, i));
  if (i == block.count) return Status::Ok();
  // Batch the rest: one re-key for the block's largest norm, levels drawn up front, and one
  // batched exact parent search against level 1 as it stands at the start of the block (a node
  // promoted inside the block attracts tokens from the next block on).
  const int rest = block.count - i;
  const size_t stride = block.row_stride;
  const float* keys = block.keys[0] + static_cast<size_t>(i) * stride;
  std::vector<float> n2(rest), extra(rest);
  float mx = 0.f;
  for (int j = 0; j < rest; ++j) {
    n2[j] = DotF32(keys + j * stride, keys + j * stride, dim_);
    mx = std::max(mx, n2[j]);
  }
  if (mx > max_norm2_) Rekey(static_cast<float>(mx * params_.norm_headroom));
  std::vector<int> levels(rest, 0);
  for (int j = 0; j < rest; ++j) {
    const double u = static_cast<double>(SplitMix64(&rng_state_) >> 11) * 0x1.0p-53;
    if (u < params_.promote_fraction) levels[j] = 1;
  }
  std::vector<int32_t> parents(rest, -1);
  const int nu = static_cast<int>(level_nodes_[1].size());
  if (nu > 0 && nu <= params_.exact_parent_max_nodes) {
    const bool bf16 = params_.bf16_parent_search;
    RefreshLevelMatrix(1, &level1_matrix_, bf16);
    for (int j = 0; j < rest; ++j) extra[j] = AugExtra(n2[j]);
    if (bf16) {
      const int pairs = (dim_ + 1) / 2;
      std::vector<uint32_t> xs(static_cast<size_t>(rest) * pairs, 0);
      for (int j = 0; j < rest; ++j)
        RowFromF32(kernels::DType::kBF16, keys + j * stride, xs.data() + static_cast<size_t>(j) * pairs, dim_);
      ArgmaxAugDotBf16(xs.data(), extra.data(), rest, level1_matrix_.rows_p.data(), level1_matrix_.ld,
                       level1_matrix_.extra.data(), nu, pairs, parents.data());
    } else {
      ArgmaxAugDot(keys, stride, extra.data(), rest, level1_matrix_.rows_t.data(), level1_matrix_.ld,
                   level1_matrix_.extra.data(), nu, dim_, parents.data());
    }
    for (int j = 0; j < rest; ++j) parents[j] = level_nodes_[1][parents[j]];
  } else {
    std::vector<float> aug(dim_ + 1);
    for (int j = 0; j < rest; ++j) {
      if (levels[j] != 0) continue;
      std::copy_n(keys + j * stride, dim_, aug.data());
      aug[dim_] = AugExtra(n2[j]);
      parents[j] = FindParent(1, aug.data());
    }
  }
  for (int j = 0; j < rest; ++j) ICE_RETURN_IF_ERROR(InsertOne(block, i + j, levels[j], levels[j] == 0 ? parents[j] : -2));
  return Status::Ok();
}

void DciTree::AddUpperNode(int level, int32_t t, const float* key) {
  if (static_cast<int>(level_nodes_.size()) <= level) {
    level_nodes_.resize(level + 1);
    level_keys_.resize(level + 1);
  }
  if (static_cast<int>(level_rows_.size()) <= level) level_rows_.resize(level + 1);
  if (static_cast<int>(level_rows_i8_.size()) <= level) level_rows_i8_.resize(level + 1);
  level_nodes_[level].push_back(t);  // t is the largest index so far: the list stays sorted
  level_keys_[level].insert(level_keys_[level].end(), key, key + dim_);
  const size_t rb = pool_->row_bytes();
  level_rows_[level].resize(level_rows_[level].size() + rb);
  uint8_t* row = level_rows_[level].data() + level_rows_[level].size() - rb;
  RowFromF32(pool_->dtype(), key, row, dim_);
  AppendUpperI8(level, row);
}

void DciTree::Rekey(float new_max_norm2) {
  max_norm2_ = new_max_norm2;
  ++epoch_;  // cells re-sort lazily (ResortCell) when an insertion next touches them
}

int32_t DciTree::CellOf(int32_t node) {
  if (node_cell_[node] < 0) {
    node_cell_[node] = static_cast<int32_t>(cells_.size());
    cells_.push_back(Cell{node, epoch_, 0, {}});
  }
  return node_cell_[node];
}

Status DciTree::InsertOne(const TokenBlock& block, int i, int forced_level, int32_t known_parent) {
  const float* k = block.keys[0] + static_cast<size_t>(i) * block.row_stride;
  const float n2 = DotF32(k, k, dim_);
  const bool empty = size() == 0;
  if (empty) {
    max_norm2_ = static_cast<float>(n2 * params_.norm_headroom);
  } else if (n2 > max_norm2_) {
    Rekey(static_cast<float>(n2 * params_.norm_headroom));
  }
  std::vector<float> aug(k, k + dim_);
  aug.push_back(AugExtra(n2));

  int level = 0;
  int32_t parent = -1;
  if (empty || num_levels() < 2) {
    level = 1;  // the first token becomes the (single) top-level node
  } else if (forced_level >= 0) {
    level = forced_level;
  } else {
    const double u = static_cast<double>(SplitMix64(&rng_state_) >> 11) * 0x1.0p-53;
    if (u < params_.promote_fraction) level = 1;
  }
  if (level == 0) {
    parent = known_parent >= 0 ? known_parent : FindParent(1, aug.data());
  } else if (num_levels() > 2) {
    parent = FindParent(2, aug.data());
  }
  if (cells_.empty()) cells_.push_back(Cell{-1, epoch_, 0, {}});
  const int32_t cell = parent >= 0 ? CellOf(parent) : 0;

  const int32_t t = static_cast<int32_t>(size());
  level_.push_back(static_cast<int8_t>(level));
  parent_.push_back(parent);
  node_cell_.push_back(-1);
  tok_leaf_.push_back(-1);
  tok_slot_.push_back(-1);
  norm2_.push_back(n2);
  proj_raw_.push_back(DotF32(directions_.data(), k, dim_));
  order_proj_.push_back(0.f);
  Status s = InsertIntoCell(cell, t, block, i);
  if (!s.ok()) {  // out of pages: undo the token
    level_.pop_back();
    parent_.pop_back();
    node_cell_.pop_back();
    tok_leaf_.pop_back();
    tok_slot_.pop_back();
    norm2_.pop_back();
    proj_raw_.pop_back();
    order_proj_.pop_back();
    return s;
  }
  if (static_cast<int>(level_counts_.size()) <= level) level_counts_.resize(level + 1, 0);
  ++level_counts_[level];
  if (level >= 1) AddUpperNode(level, t, k);
  return Status::Ok();
}

int32_t DciTree::NewLeaf(int32_t cell, const int32_t* pages) {
  const int32_t leaf = num_leaves();
  leaf_pages_.insert(leaf_pages_.end(), pages, pages + num_payloads_);
  leaf_valid_.push_back(0);
  leaf_cell_.push_back(cell);
  leaf_tokens_.resize(leaf_tokens_.size() + page_size_, -1);
  return leaf;
}

void DciTree::MoveSlot(int32_t from_leaf, int from_slot, int32_t to_leaf, int to_slot) {
  const size_t rb = pool_->row_bytes();
  for (int p = 0; p < num_payloads_; ++p) {
    const int32_t fp = leaf_page(from_leaf, p), tp = leaf_page(to_leaf, p);
    std::memmove(pool_->KRow(tp, to_slot), pool_->KRow(fp, from_slot), rb);
    std::memmove(pool_->VRow(tp, to_slot), pool_->VRow(fp, from_slot), rb);
  }
  NoteWritten(to_leaf);
  means_.dirty.push_back(from_leaf);  // its page is unchanged, its contents not
  const int32_t t = leaf_tokens_[static_cast<size_t>(from_leaf) * page_size_ + from_slot];
  leaf_tokens_[static_cast<size_t>(to_leaf) * page_size_ + to_slot] = t;
  leaf_tokens_[static_cast<size_t>(from_leaf) * page_size_ + from_slot] = -1;
  tok_leaf_[t] = to_leaf;
  tok_slot_[t] = static_cast<int16_t>(to_slot);
}

Status DciTree::InsertIntoCell(int32_t cell_id, int32_t t, const TokenBlock& block, int i) {
  if (cells_[cell_id].epoch != epoch_) ResortCell(cell_id);
  const float op = OrderProjection(t);
  order_proj_[t] = op;
  Cell& cell = cells_[cell_id];
  if (params_.leaf_layout == LeafLayout::kPosition) {
    // Token order: t is the newest token, so it goes after everything in the cell.
    if (cell.leaves.empty() || leaf_valid_[cell.leaves.back()] == page_size_) {
      std::vector<int32_t> pages;
      ICE_RETURN_IF_ERROR(pool_->AllocateMany(num_payloads_, &pages).WithContext("DciTree::Insert"));
      const int32_t nl = NewLeaf(cell_id, pages.data());
      cells_[cell_id].leaves.push_back(nl);
    }
    const int32_t leaf = cells_[cell_id].leaves.back();
    const int slot = leaf_valid_[leaf];
    WriteToken(leaf, slot, block, i);
    leaf_tokens_[static_cast<size_t>(leaf) * page_size_ + slot] = t;
    tok_leaf_[t] = leaf;
    tok_slot_[t] = static_cast<int16_t>(slot);
    ++leaf_valid_[leaf];
    ++cells_[cell_id].count;
    return Status::Ok();
  }
  // Target leaf: the first whose last projection exceeds op (else the last leaf).
  size_t li = 0;
  if (!cell.leaves.empty()) {
    li = std::partition_point(cell.leaves.begin(), cell.leaves.end(),
                              [&](int32_t leaf) { return LeafLastProj(leaf) <= op; }) -
         cell.leaves.begin();
    li = std::min(li, cell.leaves.size() - 1);
  }
  const bool need_page = cell.leaves.empty() || leaf_valid_[cell.leaves[li]] == page_size_;
  std::vector<int32_t> pages;
  if (need_page) {
    ICE_RETURN_IF_ERROR(pool_->AllocateMany(num_payloads_, &pages).WithContext("DciTree::Insert"));
  }
  if (cell.leaves.empty()) {
    cell.leaves.push_back(NewLeaf(cell_id, pages.data()));
    li = 0;
  }
  int32_t leaf = cell.leaves[li];
  int valid = leaf_valid_[leaf];
  const int32_t* slots = &leaf_tokens_[static_cast<size_t>(leaf) * page_size_];
  int pos = static_cast<int>(std::partition_point(slots, slots + valid, [&](int32_t x) { return order_proj_[x] <= op; }) - slots);
  if (valid == page_size_) {
    // Split half/half: the upper half moves to a new leaf placed right after this one.
    const int32_t nl = NewLeaf(cell_id, pages.data());
    const int h = page_size_ / 2;
    for (int s = h; s < page_size_; ++s) MoveSlot(leaf, s, nl, s - h);
    leaf_valid_[leaf] = h;
    leaf_valid_[nl] = page_size_ - h;
    cells_[cell_id].leaves.insert(cells_[cell_id].leaves.begin() + li + 1, nl);
    if (pos > h) {
      leaf = nl;
      pos -= h;
    }
    valid = leaf_valid_[leaf];
  }
  for (int s = valid - 1; s >= pos; --s) MoveSlot(leaf, s, leaf, s + 1);
  WriteToken(leaf, pos, block, i);
  leaf_tokens_[static_cast<size_t>(leaf) * page_size_ + pos] = t;
  tok_leaf_[t] = leaf;
  tok_slot_[t] = static_cast<int16_t>(pos);
  ++leaf_valid_[leaf];
  ++cells_[cell_id].count;
  return Status::Ok();
}

void DciTree::ResortCell(int32_t cell_id) {
  Cell& cell = cells_[cell_id];
  cell.epoch = epoch_;
  std::vector<int32_t> toks;
  toks.reserve(cell.count);
  for (int32_t leaf : cell.leaves)
    for (int s = 0; s < leaf_valid_[leaf]; ++s) toks.push_back(leaf_tokens_[static_cast<size_t>(leaf) * page_size_ + s]);
  for (int32_t t : toks) order_proj_[t] = OrderProjection(t);
  if (params_.leaf_layout == LeafLayout::kPosition) return;  // token order stands: nothing moves
  std::vector<int32_t> sorted = toks;
  std::stable_sort(sorted.begin(), sorted.end(), [&](int32_t a, int32_t b) { return order_proj_[a] < order_proj_[b]; });
  if (sorted == toks) return;
  // Copy the cell's rows out, then write them back in the new order into the same leaves.
  const size_t rb = pool_->row_bytes();
  std::vector<char> kbuf(toks.size() * rb * num_payloads_), vbuf(kbuf.size());
  for (size_t j = 0; j < toks.size(); ++j) {
    const int32_t t = toks[j];
    for (int p = 0; p < num_payloads_; ++p) {
      const int32_t page = leaf_page(tok_leaf_[t], p);
      std::memcpy(kbuf.data() + (j * num_payloads_ + p) * rb, pool_->KRow(page, tok_slot_[t]), rb);
      std::memcpy(vbuf.data() + (j * num_payloads_ + p) * rb, pool_->VRow(page, tok_slot_[t]), rb);
    }
  }
  std::vector<size_t> src(toks.size());  // position in toks of each token of `sorted`
  {
    std::vector<size_t> order(toks.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return order_proj_[toks[a]] < order_proj_[toks[b]]; });
    src = order;
  }
  size_t j = 0;
  for (int32_t leaf : cell.leaves) {
    NoteWritten(leaf);
    for (int s = 0; s < leaf_valid_[leaf]; ++s, ++j) {
      const size_t from = src[j];
      const int32_t t = toks[from];
      for (int p = 0; p < num_payloads_; ++p) {
        const int32_t page = leaf_page(leaf, p);
        std::memcpy(pool_->KRow(page, s), kbuf.data() + (from * num_payloads_ + p) * rb, rb);
        std::memcpy(pool_->VRow(page, s), vbuf.data() + (from * num_payloads_ + p) * rb, rb);
      }
      leaf_tokens_[static_cast<size_t>(leaf) * page_size_ + s] = t;
      tok_leaf_[t] = leaf;
      tok_slot_[t] = static_cast<int16_t>(s);
    }
  }
}

}  // namespace icecache::kvstore
