#include "kernels/page_gather.h"

#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/op_table.h"

namespace icecache::kernels {

PageResidency::PageResidency(int num_slots) : num_slots_(num_slots) {
  for (int s = 0; s < num_slots; ++s) lru_.push_back({s, -1});
}

Status PageResidency::Assign(const int64_t* host_pages, int count, int32_t* slots,
                             std::vector<Copy>* copies, PageGatherStats* stats) {
  // Distinct pages in order of first request, so LRU order within a step is deterministic.
  std::unordered_set<int64_t> seen;
  std::vector<int64_t> distinct;
  seen.reserve(count * 2);
  for (int i = 0; i < count; ++i) {
    if (host_pages[i] < 0) {
      return InvalidArgumentError("PageResidency: negative host page id " +
                                  std::to_string(host_pages[i]) + " at index " + std::to_string(i));
    }
    if (seen.insert(host_pages[i]).second) distinct.push_back(host_pages[i]);
  }
  if (static_cast<int64_t>(distinct.size()) > num_slots_) {
    return ResourceExhaustedError("page gather: this step needs " + std::to_string(distinct.size()) +
                                  " distinct pages but the device cache has only " +
                                  std::to_string(num_slots_) + " slots");
  }
  // Touch the resident pages first so that no victim below is a page this step needs.
  for (int64_t page : distinct) {
    auto it = where_.find(page);
    if (it == where_.end()) continue;
    lru_.splice(lru_.begin(), lru_, it->second);
    ++stats->hits;
  }
  for (int64_t page : distinct) {
    if (where_.count(page) != 0) continue;
    auto victim = std::prev(lru_.end());
    if (victim->host_page >= 0) {
      where_.erase(victim->host_page);
      ++stats->evictions;
    }
    victim->host_page = page;
    lru_.splice(lru_.begin(), lru_, victim);
    where_[page] = lru_.begin();
    copies->push_back({page, victim->slot});
  }
  for (int i = 0; i < count; ++i) slots[i] = where_.at(host_pages[i])->slot;
  stats->pages_requested += static_cast<int64_t>(distinct.size());
  return Status::Ok();
}

void PageResidency::Invalidate(int64_t host_page) {
  auto it = where_.find(host_page);
  if (it == where_.end()) return;
  it->second->host_page = -1;
  lru_.splice(lru_.end(), lru_, it->second);
  where_.erase(it);
}

void PageResidency::InvalidateAll() {
  for (Slot& s : lru_) s.host_page = -1;
  where_.clear();
}

StatusOr<std::unique_ptr<PageResidencyCache>> PageResidencyCache::Create(Backend backend,
                                                                         int num_slots,
                                                                         size_t page_bytes) {
  if (num_slots <= 0 || page_bytes == 0) {
    return InvalidArgumentError("PageResidencyCache: num_slots and page_bytes must be positive");
  }
  ICE_ASSIGN_OR_RETURN(DeviceBuffer buf,
                       DeviceBuffer::Allocate(backend, static_cast<size_t>(num_slots) * page_bytes));
  return std::unique_ptr<PageResidencyCache>(
      new PageResidencyCache(std::move(buf), num_slots, page_bytes));
}

Status PageResidencyCache::Gather(const void* host_pool, const int64_t* host_pages, int count,
                                  int32_t* slots) {
  if (count < 0 || (count > 0 && (host_pool == nullptr || host_pages == nullptr || slots == nullptr))) {
    return InvalidArgumentError("PageResidencyCache::Gather: null pointer or negative count");
  }
  copies_.clear();
  PageGatherStats delta;
  ICE_RETURN_IF_ERROR(residency_.Assign(host_pages, count, slots, &copies_, &delta));
  ICE_ASSIGN_OR_RETURN(const OpTable* table, GetOpTable(buffer_.backend()));
  copy_pages_.resize(copies_.size());
  copy_slots_.resize(copies_.size());
  for (size_t i = 0; i < copies_.size(); ++i) {
    copy_pages_[i] = copies_[i].host_page;
    copy_slots_[i] = copies_[i].slot;
  }
  Status s = table->gather_pages(buffer_.data(), host_pool, copy_pages_.data(), copy_slots_.data(),
                                 static_cast<int>(copies_.size()), page_bytes_);
  if (!s.ok()) {
    // The slots' contents are unknown now: forget what was planned so it is copied again.
    for (const auto& c : copies_) residency_.Invalidate(c.host_page);
    return s;
  }
  stats_.steps += 1;
  stats_.pages_requested += delta.pages_requested;
  stats_.hits += delta.hits;
  stats_.pages_copied += static_cast<int64_t>(copies_.size());
  stats_.bytes_copied += static_cast<int64_t>(copies_.size() * page_bytes_);
  stats_.evictions += delta.evictions;
  return Status::Ok();
}

Status PageResidencyCache::Gather(const void* host_pool, const std::vector<int64_t>& host_pages,
                                  std::vector<int32_t>* slots) {
  slots->resize(host_pages.size());
  return Gather(host_pool, host_pages.data(), static_cast<int>(host_pages.size()), slots->data());
}

}  // namespace icecache::kernels
