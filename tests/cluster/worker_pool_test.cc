// The router's retry policy (router/worker_pool.h): RetryPolicy's backoff schedule, and
// WorkerPool::AwaitReady against real gRPC workers on loopback — a pool whose only worker is
// unreachable waits until its bound, ends at once on a cancel, and returns as soon as a worker
// that answers Stats is there; MarkFailed makes a healthy worker not ready until a later poll.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "router/worker_pool.h"
#include "tests/cluster/cluster_fixture.h"

namespace icecache::testing {
namespace {

using Clock = std::chrono::steady_clock;
using router::RetryPolicy;
using router::WorkerKind;
using router::WorkerPool;

TEST(RetryPolicy, BackoffDoublesFrom50MsUpTo1s) {
  RetryPolicy p;
  EXPECT_EQ(p.Backoff(1).count(), 50);
  EXPECT_EQ(p.Backoff(2).count(), 100);
  EXPECT_EQ(p.Backoff(3).count(), 200);
  EXPECT_EQ(p.Backoff(5).count(), 800);
  EXPECT_EQ(p.Backoff(6).count(), 1000);
  EXPECT_EQ(p.Backoff(100).count(), 1000);
}

TEST(WorkerPoolAwaitReady, NoWorkerAnsweringWaitsUntilTheBoundOrTheCancel) {
  cluster::WorkerDiscovery d;
  d.addresses = {"127.0.0.1:1"};  // nothing listens there
  WorkerPool pool(WorkerKind::kDecode, d, 10, 0.05);
  pool.Start();
  EXPECT_FALSE(pool.AnyHealthy());
  RetryPolicy policy;
  Status s = pool.AwaitReady(policy, 1, Clock::now() + std::chrono::milliseconds(300), [] { return false; });
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  s = pool.AwaitReady(policy, 1, Clock::now() + std::chrono::hours(1), [] { return true; });
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  // A cancel that comes during the wait ends it (the test would hang for an hour otherwise).
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel = true;
  });
  s = pool.AwaitReady(policy, 1, Clock::now() + std::chrono::hours(1), [&] { return cancel.load(); });
  canceller.join();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
}

TEST(WorkerPoolAwaitReady, ALiveWorkerIsReadyAndMarkFailedHoldsItBackUntilThePollAfter) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_pool", 1, 1, "tcp,sm,self");
  ASSERT_NE(c, nullptr);
  cluster::WorkerDiscovery d;
  d.addresses = {c->decode[0]->address()};
  WorkerPool pool(WorkerKind::kDecode, d, 10, 0.05);
  pool.Start();
  ASSERT_TRUE(pool.AnyHealthy());
  RetryPolicy policy;
  EXPECT_TRUE(pool.AwaitReady(policy, 1, Clock::now() + std::chrono::seconds(30), [] { return false; }).ok());
  pool.MarkFailed(c->decode[0]->address());
  EXPECT_FALSE(pool.AnyHealthy());
  EXPECT_FALSE(pool.Ranked().front().healthy);
  // The next Stats poll (every 50 ms here) that starts after the failure makes it ready again.
  EXPECT_TRUE(pool.AwaitReady(policy, 1, Clock::now() + std::chrono::seconds(30), [] { return false; }).ok());
  EXPECT_TRUE(pool.AnyHealthy());
}

TEST(WorkerPoolRanked, WorkersToAvoidComeAfterTheOthersOfTheSameHealth) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_pool", 1, 2, "tcp,sm,self");
  ASSERT_NE(c, nullptr);
  cluster::WorkerDiscovery d;
  d.addresses = {c->decode[0]->address(), c->decode[1]->address()};
  WorkerPool pool(WorkerKind::kDecode, d, 10, 0.05);
  pool.Start();
  for (int first = 0; first < 2; ++first) {
    const std::string avoid = c->decode[first]->address();
    auto ranked = pool.Ranked(0, {avoid});
    ASSERT_EQ(ranked.size(), 2u);
    EXPECT_NE(ranked.front().address, avoid);
    EXPECT_EQ(ranked.back().address, avoid);
  }
  // An avoided healthy worker still comes before an unhealthy one.
  pool.MarkFailed(c->decode[0]->address());
  auto ranked = pool.Ranked(0, {c->decode[1]->address()});
  EXPECT_EQ(ranked.front().address, c->decode[1]->address());
}

}  // namespace
}  // namespace icecache::testing
