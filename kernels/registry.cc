// The one place that knows whether CUDA kernels were compiled in (ICECACHE_WITH_CUDA is a compile
// definition set by kernels/CMakeLists.txt on this file only).
#include <string>

#include "kernels/op_table.h"

#ifdef ICECACHE_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace icecache::kernels {

namespace {

// nullptr when CUDA was not compiled in; else the CUDA table (its device probe decides usability).
const OpTable* CompiledCudaTable() {
#ifdef ICECACHE_WITH_CUDA
  return &cuda::CudaOpTable();
#else
  return nullptr;
#endif
}

std::string CudaDeviceProbe(bool* usable) {
#ifdef ICECACHE_WITH_CUDA
  return cuda::ProbeDevice(usable);
#else
  *usable = false;
  return "icecache was built without CUDA kernels (configure with -DICECACHE_CUDA=ON)";
#endif
}

struct CudaState {
  bool usable = false;
  std::string why_not;
};

const CudaState& GetCudaState() {
  static const CudaState state = [] {
    CudaState s;
    s.why_not = CudaDeviceProbe(&s.usable);
    return s;
  }();
  return state;
}

}  // namespace

bool CudaAvailable() { return GetCudaState().usable; }

StatusOr<const OpTable*> GetOpTable(Backend backend) {
  switch (ResolveBackend(backend)) {
    case Backend::kCpu:
      return &CpuOpTable();
    case Backend::kCuda: {
      const CudaState& s = GetCudaState();
      const OpTable* table = CompiledCudaTable();
      if (!s.usable || table == nullptr) {
        return FailedPreconditionError("CUDA backend requested but unavailable: " + s.why_not);
      }
      return table;
    }
    case Backend::kAuto:
      break;
  }
  return InvalidArgumentError("unknown backend");
}

}  // namespace icecache::kernels
