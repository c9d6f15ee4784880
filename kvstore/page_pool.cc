#include "kvstore/page_pool.h"

#include <cstring>
#include <new>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace icecache::kvstore {
namespace {
constexpr size_t kAlign = 64;
constexpr size_t kHugeAlign = size_t{2} << 20;

// Large pools are 2 MiB aligned and advised to use transparent huge pages: retrieval touches
// scattered pages, and 4 KiB mappings would cost a TLB miss per page visited.
void* DefaultAlloc(size_t bytes) {
  if (bytes < kHugeAlign) return ::operator new(bytes, std::align_val_t(kAlign), std::nothrow);
  const size_t rounded = (bytes + kHugeAlign - 1) / kHugeAlign * kHugeAlign;
  void* p = ::operator new(rounded, std::align_val_t(kHugeAlign), std::nothrow);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (p != nullptr) madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

void DefaultFree(void* p, size_t bytes) {
  if (bytes < kHugeAlign) {
    ::operator delete(p, std::align_val_t(kAlign));
  } else {
    ::operator delete(p, std::align_val_t(kHugeAlign));
  }
}
}  // namespace

StatusOr<std::unique_ptr<PagePool>> PagePool::Create(const PagePoolOptions& options) {
  if (options.page_size < 1 || options.page_size > 4096)
    return InvalidArgumentError("PagePool: page_size must be in [1, 4096], got " + std::to_string(options.page_size));
  if (options.head_dim < 1 || options.head_dim > 65536)
    return InvalidArgumentError("PagePool: head_dim must be in [1, 65536], got " + std::to_string(options.head_dim));
  if (options.num_pages < 1 || options.num_pages > INT32_MAX)
    return InvalidArgumentError("PagePool: num_pages must be in [1, 2^31-1], got " + std::to_string(options.num_pages));
  if ((options.alloc == nullptr) != (options.free == nullptr))
    return InvalidArgumentError("PagePool: alloc and free hooks must be given together");
  std::unique_ptr<PagePool> pool(new PagePool(options));
  const size_t bytes = pool->capacity_bytes();
  if (options.alloc != nullptr) {
    pool->base_ = options.alloc(bytes, options.alloc_ctx);
  } else {
    pool->base_ = DefaultAlloc(bytes);
  }
  if (pool->base_ == nullptr)
    return ResourceExhaustedError("PagePool: cannot allocate " + std::to_string(bytes) + " bytes of host memory for " +
                                  std::to_string(options.num_pages) + " pages");
  pool->alloc_bytes_ = bytes;
  if (options.zero_fill) std::memset(pool->base_, 0, bytes);
  pool->free_list_.resize(options.num_pages);
  // LIFO free list handing out low ids first.
  for (int64_t i = 0; i < options.num_pages; ++i) pool->free_list_[i] = static_cast<int32_t>(options.num_pages - 1 - i);
  pool->allocated_.assign(options.num_pages, 0);
  return pool;
}

PagePool::~PagePool() {
  if (base_ == nullptr) return;
  if (options_.free != nullptr) {
    options_.free(base_, alloc_bytes_, options_.alloc_ctx);
  } else {
    DefaultFree(base_, alloc_bytes_);
  }
}

StatusOr<int32_t> PagePool::Allocate() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_list_.empty())
    return ResourceExhaustedError("page pool full: all " + std::to_string(options_.num_pages) + " pages (" +
                                  std::to_string(capacity_bytes()) + " bytes) are in use");
  const int32_t p = free_list_.back();
  free_list_.pop_back();
  allocated_[p] = 1;
  return p;
}

Status PagePool::AllocateMany(int64_t n, std::vector<int32_t>* out) {
  if (n < 0) return InvalidArgumentError("PagePool::AllocateMany: negative count");
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(free_list_.size()) < n)
    return ResourceExhaustedError("page pool full: " + std::to_string(n) + " pages requested, " +
                                  std::to_string(free_list_.size()) + " of " + std::to_string(options_.num_pages) +
                                  " free (" + std::to_string(page_bytes()) + " bytes per page)");
  out->reserve(out->size() + n);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = free_list_.back();
    free_list_.pop_back();
    allocated_[p] = 1;
    out->push_back(p);
  }
  return Status::Ok();
}

Status PagePool::Free(int32_t page) {
  std::lock_guard<std::mutex> lock(mu_);
  if (page < 0 || page >= options_.num_pages)
    return InvalidArgumentError("PagePool::Free: page id " + std::to_string(page) + " out of range [0, " +
                                std::to_string(options_.num_pages) + ")");
  if (!allocated_[page]) return InvalidArgumentError("PagePool::Free: page " + std::to_string(page) + " is not allocated");
  allocated_[page] = 0;
  free_list_.push_back(page);
  return Status::Ok();
}

Status PagePool::FreeMany(const std::vector<int32_t>& pages) {
  Status first;
  for (int32_t p : pages) {
    Status s = Free(p);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

bool PagePool::IsAllocated(int32_t page) const {
  std::lock_guard<std::mutex> lock(mu_);
  return page >= 0 && page < options_.num_pages && allocated_[page];
}

int64_t PagePool::used_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_.num_pages - static_cast<int64_t>(free_list_.size());
}

int64_t PagePool::free_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_list_.size());
}

}  // namespace icecache::kvstore
