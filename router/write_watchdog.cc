#include "router/write_watchdog.h"

#include <algorithm>

namespace icecache::router {

WriteWatchdog::WriteWatchdog(double timeout_seconds)
    : timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, timeout_seconds)))) {
  if (timeout_seconds > 0) thread_ = std::thread([this] { Loop(); });
}

WriteWatchdog::~WriteWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool WriteWatchdog::Guard(const std::function<bool()>& write, const std::function<void()>& cancel) {
  if (!thread_.joinable()) return write();
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
    // Every write has the same timeout, so the earliest deadline is always the oldest entry.
    pending_.emplace(id, Pending{Clock::now() + timeout_, &cancel});
  }
  cv_.notify_all();
  const bool ok = write();
  {
    // The watchdog calls cancel under mu_, so once the entry is gone no call can follow.
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(id);
  }
  return ok;
}

int64_t WriteWatchdog::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void WriteWatchdog::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (pending_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto first = pending_.begin();
    // A copy: wait_until reads its deadline again after it reacquires mu_, when Guard may have
    // erased the entry (ASan: heap-use-after-free in cluster_e2e_test, 2026-12-02).
    const Clock::time_point deadline = first->second.deadline;
    if (Clock::now() < deadline) {
      cv_.wait_until(lock, deadline);
      continue;
    }
    // Expired: cancel it and forget it (the write returns on its own once cancelled).
    (*first->second.cancel)();
    ++cancelled_;
    pending_.erase(first);
  }
}

}  // namespace icecache::router
