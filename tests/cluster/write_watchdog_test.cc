// router::WriteWatchdog with real threads: a write blocked past the timeout is cancelled once (the
// cancel unblocks it), writes that return in time are never cancelled, and timeout 0 is no bound.
#include "router/write_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace icecache::router {
namespace {

// A write that blocks until cancel() is called, like gRPC's Write on a full window until TryCancel.
struct BlockingWrite {
  std::mutex mu;
  std::condition_variable cv;
  bool cancelled = false;
  int cancels = 0;
  bool Write() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return cancelled; });
    return false;
  }
  void Cancel() {
    {
      std::lock_guard<std::mutex> lock(mu);
      cancelled = true;
      ++cancels;
    }
    cv.notify_all();
  }
};

TEST(WriteWatchdog, BlockedWriteIsCancelledOnce) {
  WriteWatchdog w(0.05);
  BlockingWrite b;
  EXPECT_FALSE(w.Guard([&] { return b.Write(); }, [&] { b.Cancel(); }));
  EXPECT_EQ(b.cancels, 1);
  EXPECT_EQ(w.cancelled(), 1);
}

TEST(WriteWatchdog, WritesThatReturnAreNeverCancelled) {
  WriteWatchdog w(30);
  std::atomic<int> cancels{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) EXPECT_TRUE(w.Guard([] { return true; }, [&] { ++cancels; }));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(cancels.load(), 0);
  EXPECT_EQ(w.cancelled(), 0);
}

// Several blocked writers at once, each cancelled; a fast writer beside them is not.
TEST(WriteWatchdog, ManyBlockedWritersAreEachCancelled) {
  WriteWatchdog w(0.05);
  constexpr int kBlocked = 6;
  std::vector<BlockingWrite> b(kBlocked);
  std::vector<std::thread> threads;
  for (int t = 0; t < kBlocked; ++t) {
    threads.emplace_back([&, t] { EXPECT_FALSE(w.Guard([&] { return b[t].Write(); }, [&] { b[t].Cancel(); })); });
  }
  int fast_cancels = 0;
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(w.Guard([] { return true; }, [&] { ++fast_cancels; }));
  for (auto& th : threads) th.join();
  for (auto& x : b) EXPECT_EQ(x.cancels, 1);
  EXPECT_EQ(fast_cancels, 0);
  EXPECT_EQ(w.cancelled(), kBlocked);
}

TEST(WriteWatchdog, ZeroTimeoutIsNoBound) {
  WriteWatchdog w(0);
  int calls = 0;
  EXPECT_TRUE(w.Guard([&] { ++calls; return true; }, [] { FAIL() << "cancelled without a bound"; }));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(w.cancelled(), 0);
}

}  // namespace
}  // namespace icecache::router
