#include "kernels/backend.h"

#include <omp.h>

#include <atomic>
#include <charconv>

#include "kernels/op_table.h"

namespace icecache::kernels {

namespace {
std::atomic<int> g_cpu_threads{0};
thread_local int t_cpu_threads = 0;
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

StatusOr<Device> ParseDevice(std::string_view text) {
  if (text == "auto") return Device{Backend::kAuto, 0};
  if (text == "cpu") return Device{Backend::kCpu, 0};
  if (text == "cuda") return Device{Backend::kCuda, 0};
  if (text.substr(0, 5) == "cuda:" && text.size() > 5) {
    int index = -1;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data() + 5, end, index);
    if (ec == std::errc() && ptr == end && index >= 0) return Device{Backend::kCuda, index};
  }
  return InvalidArgumentError("unknown device '" + std::string(text) + "' (expected auto, cpu, cuda or cuda:N)");
}

std::string DeviceName(Device d) {
  if (d.backend == Backend::kCuda) return "cuda:" + std::to_string(d.index);
  return std::string(BackendName(d.backend));
}

Device ResolveDevice(Device d) {
  d.backend = ResolveBackend(d.backend);
  if (d.backend == Backend::kCpu) d.index = 0;
  return d;
}

int DeviceCount(Backend b) {
  auto table = GetOpTable(b);
  return table.ok() ? (*table)->device_count() : 0;
}

bool MemoryIsHost(Backend b) {
  auto table = GetOpTable(b);
  return table.ok() && (*table)->host_memory;
}

Status UseDevice(Device d) {
  ICE_ASSIGN_OR_RETURN(const OpTable* table, GetOpTable(d.backend));
  return table->use_device(d.index);
}

void SetCpuThreads(int n) { g_cpu_threads.store(n < 0 ? 0 : n); }

int SetCpuThreadsForThisThread(int n) {
  const int old = t_cpu_threads;
  t_cpu_threads = n < 0 ? 0 : n;
  return old;
}

int CpuThreads() {
  if (t_cpu_threads > 0) return t_cpu_threads;
  const int n = g_cpu_threads.load();
  return n > 0 ? n : omp_get_num_procs();
}

}  // namespace icecache::kernels
