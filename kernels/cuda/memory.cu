// Device memory, copies, the device probe, and the CUDA op table.
#include <cstring>
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

// One block per page; 16-byte loads from the mapped host pool (over the bus) and stores to the slot.
__global__ void GatherPagesKernel(char* device_base, const char* host_base, const int64_t* host_pages,
                                  const int32_t* slots, size_t vectors_per_page) {
  const int4* src = reinterpret_cast<const int4*>(host_base) + host_pages[blockIdx.x] * vectors_per_page;
  int4* dst = reinterpret_cast<int4*>(device_base) + static_cast<size_t>(slots[blockIdx.x]) * vectors_per_page;
  for (size_t j = threadIdx.x; j < vectors_per_page; j += blockDim.x) dst[j] = src[j];
}

// The device address of page-locked, mapped host memory (cudaHostRegister with the default flags
// maps it on 64-bit systems); nullptr for pageable memory.
const void* MappedHostAddress(const void* host) {
  void* dev = nullptr;
  if (cudaHostGetDevicePointer(&dev, const_cast<void*>(host), 0) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return dev;
}

Status GatherPages(void* device_base, const void* host_base, const int64_t* host_pages, const int32_t* slots,
                   int count, size_t page_bytes) {
  if (count == 0) return Status::Ok();
  const void* mapped = MappedHostAddress(host_base);
  const bool aligned = page_bytes % sizeof(int4) == 0 && reinterpret_cast<uintptr_t>(device_base) % sizeof(int4) == 0 &&
                       reinterpret_cast<uintptr_t>(mapped) % sizeof(int4) == 0;
  if (mapped == nullptr || !aligned) {
    // Pageable or oddly sized: one DMA per page (each staged by the driver when pageable).
    for (int i = 0; i < count; ++i) {
      ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(device_base) + static_cast<size_t>(slots[i]) * page_bytes,
                                               static_cast<const char*>(host_base) + host_pages[i] * page_bytes,
                                               page_bytes, cudaMemcpyHostToDevice, Stream()));
    }
    return CudaStatus(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize");
  }
  // The index lists in one upload into the thread's workspace (stream-ordered after the kernels
  // that used it before), then one kernel for every page.
  thread_local std::vector<char> staged;  // [pages int64 | slots int32]
  const size_t pages_bytes = static_cast<size_t>(count) * sizeof(int64_t);
  const size_t bytes = pages_bytes + static_cast<size_t>(count) * sizeof(int32_t);
  staged.resize(bytes);
  std::memcpy(staged.data(), host_pages, pages_bytes);
  std::memcpy(staged.data() + pages_bytes, slots, bytes - pages_bytes);
  void* lists = nullptr;
  ICE_RETURN_IF_ERROR(Workspace(bytes, &lists));
  ICE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(lists, staged.data(), bytes, cudaMemcpyHostToDevice, Stream()));
  const auto* dev_pages = static_cast<const int64_t*>(lists);
  const auto* dev_slots = reinterpret_cast<const int32_t*>(static_cast<const char*>(lists) + pages_bytes);
  GatherPagesKernel<<<count, 256, 0, Stream()>>>(static_cast<char*>(device_base), static_cast<const char*>(mapped),
                                                 dev_pages, dev_slots, page_bytes / sizeof(int4));
  ICE_RETURN_IF_ERROR(LaunchStatus("GatherPagesKernel"));
  // Complete on return (the op's contract; the staged lists and the workspace are reused next).
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
      Backend::kCuda,     Matmul,      MatmulGroup,       RmsNorm,           ApplyRope,     SwiGlu,
      Add,                Embedding,   PrefillAttention,  PagedDecodeAttention,
      StoreKv,            GatherKv,    MergeToken,  MergeStates,
      Argmax,             RepetitionPenalty, CountPenalty, LogSumExp, TopLogits,   /*host_memory=*/false,
      Alloc,              Free,          CopyToDevice,
      CopyToHost,         CopyOnDevice, GatherPages,   Synchronize,
      RegisterHost,       UnregisterHost,    DeviceCount,   UseDevice,
  };
  return table;
}

}  // namespace icecache::kernels::cuda
