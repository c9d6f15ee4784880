#include "kvstore/dci_index.h"

#include <algorithm>
#include <cmath>
#include <queue>

#include "kvstore/vector_ops.h"

namespace icecache::kvstore {

DciIndex::DciIndex(int dim, const float* directions, int num_simple, int num_composite)
    : dim_(dim), m_(num_simple), l_(num_composite),
      directions_(directions, directions + static_cast<size_t>(num_simple) * num_composite * dim),
      sorted_(static_cast<size_t>(num_simple) * num_composite) {}

void DciIndex::Clear() {
  ids_.clear();
  for (auto& s : sorted_) s.clear();
}

void DciIndex::Add(int32_t id, const float* x) {
  const int32_t slot = static_cast<int32_t>(ids_.size());
  ids_.push_back(id);
  for (size_t j = 0; j < sorted_.size(); ++j) {
    const float p = DotF32(directions_.data() + j * dim_, x, dim_);
    auto& s = sorted_[j];
    auto it = std::upper_bound(s.begin(), s.end(), p, [](float v, const Entry& e) { return v < e.proj; });
    s.insert(it, Entry{p, slot});
  }
}

void DciIndex::Candidates(const float* q, int max_candidates, std::vector<int32_t>* out) const {
  out->clear();
  const int n = size();
  if (n == 0 || max_candidates <= 0) return;
  max_candidates = std::min(max_candidates, n);
  // Cursor c = 2*j + side walks simple index j left (side 0) or right (side 1).
  const int num_idx = static_cast<int>(sorted_.size());
  std::vector<float> qproj(num_idx);
  std::vector<int> pos(2 * num_idx);
  for (int j = 0; j < num_idx; ++j) {
    qproj[j] = DotF32(directions_.data() + static_cast<size_t>(j) * dim_, q, dim_);
    const auto& s = sorted_[j];
    const int mid = static_cast<int>(std::lower_bound(s.begin(), s.end(), qproj[j],
                                                      [](const Entry& e, float v) { return e.proj < v; }) -
                                     s.begin());
    pos[2 * j] = mid - 1;
    pos[2 * j + 1] = mid;
  }
  using Item = std::pair<float, int>;  // (projection distance, cursor)
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  auto push = [&](int c) {
    const int j = c / 2, p = pos[c];
    const auto& s = sorted_[j];
    if (p < 0 || p >= n) return;
    heap.push({std::fabs(s[p].proj - qproj[j]), c});
  };
  for (int c = 0; c < 2 * num_idx; ++c) push(c);
  std::vector<uint16_t> counts(static_cast<size_t>(l_) * n, 0);
  std::vector<uint8_t> taken(n, 0);
  while (!heap.empty() && static_cast<int>(out->size()) < max_candidates) {
    const int c = heap.top().second;
    heap.pop();
    const int j = c / 2, composite = j / m_;
    const int32_t slot = sorted_[j][pos[c]].slot;
    pos[c] += (c % 2 == 0) ? -1 : 1;
    push(c);
    if (++counts[static_cast<size_t>(composite) * n + slot] == m_ && !taken[slot]) {
      taken[slot] = 1;
      out->push_back(ids_[slot]);
    }
  }
}

}  // namespace icecache::kvstore
