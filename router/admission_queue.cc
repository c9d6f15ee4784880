#include "router/admission_queue.h"

#include <algorithm>
#include <string>

namespace icecache::router {

AdmissionQueue::AdmissionQueue(int max_waiting, double max_wait_seconds, std::chrono::milliseconds poll)
    : max_waiting_(max_waiting),
      max_wait_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(max_wait_seconds))),
      poll_(poll) {}

Status AdmissionQueue::Admit(const std::function<Status()>& try_admit,
                             const std::function<bool(const Status&)>& retryable,
                             const std::function<bool()>& cancelled, Clock::time_point deadline) {
  const auto arrival = Clock::now();
  uint64_t ticket = 0;
  {
    // A request that finds nobody waiting tries at once; otherwise it queues behind the others,
    // so that a newcomer never overtakes a request that has been waiting.
    std::unique_lock<std::mutex> lock(mu_);
    if (queue_.empty() && !head_busy_) {
      head_busy_ = true;
      lock.unlock();
      Status s = try_admit();
      lock.lock();
      head_busy_ = false;
      cv_.notify_all();
      if (!(s.code() == StatusCode::kResourceExhausted && retryable(s))) return s;
      if (max_waiting_ <= 0 || max_wait_ <= Clock::duration::zero()) {
        return ResourceExhaustedError(s.message() + " (the router's admission queue is off: router.max_waiting = 0)");
      }
    }
    if (static_cast<int>(queue_.size()) >= max_waiting_) {
      return ResourceExhaustedError("no decode worker has room and " + std::to_string(queue_.size()) +
                                    " requests already wait (router.max_waiting = " + std::to_string(max_waiting_) +
                                    ")");
    }
    ticket = next_ticket_++;
    queue_.push_back(ticket);
  }
  const auto give_up = std::min(deadline, arrival + max_wait_);
  Status last = ResourceExhaustedError("no decode worker has room");
  std::unique_lock<std::mutex> lock(mu_);
  auto leave = [&] {
    queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
    cv_.notify_all();
  };
  uint64_t seen = notifications_;
  bool first_turn = true;  // a request that has just become the head tries at once
  auto next_try = Clock::now();
  for (;;) {
    if (cancelled()) {
      leave();
      return CancelledError("request cancelled while waiting for a decode worker");
    }
    const auto now = Clock::now();
    if (now >= give_up) {
      leave();
      if (deadline < arrival + max_wait_) {
        return DeadlineExceededError("deadline passed while waiting for a decode worker with room");
      }
      const double waited = std::chrono::duration<double>(now - arrival).count();
      return ResourceExhaustedError(last.message() + " (waited " + std::to_string(waited) +
                                    " s: router.max_queue_wait_seconds)");
    }
    const bool my_turn = queue_.front() == ticket && !head_busy_;
    if (!my_turn || !(first_turn || notifications_ != seen || now >= next_try)) {
      cv_.wait_until(lock, std::min(give_up, now + poll_));
      continue;
    }
    first_turn = false;
    seen = notifications_;
    next_try = now + poll_;
    head_busy_ = true;
    lock.unlock();
    Status s = try_admit();
    lock.lock();
    head_busy_ = false;
    cv_.notify_all();
    if (s.code() == StatusCode::kResourceExhausted && retryable(s)) {
      last = s;
      continue;
    }
    leave();
    return s;
  }
}

void AdmissionQueue::Notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++notifications_;
  }
  cv_.notify_all();
}

int AdmissionQueue::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

}  // namespace icecache::router
