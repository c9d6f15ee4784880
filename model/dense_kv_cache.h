// Exact dense attention over a paged KV cache held in the memory of one device (host memory for
// the CPU): the reference AttentionBackend (model/attention_backend.h).
//
// Page layout is kernels/attention.h's: one page holds page_size token slots of ONE (layer,
// kv-head), its K block [page_size, head_dim] followed by its V block [page_size, head_dim], in
// kv_dtype. Token at position p of a sequence lives, for every (layer, kv-head), in slot
// p % page_size of that (layer, kv-head)'s (p / page_size)-th page. Pages come from one pool
// (one contiguous device buffer that grows on demand up to max_pages) with a free list; the page
// tables stay on the host and each step's slot and page lists are uploaded in one copy.
// New K/V are written by kernels::StoreKv. Decode segments (one new token) go through
// kernels::PagedDecodeAttention over all of the sequence's pages, in one batched call per layer
// (one call per segment when prefill and decode segments are mixed in a step); longer segments
// (prefill) through kernels::PrefillAttention (K/V gathered from the pages by kernels::GatherKv
// when the sequence already had tokens).
//
// Not thread-safe (see the AttentionBackend contract).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/backend.h"
#include "kernels/device_buffer.h"
#include "kernels/dtype.h"
#include "kernels/kv_pages.h"
#include "model/attention_backend.h"

namespace icecache::model {

struct DenseKvCacheOptions {
  int page_size = kernels::kDefaultPageSize;
  kernels::DType kv_dtype = kernels::DType::kF32;
  int64_t max_pages = 0;  // pool limit in pages (0 = grow without limit)
  kernels::Device device;  // where the pages live and attention runs (the model's device)
};

class DenseKvCache final : public AttentionBackend {
 public:
  // REQUIRES: shape fields positive, num_q_heads % num_kv_heads == 0, options.page_size >= 1.
  DenseKvCache(const AttentionShape& shape, const DenseKvCacheOptions& options = {});

  const AttentionShape& shape() const override { return shape_; }
  kernels::Device device() const override { return device_; }
  Status AddSequence(SequenceId id) override;
  Status RemoveSequence(SequenceId id) override;
  bool HasSequence(SequenceId id) const override { return seqs_.count(id) > 0; }
  StatusOr<int> SequenceLength(SequenceId id) const override;
  Status BeginStep(std::span<const StepSegment> segments) override;
  Status Attend(int layer, const float* q, const float* k, const float* v, float* out) override;
  void EndStep(bool commit) override;

  // Copies the stored K and V of one sequence, layer and kv head as fp32 to host memory:
  // k, v [SequenceLength(id), head_dim]. For handing a prefilled sequence to another cache
  // (e.g. IceCache's tree build). NOT_FOUND / INVALID_ARGUMENT on a bad id, layer or head.
  Status ReadKv(SequenceId id, int layer, int kv_head, float* k, float* v) const;
  // The same for every kv head of a layer: k, v [SequenceLength(id), num_kv_heads, head_dim], the
  // layout SequenceCache::Build takes.
  Status ReadLayerKv(SequenceId id, int layer, float* k, float* v) const;

  // Pages currently allocated to sequences, and the pool's size in pages.
  int64_t pages_in_use() const { return pages_in_use_; }
  int64_t pool_pages() const { return pool_pages_; }
  // Bytes of one page (K and V blocks).
  size_t page_bytes() const;

 private:
  struct Sequence {
    int length = 0;
    // pages[layer * num_kv_heads + kv_head] = page ids in position order; all lists equally long.
    std::vector<std::vector<int32_t>> pages;
  };

  Status AllocatePage(int32_t* page);
  void FreePage(int32_t page);
  Status WriteNewKv(int layer, const float* k, const float* v);
  Status DecodeAttention(int layer, const float* q, float* out);
  Status PrefillSegmentAttention(int layer, size_t seg, const float* q, const float* k, const float* v, float* out);
  // Positions [0, len) of kv heads [first_head, first_head + num_heads) of one layer gathered into
  // gk_, gv_ as [len, num_heads, head_dim] fp32 (device memory).
  Status GatherHeads(const Sequence& s, int layer, int first_head, int num_heads, int len) const;
  // GatherHeads over the committed tokens, copied to host k, v.
  Status ReadHeads(SequenceId id, int layer, int first_head, int num_heads, float* k, float* v) const;
  // Uploads `count` int32 or int64 values to the given device buffer (grown as needed).
  template <typename T>
  Status Upload(const std::vector<T>& host, kernels::DeviceBuffer* buf) const;

  const AttentionShape shape_;
  const DenseKvCacheOptions options_;
  const kernels::Device device_;
  std::unordered_map<SequenceId, Sequence> seqs_;
  kernels::DeviceBuffer pool_;
  int64_t pool_pages_ = 0;
  int64_t pages_in_use_ = 0;
  std::vector<int32_t> free_pages_;

  // State of the step in progress.
  bool in_step_ = false;
  std::vector<StepSegment> step_;
  std::vector<Sequence*> step_seqs_;
  std::vector<int> step_row_;  // first step row of each segment
  std::vector<size_t> decode_segs_;  // segments with one token
  bool decode_rows_contiguous_ = false;

  // Host staging of the step's page lists ([indptr | ids | valid], one upload) and slot ids.
  std::vector<int32_t> lists_;
  std::vector<int64_t> slots_;
  // Device scratch.
  mutable kernels::DeviceBuffer lists_dev_, slots_dev_, gk_, gv_;
  mutable std::vector<int64_t> read_slots_;
};

}  // namespace icecache::model
