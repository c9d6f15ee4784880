#include "common/thread_pool.h"

#include <atomic>
#include <memory>

namespace icecache {

ThreadPool::ThreadPool(size_t num_threads) {
  if (num_threads == 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(num_threads);
  for (size_t i = 0; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
    }
    idle_cv_.notify_all();
  }
}

void ThreadPool::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
}

void ThreadPool::ParallelFor(size_t begin, size_t end, const std::function<void(size_t)>& fn, size_t grain) {
  if (end <= begin) return;
  if (grain == 0) grain = 1;
  const size_t chunks = (end - begin + grain - 1) / grain;
  if (chunks == 1 || workers_.empty()) {
    for (size_t i = begin; i < end; ++i) fn(i);
    return;
  }
  struct Shared {
    std::atomic<size_t> next{0};
    std::atomic<size_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto shared = std::make_shared<Shared>();
  auto run_chunks = [shared, begin, end, grain, chunks, &fn] {
    for (;;) {
      size_t c = shared->next.fetch_add(1);
      if (c >= chunks) return;
      size_t lo = begin + c * grain, hi = std::min(end, lo + grain);
      for (size_t i = lo; i < hi; ++i) fn(i);
      if (shared->done.fetch_add(1) + 1 == chunks) {
        std::lock_guard<std::mutex> lock(shared->mu);
        shared->cv.notify_all();
      }
    }
  };
  const size_t helpers = std::min(workers_.size(), chunks - 1);
  for (size_t i = 0; i < helpers; ++i) Submit(run_chunks);
  run_chunks();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->cv.wait(lock, [&] { return shared->done.load() == chunks; });
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool pool(0);
  return pool;
}

}  // namespace icecache
