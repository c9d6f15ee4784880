// A fixed-size pool of worker threads for task-level parallelism (index builds across heads,
// batched retrieval queries). Numeric kernels use OpenMP inside kernels/ instead.
//
// Thread safety: all methods may be called from any thread, except that ParallelFor must not be
// called from inside one of this pool's own tasks (it would wait on itself).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace icecache {

class ThreadPool {
 public:
  // num_threads == 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(size_t num_threads = 0);
  ~ThreadPool();  // finishes queued tasks, then joins
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size(); }

  // Queues `task`; it runs on some worker thread.
  void Submit(std::function<void()> task);

  // Runs fn(i) for every i in [begin, end) across the workers and the calling thread, and
  // returns when all have run. Indices are handed out in chunks of `grain` (>= 1).
  void ParallelFor(size_t begin, size_t end, const std::function<void(size_t)>& fn, size_t grain = 1);

  // Blocks until every task submitted so far has finished.
  void Wait();

  // A process-wide pool sized to the machine, created on first use.
  static ThreadPool& Default();

 private:
  void WorkerLoop();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;       // work available or stopping
  std::condition_variable idle_cv_;  // a task finished
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  size_t running_ = 0;                       // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
};

}  // namespace icecache
