// The one place that knows whether the NCCL communicator was compiled in (ICECACHE_WITH_NCCL is
// a compile definition set by parallel/CMakeLists.txt on this file only).
#include <set>
#include <string>

#include "parallel/communicator.h"

#ifdef ICECACHE_WITH_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace icecache::parallel {

bool NcclCompiled() {
#ifdef ICECACHE_WITH_NCCL
  return true;
#else
  return false;
#endif
}

StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateCommunicators(std::span<const kernels::Device> devices) {
  if (devices.empty()) return InvalidArgumentError("a communicator group needs at least one device");
  int cpu = 0;
  std::set<int> cuda;
  std::vector<int> indices;
  for (const kernels::Device& d0 : devices) {
    const kernels::Device d = kernels::ResolveDevice(d0);
    if (d.backend == kernels::Backend::kCpu) {
      ++cpu;
      continue;
    }
    if (!cuda.insert(d.index).second) {
      return InvalidArgumentError("communicator group: " + kernels::DeviceName(d) +
                                  " is listed twice (one rank per GPU)");
    }
    indices.push_back(d.index);
  }
  if (cpu > 0 && !indices.empty()) {
    return InvalidArgumentError("communicator group: the ranks mix the CPU and CUDA devices");
  }
  if (cpu > 0) return CreateCpuCommunicators(cpu);
#ifdef ICECACHE_WITH_NCCL
  if (!kernels::CudaAvailable()) {
    return FailedPreconditionError("communicator group on CUDA devices, but no CUDA device is usable");
  }
  return nccl::CreateNcclCommunicators(indices);
#else
  return FailedPreconditionError(
      "communicator group on CUDA devices, but icecache was built without NCCL (configure with "
      "-DICECACHE_CUDA=ON on a machine whose CUDA toolkit has nccl.h and libnccl)");
#endif
}

}  // namespace icecache::parallel
