// Where an op runs. The backend registry (registry.cc) is the only place that knows whether CUDA
// was compiled in; everything else asks it at run time.
//
// Memory convention for every op in kernels/: raw pointers, row-major, shapes documented on each
// parameter field as [dim0, dim1, ...]. With Backend::kCuda every pointer is device memory; with
// Backend::kCpu host memory. Activations are fp32; weights and KV pages may be f32/f16/bf16.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

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

// An execution device: a backend and, for CUDA, the device ordinal (as CUDA numbers them, after
// CUDA_VISIBLE_DEVICES). The CPU backend has one device, index 0.
struct Device {
  Backend backend = Backend::kAuto;
  int index = 0;
  bool operator==(const Device&) const = default;
};

// "auto", "cpu", "cuda" (= cuda:0) or "cuda:N". INVALID_ARGUMENT otherwise.
StatusOr<Device> ParseDevice(std::string_view text);
// "cpu", "cuda:N" ("auto" while unresolved).
std::string DeviceName(Device d);
// kAuto resolved as ResolveBackend does; the index kept (0 for the CPU).
Device ResolveDevice(Device d);
// Devices of a backend usable now: 1 for the CPU, the CUDA device count (0 without CUDA).
int DeviceCount(Backend b);
// True when the backend's memory is host memory (the CPU): host buffers can be used in place.
bool MemoryIsHost(Backend b);
// Makes `d` the calling thread's current device (cudaSetDevice; nothing for the CPU). Every
// thread that issues ops on a CUDA device other than 0 calls this first. FAILED_PRECONDITION when
// the backend is unavailable, INVALID_ARGUMENT for an index >= DeviceCount.
Status UseDevice(Device d);

// Threads the CPU kernels use (OpenMP); 0 = all cores. Default: all cores.
void SetCpuThreads(int n);
// The threads the calling thread's CPU kernels use: its own override if set, else the process's.
int CpuThreads();
// Overrides CpuThreads() for the calling thread only (0 = no override) and returns the previous
// override. A tensor-parallel CPU rank thread runs on its share of the cores this way.
int SetCpuThreadsForThisThread(int n);

}  // namespace icecache::kernels
