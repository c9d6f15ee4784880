// Host→device page gather (docs/design.md §3 "Transfer"): a residency cache of a fixed number of device
// page slots. Each decode step the caller passes the host page ids it selected; only pages not
// already resident are copied, and the device slot of every requested page is returned, ready to
// be passed as PagedDecodeAttentionParams::page_ids with pages = device_pages().
//
// Eviction is least-recently-used over steps, and never evicts a page requested in the same step:
// one step may therefore need at most num_slots distinct pages (else RESOURCE_EXHAUSTED and the
// cache is unchanged). The residency bookkeeping is the same for every backend; the copy is a
// memcpy into a host staging area (Backend::kCpu) or, on Backend::kCuda, one gather kernel that
// reads the missing pages straight from the page-locked host pool (PinnedHostRegion) through its
// mapped address, followed by a synchronize (one cudaMemcpyAsync per page if the pool is pageable).
//
// A host page whose content changes (e.g. the window page that receives new tokens) must be
// Invalidate()d before the next Gather, or its stale device copy is used.
// Not thread-safe: one owner (one decode loop) per cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/device_buffer.h"

namespace icecache::kernels {

struct PageGatherStats {
  int64_t steps = 0;           // Gather calls that succeeded
  int64_t pages_requested = 0; // distinct pages over all steps
  int64_t hits = 0;            // distinct pages already resident
  int64_t pages_copied = 0;    // distinct pages copied host→device
  int64_t bytes_copied = 0;
  int64_t evictions = 0;       // resident pages displaced by a copy
};

// The backend-independent part: which host page lives in which slot, LRU order, and the copy
// plan of one step. Exposed for tests and for callers that copy by other means.
class PageResidency {
 public:
  explicit PageResidency(int num_slots);

  struct Copy {
    int64_t host_page;
    int32_t slot;
  };

  // Maps host_pages[i] → slots[i] (size count), marking them used this step; appends the copies
  // needed to *copies. RESOURCE_EXHAUSTED (state unchanged) if more than num_slots distinct pages.
  // INVALID_ARGUMENT on a negative page id.
  Status Assign(const int64_t* host_pages, int count, int32_t* slots, std::vector<Copy>* copies,
                PageGatherStats* stats);

  // Forgets a host page (its slot becomes the first to reuse). No-op if not resident.
  void Invalidate(int64_t host_page);
  void InvalidateAll();

  bool IsResident(int64_t host_page) const { return where_.count(host_page) != 0; }
  // The slot holding host_page, or -1 when it is not resident.
  int32_t SlotOf(int64_t host_page) const {
    auto it = where_.find(host_page);
    return it == where_.end() ? -1 : it->second->slot;
  }
  int resident_pages() const { return static_cast<int>(where_.size()); }
  int num_slots() const { return num_slots_; }

 private:
  struct Slot {
    int32_t slot;
    int64_t host_page;  // -1 when free
  };
  int num_slots_;
  std::list<Slot> lru_;  // front: most recently used; free slots sit at the back
  std::unordered_map<int64_t, std::list<Slot>::iterator> where_;
};

class PageResidencyCache {
 public:
  // num_slots device slots of page_bytes each on `backend` (kAuto resolved). INVALID_ARGUMENT on
  // non-positive sizes; FAILED_PRECONDITION / RESOURCE_EXHAUSTED as DeviceBuffer::Allocate.
  static StatusOr<std::unique_ptr<PageResidencyCache>> Create(Backend backend, int num_slots,
                                                              size_t page_bytes);

  // host_pool: host memory where host page p starts at host_pool + p * page_bytes (for the CUDA
  // backend, pinned memory makes the copies asynchronous DMA). Writes the device slot of
  // host_pages[i] into slots[i] (host memory, size count). Returns after the copies completed.
  Status Gather(const void* host_pool, const int64_t* host_pages, int count, int32_t* slots);
  Status Gather(const void* host_pool, const std::vector<int64_t>& host_pages,
                std::vector<int32_t>* slots);

  void Invalidate(int64_t host_page) { residency_.Invalidate(host_page); }
  void InvalidateAll() { residency_.InvalidateAll(); }

  // Base of the device slots: slot s starts at device_pages() + s * page_bytes().
  const void* device_pages() const { return buffer_.data(); }
  // The same, for writing a resident page's device copy in place (e.g. kernels::StoreKv of the
  // token a page receives, so the page stays valid instead of being copied again).
  void* mutable_device_pages() { return buffer_.data(); }
  size_t page_bytes() const { return page_bytes_; }
  Backend backend() const { return buffer_.backend(); }
  const PageResidency& residency() const { return residency_; }
  const PageGatherStats& stats() const { return stats_; }

 private:
  PageResidencyCache(DeviceBuffer buffer, int num_slots, size_t page_bytes)
      : buffer_(std::move(buffer)), page_bytes_(page_bytes), residency_(num_slots) {}

  DeviceBuffer buffer_;
  size_t page_bytes_;
  PageResidency residency_;
  PageGatherStats stats_;
  std::vector<PageResidency::Copy> copies_;
  std::vector<int64_t> copy_pages_;
  std::vector<int32_t> copy_slots_;
};

}  // namespace icecache::kernels
