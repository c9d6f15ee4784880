// Where an op runs. The backend registry (registry.cc) is the only place that knows whether CUDA
// was compiled in; everything else asks it at run time.
//
// Memory convention for every op in kernels/: raw pointers, row-major, shapes documented on each
// parameter field as [dim0, dim1, ...]. With Backend::kCuda every pointer is device memory; with
// Backend::kCpu host memory. Activations are fp32; weights and KV pages may be f32/f16/bf16.
#pragma once

#include <string_view>

namespace icecache::kernels {

enum class Backend : int {
  kAuto = 0,  // resolved by ResolveBackend(): kCuda when a device is present, else kCpu
  kCpu = 1,
  kCuda = 2,
};

std::string_view BackendName(Backend b);

// True when CUDA kernels were compiled in AND a device is usable right now.
bool CudaAvailable();

// kAuto → kCuda if CudaAvailable() else kCpu; others unchanged.
Backend ResolveBackend(Backend b);

// Threads the CPU kernels use (OpenMP); 0 = all cores. Default: all cores.
void SetCpuThreads(int n);
int CpuThreads();

}  // namespace icecache::kernels
