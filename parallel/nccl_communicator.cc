// The NCCL communicator: ranks are threads of one process, one GPU each; the communicators are
// created together (ncclCommInitAll) and each is then used by its rank's thread. Collectives run
// on cudaStreamPerThread, the stream of every kernels/ op (kernels/cuda/common.cuh).
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <mutex>
#include <string>

#include "parallel/nccl_communicator.h"

namespace icecache::parallel::nccl {
namespace {

Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  return InternalError(std::string(what) + ": " + ncclGetErrorString(r));
}

Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return InternalError(std::string(what) + ": " + cudaGetErrorString(e));
}

StatusOr<ncclDataType_t> NcclType(kernels::DType t) {
  switch (t) {
    case kernels::DType::kF32: return ncclFloat32;
    case kernels::DType::kF16: return ncclFloat16;
    case kernels::DType::kBF16: return ncclBfloat16;
    default: break;
  }
  return InvalidArgumentError("NCCL communicator: unsupported dtype " + std::string(kernels::DTypeName(t)));
}

// The group's communicators, so that Abort on one rank aborts all.
struct NcclGroup {
  std::vector<ncclComm_t> comms;
  std::mutex mu;
  bool aborted = false;  // guarded by mu; the comms are freed once aborted

  void Abort() {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) return;
    aborted = true;
    for (ncclComm_t c : comms) ncclCommAbort(c);
  }
  ~NcclGroup() {
    if (aborted) return;
    for (ncclComm_t c : comms) ncclCommDestroy(c);
  }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int rank, int device)
      : group_(std::move(group)), rank_(rank), device_(device) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->comms.size()); }
  kernels::Device device() const override { return {kernels::Backend::kCuda, device_}; }
  std::string_view name() const override { return "nccl"; }

  Status AllReduceSum(void* buf, size_t count, kernels::DType dtype) override {
    ICE_RETURN_IF_ERROR(Prepare());
    ICE_ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype));
    return NcclStatus(ncclAllReduce(buf, buf, count, t, ncclSum, comm(), cudaStreamPerThread), "ncclAllReduce");
  }

  Status AllGather(const void* send, void* recv, size_t count, kernels::DType dtype) override {
    ICE_RETURN_IF_ERROR(Prepare());
    ICE_ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype));
    return NcclStatus(ncclAllGather(send, recv, count, t, comm(), cudaStreamPerThread), "ncclAllGather");
  }

  Status Broadcast(void* buf, size_t count, kernels::DType dtype, int root) override {
    if (root < 0 || root >= size()) {
      return InvalidArgumentError("Broadcast: root " + std::to_string(root) + " is not a rank of a group of " +
                                  std::to_string(size()));
    }
    ICE_RETURN_IF_ERROR(Prepare());
    ICE_ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype));
    return NcclStatus(ncclBroadcast(buf, buf, count, t, root, comm(), cudaStreamPerThread), "ncclBroadcast");
  }

  // An all-reduce of one float on a device scratch, then a stream synchronize: returns when every
  // rank has reached it.
  Status Barrier() override {
    ICE_RETURN_IF_ERROR(Prepare());
    if (barrier_buf_ == nullptr) {
      ICE_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&barrier_buf_, sizeof(float)), "cudaMalloc"));
    }
    ICE_RETURN_IF_ERROR(NcclStatus(
        ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm(), cudaStreamPerThread), "ncclAllReduce"));
    return CudaStatus(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
  }

  void Abort() override { group_->Abort(); }

  ~NcclCommunicator() override {
    if (barrier_buf_ != nullptr) cudaFree(barrier_buf_);
  }

 private:
  Status Prepare() {
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      if (group_->aborted) return AbortedError("communicator group was aborted (another rank failed)");
    }
    return CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  }
  ncclComm_t comm() const { return group_->comms[rank_]; }

  std::shared_ptr<NcclGroup> group_;
  const int rank_;
  const int device_;
  void* barrier_buf_ = nullptr;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclCommunicators(std::span<const int> device_indices) {
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible == 0) {
    return FailedPreconditionError("NCCL communicator: no usable CUDA device");
  }
  for (int d : device_indices) {
    if (d < 0 || d >= visible) {
      return InvalidArgumentError("NCCL communicator: cuda:" + std::to_string(d) + " does not exist (" +
                                  std::to_string(visible) + " visible)");
    }
  }
  auto group = std::make_shared<NcclGroup>();
  const int n = static_cast<int>(device_indices.size());
  group->comms.resize(n);
  std::vector<int> devs(device_indices.begin(), device_indices.end());
  const ncclResult_t r = ncclCommInitAll(group->comms.data(), n, devs.data());
  if (r != ncclSuccess) {
    group->aborted = true;  // nothing to destroy
    return FailedPreconditionError(std::string("ncclCommInitAll: ") + ncclGetErrorString(r));
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (int i = 0; i < n; ++i) out.push_back(std::make_unique<NcclCommunicator>(group, i, devs[i]));
  return out;
}

}  // namespace icecache::parallel::nccl
