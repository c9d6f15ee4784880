// CPU time for the benchmarks' per-call and per-step figures (on a shared machine wall time includes
// waiting for a core; CPU time shows the work itself).
#pragma once

#include <ctime>

namespace icecache::bench {

// Microseconds of CPU time used by the calling thread so far.
inline double ThreadCpuUs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

// Seconds of CPU time used by the whole process (every thread: OpenMP workers, UCX progress
// threads, ...) so far.
inline double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace icecache::bench
