// PagePool: fixed-size KV pages in ONE contiguous host allocation.
//
// Page layout (the contract shared with kernels/attention.h PagedDecodeAttention): a page holds
// page_size token slots of one (layer, kv-head): its K block [page_size, head_dim] followed by its
// V block [page_size, head_dim], elements of `dtype`. Page p starts at element
// p * 2 * page_size * head_dim of base(). Which slots are valid is the owner's business (the
// kvstore keeps the valid slots of a page at its front).
//
// The whole pool is one allocation so that a transport can register it once (UCX memory map) and a
// kernel can index it by page id. With CUDA the allocation should be pinned host memory: pass an
// `alloc`/`free` pair (e.g. wrapping cudaHostAlloc/cudaFreeHost); the default is an aligned
// operator new (2 MiB aligned and madvise(MADV_HUGEPAGE) for pools of 2 MiB or more).
//
// Thread safety: Allocate/Free/accounting may be called concurrently from any thread. Writing a
// page's contents is the owner's responsibility (one owner per allocated page).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "kernels/dtype.h"
#include "kernels/kv_pages.h"

namespace icecache::kvstore {

// A decode worker's host pool, in pages, unless decode.pool_pages says otherwise (config and
// engine alike): 1 GiB at head_dim 64 in bf16, reserved as virtual memory, touched as pages fill.
inline constexpr int64_t kDefaultDecodePoolPages = 262144;

// Allocates `bytes` of host memory aligned to at least 64 bytes; returns nullptr on failure.
using HostAllocFn = void* (*)(size_t bytes, void* ctx);
using HostFreeFn = void (*)(void* ptr, size_t bytes, void* ctx);

struct PagePoolOptions {
  int page_size = kernels::kDefaultPageSize;  // token slots per page, >= 1
  int head_dim = 128;            // >= 1
  kernels::DType dtype = kernels::DType::kBF16;
  int64_t num_pages = 0;         // capacity, >= 1 (page ids are int32)
  HostAllocFn alloc = nullptr;   // both or neither; nullptr: aligned operator new
  HostFreeFn free = nullptr;
  void* alloc_ctx = nullptr;
  bool zero_fill = false;        // zero the allocation at creation
};

class PagePool {
 public:
  // INVALID_ARGUMENT for bad sizes; RESOURCE_EXHAUSTED if the host allocation fails.
  static StatusOr<std::unique_ptr<PagePool>> Create(const PagePoolOptions& options);
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // One free page id, or RESOURCE_EXHAUSTED ("page pool full: ...") when none is left.
  StatusOr<int32_t> Allocate();
  // n pages, all or nothing (appends them to *out). RESOURCE_EXHAUSTED leaves *out unchanged.
  Status AllocateMany(int64_t n, std::vector<int32_t>* out);
  // Returns a page to the free list. INVALID_ARGUMENT for an id out of range or not allocated
  // (double free); the pool stays consistent.
  Status Free(int32_t page);
  Status FreeMany(const std::vector<int32_t>& pages);
  bool IsAllocated(int32_t page) const;

  // Geometry (constant after creation).
  int page_size() const { return options_.page_size; }
  int head_dim() const { return options_.head_dim; }
  kernels::DType dtype() const { return options_.dtype; }
  size_t elem_bytes() const { return kernels::DTypeSize(options_.dtype); }
  size_t page_elems() const { return 2 * static_cast<size_t>(options_.page_size) * options_.head_dim; }
  size_t page_bytes() const { return page_elems() * elem_bytes(); }
  size_t row_bytes() const { return static_cast<size_t>(options_.head_dim) * elem_bytes(); }
  int64_t capacity_pages() const { return options_.num_pages; }
  size_t capacity_bytes() const { return page_bytes() * static_cast<size_t>(options_.num_pages); }

  // Accounting (a consistent snapshot under the lock).
  int64_t used_pages() const;
  int64_t free_pages() const;
  size_t used_bytes() const { return static_cast<size_t>(used_pages()) * page_bytes(); }
  size_t free_bytes() const { return static_cast<size_t>(free_pages()) * page_bytes(); }

  // Base of the allocation ([capacity_pages, 2, page_size, head_dim] elements of dtype()).
  void* base() { return base_; }
  const void* base() const { return base_; }
  // K block [page_size, head_dim] and V block of page p; REQUIRES 0 <= p < capacity_pages().
  void* PageK(int32_t p) { return static_cast<char*>(base_) + static_cast<size_t>(p) * page_bytes(); }
  const void* PageK(int32_t p) const {
    return static_cast<const char*>(base_) + static_cast<size_t>(p) * page_bytes();
  }
  void* PageV(int32_t p) { return static_cast<char*>(PageK(p)) + page_bytes() / 2; }
  const void* PageV(int32_t p) const { return static_cast<const char*>(PageK(p)) + page_bytes() / 2; }
  // Row `slot` of the K / V block of page p.
  void* KRow(int32_t p, int slot) { return static_cast<char*>(PageK(p)) + slot * row_bytes(); }
  void* VRow(int32_t p, int slot) { return static_cast<char*>(PageV(p)) + slot * row_bytes(); }
  const void* KRow(int32_t p, int slot) const { return static_cast<const char*>(PageK(p)) + slot * row_bytes(); }
  const void* VRow(int32_t p, int slot) const { return static_cast<const char*>(PageV(p)) + slot * row_bytes(); }

 private:
  explicit PagePool(const PagePoolOptions& options) : options_(options) {}

  const PagePoolOptions options_;
  void* base_ = nullptr;
  size_t alloc_bytes_ = 0;
  mutable std::mutex mu_;
  std::vector<int32_t> free_list_;  // guarded by mu_; LIFO
  std::vector<uint8_t> allocated_;  // guarded by mu_; [capacity_pages]
};

}  // namespace icecache::kvstore
