// Collectives between the ranks of a tensor-parallel group: all-reduce (sum), all-gather,
// broadcast and barrier over buffers in a device's memory.
//
// A group is N ranks, rank r on device r of the list it was created for; each rank has its own
// Communicator, driven by one thread (the thread that runs that rank's ops). Every rank must
// call the same collectives in the same order with the same count and dtype; a collective
// returns once this rank's part is done, as described per implementation:
//   * CPU (CreateCpuCommunicators): the ranks are threads of one process sharing host memory.
//     Collectives are synchronous: on return the result is in the buffer. Sums are computed in
//     fp32 in rank order 0..N-1 (one rounding to bf16/f16 at the end), so every rank gets
//     bit-identical results and a run is deterministic.
//   * NCCL (CUDA builds with NCCL, CreateCommunicators with CUDA devices): one rank per GPU, the
//     ranks are threads of one process (ncclCommInitAll). Collectives are queued on the calling
//     thread's per-thread default stream, the stream every kernels/ op runs on, so they are
//     ordered with the ops before and after them like any other op.
//
// Thread safety: a Communicator is used by its rank's thread only, except Abort(), which any
// thread may call.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace icecache::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The device whose memory the buffers are in (resolved; cpu for the CPU communicator).
  virtual kernels::Device device() const = 0;
  // "cpu" or "nccl".
  virtual std::string_view name() const = 0;

  // In place: buf [count] of `dtype` holds, on every rank, the element-wise sum of all ranks'
  // buf. INVALID_ARGUMENT (on every rank) when the ranks disagree on count or dtype.
  virtual Status AllReduceSum(void* buf, size_t count, kernels::DType dtype) = 0;
  // send [count]; recv [size() * count]: rank j's send at recv + j * count (elements). `send`
  // may be recv + rank() * count (in place); otherwise the two must not overlap.
  virtual Status AllGather(const void* send, void* recv, size_t count, kernels::DType dtype) = 0;
  // buf [count]: every rank receives root's buf. INVALID_ARGUMENT for root outside [0, size()).
  virtual Status Broadcast(void* buf, size_t count, kernels::DType dtype, int root) = 0;
  // Returns once every rank has called it.
  virtual Status Barrier() = 0;

  // Makes every waiting and later collective of the whole group return ABORTED. A rank whose
  // work failed calls it so that the other ranks do not wait for it forever; the group is
  // unusable afterwards (create a new one).
  virtual void Abort() = 0;
};

// A group of n >= 1 CPU ranks (threads of this process). INVALID_ARGUMENT for n < 1.
StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateCpuCommunicators(int n);

// A group with rank r on devices[r]: CPU ranks when every device is the CPU, NCCL ranks when
// every device is a CUDA device (distinct indices). INVALID_ARGUMENT for an empty list, a mix of
// CPU and CUDA, or a CUDA device listed twice; FAILED_PRECONDITION when CUDA devices are asked
// for and NCCL is not compiled in or the devices are unusable (the message says which).
StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateCommunicators(std::span<const kernels::Device> devices);

// True when this build has the NCCL communicator (does not check for GPUs).
bool NcclCompiled();

}  // namespace icecache::parallel
