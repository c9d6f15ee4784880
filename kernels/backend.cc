#include "kernels/backend.h"

#include <omp.h>

#include <atomic>

namespace icecache::kernels {

namespace {
std::atomic<int> g_cpu_threads{0};
}  // namespace

std::string_view BackendName(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
  }
  return "unknown";
}

Backend ResolveBackend(Backend b) {
  if (b != Backend::kAuto) return b;
  return CudaAvailable() ? Backend::kCuda : Backend::kCpu;
}

void SetCpuThreads(int n) { g_cpu_threads.store(n < 0 ? 0 : n); }

int CpuThreads() {
  const int n = g_cpu_threads.load();
  return n > 0 ? n : omp_get_num_procs();
}

}  // namespace icecache::kernels
