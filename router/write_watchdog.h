// A bound on how long one write to a client may block. gRPC's synchronous ServerWriter::Write
// blocks while the client's flow-control window is full, so a client that stops reading would
// hold its router thread, its decode slot and its stream forever; the HTTP API has cpp-httplib's
// write timeout for the same case (router/http_server.h). Guard() runs a write and, when it has
// not returned within the timeout, calls the caller's cancel (for gRPC, ServerContext::TryCancel,
// which makes the blocked Write return false: the request path then treats the client as gone
// and cancels the generation on the workers).
//
// One watchdog thread per instance sleeps until the earliest deadline of the writes in progress.
// Thread safety: Guard may be called from any number of threads at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace icecache::router {

class WriteWatchdog {
 public:
  // timeout_seconds <= 0: no bound (Guard just runs the write, no thread is started).
  explicit WriteWatchdog(double timeout_seconds);
  ~WriteWatchdog();
  WriteWatchdog(const WriteWatchdog&) = delete;
  WriteWatchdog& operator=(const WriteWatchdog&) = delete;

  // Runs write() and returns its result. If write() is still running timeout_seconds after it
  // started, cancel() is called once, from the watchdog thread (it must not block; it may run
  // while write() is returning, never after Guard has returned).
  bool Guard(const std::function<bool()>& write, const std::function<void()>& cancel);

  // Writes cancelled so far.
  int64_t cancelled() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    Clock::time_point deadline;
    const std::function<void()>* cancel;
  };
  void Loop();

  const Clock::duration timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Pending> pending_;  // guarded by mu_; ids in arrival order
  uint64_t next_id_ = 0;
  int64_t cancelled_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace icecache::router
