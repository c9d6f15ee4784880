// router::AdmissionQueue on its own: arrival order, the bounds, cancellation and deadlines.
// Capacity is a counter the test owns (what a decode worker's free slots are to the router).
#include "router/admission_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace icecache::router {
namespace {

using namespace std::chrono_literals;
using Clock = AdmissionQueue::Clock;

struct Slots {
  std::mutex mu;
  int free = 0;
  std::vector<int> order;  // who got a slot, in order
  Status Take(int who) {
    std::lock_guard<std::mutex> lock(mu);
    if (free == 0) return ResourceExhaustedError("no slot");
    --free;
    order.push_back(who);
    return Status::Ok();
  }
  void Give(AdmissionQueue& q) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++free;
    }
    q.Notify();
  }
};

auto Always = [](const Status&) { return true; };
auto Never = [] { return false; };

bool WaitFor(const std::function<bool()>& cond) {
  const auto until = Clock::now() + 30s;
  while (!cond() && Clock::now() < until) std::this_thread::sleep_for(1ms);
  return cond();
}

TEST(AdmissionQueue, AdmitsAtOnceWhenThereIsRoom) {
  AdmissionQueue q(4, 10);
  Slots s;
  s.free = 1;
  EXPECT_TRUE(q.Admit([&] { return s.Take(0); }, Always, Never, Clock::now() + 10s).ok());
  EXPECT_EQ(q.waiting(), 0);
}

TEST(AdmissionQueue, WaitersAreServedInArrivalOrder) {
  AdmissionQueue q(8, 30, 5ms);
  Slots s;
  std::vector<std::thread> threads;
  std::vector<Status> results(5);
  for (int i = 0; i < 5; ++i) {
    threads.emplace_back([&, i] { results[i] = q.Admit([&, i] { return s.Take(i); }, Always, Never, Clock::now() + 30s); });
    ASSERT_TRUE(WaitFor([&] { return q.waiting() == i + 1; }));  // arrivals strictly one after another
  }
  for (int i = 0; i < 5; ++i) {
    s.Give(q);
    ASSERT_TRUE(WaitFor([&] { return q.waiting() == 4 - i; }));
  }
  for (auto& t : threads) t.join();
  for (const Status& r : results) EXPECT_TRUE(r.ok()) << r.ToString();
  EXPECT_EQ(s.order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(AdmissionQueue, BoundsCancellationAndDeadlines) {
  Slots s;  // never any room
  {
    AdmissionQueue off(0, 10);
    Status r = off.Admit([&] { return s.Take(0); }, Always, Never, Clock::now() + 10s);
    EXPECT_EQ(r.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(r.message().find("router.max_waiting = 0"), std::string::npos) << r.message();
  }
  AdmissionQueue q(1, 30, 5ms);
  std::atomic<bool> cancel{false};
  Status first;
  std::thread waiter([&] {
    first = q.Admit([&] { return s.Take(1); }, Always, [&] { return cancel.load(); }, Clock::now() + 30s);
  });
  ASSERT_TRUE(WaitFor([&] { return q.waiting() == 1; }));
  Status full = q.Admit([&] { return s.Take(2); }, Always, Never, Clock::now() + 30s);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("already wait"), std::string::npos) << full.message();
  cancel = true;
  waiter.join();
  EXPECT_EQ(first.code(), StatusCode::kCancelled) << first.ToString();
  EXPECT_EQ(q.waiting(), 0);

  // The client's deadline before the wait limit: DEADLINE_EXCEEDED; the wait limit first:
  // RESOURCE_EXHAUSTED.
  Status late = q.Admit([&] { return s.Take(3); }, Always, Never, Clock::now() + 50ms);
  EXPECT_EQ(late.code(), StatusCode::kDeadlineExceeded) << late.ToString();
  AdmissionQueue short_wait(4, 0.05, 5ms);
  Status waited = short_wait.Admit([&] { return s.Take(4); }, Always, Never, Clock::now() + 30s);
  EXPECT_EQ(waited.code(), StatusCode::kResourceExhausted) << waited.ToString();
  EXPECT_NE(waited.message().find("router.max_queue_wait_seconds"), std::string::npos) << waited.message();
  // Not retryable (the request can never fit): returned at once, not queued.
  Status never = q.Admit([&] { return s.Take(5); }, [](const Status&) { return false; }, Never, Clock::now() + 30s);
  EXPECT_EQ(never.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(never.message(), "no slot");
  // Errors other than RESOURCE_EXHAUSTED are returned as they are.
  Status other = q.Admit([] { return UnavailableError("down"); }, Always, Never, Clock::now() + 30s);
  EXPECT_EQ(other.code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace icecache::router
