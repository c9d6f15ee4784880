// Internal: the NCCL communicator (parallel/communicator.h). Only parallel/registry.cc, which
// knows whether NCCL is compiled in, includes this header.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "parallel/communicator.h"

namespace icecache::parallel::nccl {

// One rank per CUDA device index (distinct), created together with ncclCommInitAll.
StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclCommunicators(std::span<const int> device_indices);

}  // namespace icecache::parallel::nccl
