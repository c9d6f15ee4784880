// The router's admission queue: a request that finds no decode worker with room waits here, in
// arrival order, instead of failing at once (the way vLLM queues requests it cannot schedule).
// RESOURCE_EXHAUSTED only when max_waiting requests already wait, or when a request has waited
// max_wait_seconds.
//
// Only the request at the head of the queue retries its admission; it retries when Notify() says
// capacity may have freed (a request of this router ended) and at least every poll interval
// (other routers share the workers). When it is admitted or gives up, the next one becomes the
// head at once.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "common/status.h"

namespace icecache::router {

class AdmissionQueue {
 public:
  using Clock = std::chrono::steady_clock;

  // max_waiting: requests that may wait at once (0: none; a request without room fails at once).
  // max_wait_seconds: the longest a request waits. poll: retry interval of the head.
  AdmissionQueue(int max_waiting, double max_wait_seconds,
                 std::chrono::milliseconds poll = std::chrono::milliseconds(50));
  AdmissionQueue(const AdmissionQueue&) = delete;
  AdmissionQueue& operator=(const AdmissionQueue&) = delete;

  // Calls try_admit(); while it returns RESOURCE_EXHAUSTED and `retryable` is true for that
  // status, waits in the queue and calls it again. Returns try_admit's first other result
  // (OK or an error), or RESOURCE_EXHAUSTED (queue full, waited too long), DEADLINE_EXCEEDED
  // (`deadline` passed first) or CANCELLED (`cancelled()` became true). try_admit runs on the
  // calling thread, never concurrently with another request's try_admit from this queue.
  Status Admit(const std::function<Status()>& try_admit, const std::function<bool(const Status&)>& retryable,
               const std::function<bool()>& cancelled, Clock::time_point deadline);

  // Capacity may have freed: wakes the head of the queue to retry now.
  void Notify();

  // Requests waiting now (the icecache_requests_waiting gauge counts these plus those in
  // reserve/prefill).
  int waiting() const;

 private:
  const int max_waiting_;
  const Clock::duration max_wait_;
  const std::chrono::milliseconds poll_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> queue_;  // guarded by mu_: tickets in arrival order
  uint64_t next_ticket_ = 0;    // guarded by mu_
  uint64_t notifications_ = 0;  // guarded by mu_: bumped by Notify
  bool head_busy_ = false;      // guarded by mu_: a try_admit is running (head or a fresh arrival)
};

}  // namespace icecache::router
