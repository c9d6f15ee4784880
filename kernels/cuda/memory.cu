// Device memory, copies, the device probe, and the CUDA op table.
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace icecache::kernels::cuda {

namespace {

Status Alloc(size_t bytes, void** out) {
  const cudaError_t err = cudaMalloc(out, bytes == 0 ? 1 : bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return ResourceExhaustedError("cudaMalloc of " + std::to_string(bytes) + " bytes failed: out of device memory");
  }
  return CudaStatus(err, "cudaMalloc");
}

void Free(void* ptr) { cudaFree(ptr); }

Status CopyToDevice(void* dst, const void* src, size_t bytes) {
  ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, Stream()));
  return CudaStatus(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize");
}

Status CopyToHost(void* dst, const void* src, size_t bytes) {
  ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, Stream()));
  return CudaStatus(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize");
}

Status CopyOnDevice(void* dst, const void* src, size_t bytes) {
  ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, Stream()));
  return CudaStatus(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize");
}

Status CopyPagesToDevice(void* const* dst, const void* const* src, size_t bytes, int count) {
  for (int i = 0; i < count; ++i) {
    ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst[i], src[i], bytes, cudaMemcpyHostToDevice, Stream()));
  }
  return CudaStatus(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize");
}

Status Synchronize() { return CudaStatus(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize"); }

Status RegisterHost(void* ptr, size_t bytes) {
  return CudaStatus(cudaHostRegister(ptr, bytes, cudaHostRegisterDefault), "cudaHostRegister");
}

void UnregisterHost(void* ptr) { cudaHostUnregister(ptr); }

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

Status UseDevice(int index) {
  const int count = DeviceCount();
  if (index < 0 || index >= count) {
    return InvalidArgumentError("cuda:" + std::to_string(index) + " does not exist (" + std::to_string(count) +
                                " CUDA devices visible; CUDA_VISIBLE_DEVICES renumbers them from 0)");
  }
  return CudaStatus(cudaSetDevice(index), "cudaSetDevice");
}

struct ThreadWorkspace {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~ThreadWorkspace() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

}  // namespace

Status Workspace(size_t bytes, void** out) {
  thread_local ThreadWorkspace ws;
  if (ws.bytes < bytes) {
    if (ws.ptr != nullptr) {
      // The previous area may still be read by queued kernels of this thread's stream.
      ICE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(Stream()));
      cudaFree(ws.ptr);
      ws.ptr = nullptr;
      ws.bytes = 0;
    }
    const size_t grown = bytes + bytes / 4;
    ICE_RETURN_IF_ERROR(Alloc(grown, &ws.ptr));
    ws.bytes = grown;
  }
  *out = ws.ptr;
  return Status::Ok();
}

std::string ProbeDevice(bool* usable) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  *usable = false;
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) {
    cudaGetLastError();
    return std::string("no CUDA device (") + cudaGetErrorName(err) + ")";
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(err);
  }
  if (count == 0) return "no CUDA device";
  *usable = true;
  return "";
}

const OpTable& CudaOpTable() {
  static const OpTable table = {
      Backend::kCuda,     Matmul,      RmsNorm,           ApplyRope,     SwiGlu,
      Add,                Embedding,   PrefillAttention,  PagedDecodeAttention,
      StoreKv,            GatherKv,    MergeToken,
      Argmax,             RepetitionPenalty, CountPenalty, LogSumExp, TopLogits,   /*host_memory=*/false,
      Alloc,              Free,          CopyToDevice,
      CopyToHost,         CopyOnDevice, CopyPagesToDevice, Synchronize,
      RegisterHost,       UnregisterHost,    DeviceCount,   UseDevice,
  };
  return table;
}

}  // namespace icecache::kernels::cuda
