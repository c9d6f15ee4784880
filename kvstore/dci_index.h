// DciIndex: prioritized Dynamic Continuous Indexing (Li & Malik, 2017) over a growing point set,
// used by DciTree for parent search on large upper levels. L composite indices of m simple
// indices each; a simple index is the points sorted by their projection on one random unit
// direction. A query walks all simple indices outward from its own projection in order of
// projection distance; a point becomes a candidate once it has been met in all m simple indices
// of some composite index. Callers score candidates exactly.
//
// Thread safety: none (one owner). Not serialised: DciTree rebuilds it on demand.
#pragma once

#include <cstdint>
#include <vector>

namespace icecache::kvstore {

class DciIndex {
 public:
  // directions: [m * L, dim] unit vectors (copied).
  DciIndex(int dim, const float* directions, int num_simple, int num_composite);

  void Clear();
  // Adds point `id` with coordinates x [dim]. O(size) per add (sorted-vector insertion).
  void Add(int32_t id, const float* x);
  int size() const { return static_cast<int>(ids_.size()); }

  // Up to max_candidates ids in retrieval order (no duplicates).
  void Candidates(const float* q, int max_candidates, std::vector<int32_t>* out) const;

 private:
  struct Entry {
    float proj;
    int32_t slot;  // index into ids_
  };
  int dim_, m_, l_;
  std::vector<float> directions_;            // [m*L, dim]
  std::vector<int32_t> ids_;                 // [size]
  std::vector<std::vector<Entry>> sorted_;   // [m*L] each sorted by proj
};

}  // namespace icecache::kvstore
