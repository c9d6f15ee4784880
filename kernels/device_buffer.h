// Memory owned on one backend: device memory for Backend::kCuda, 64-byte aligned host memory for
// Backend::kCpu. Used by tests, benchmarks and the page gather to stage op inputs and outputs.
// Move-only; not thread-safe (one owner).
#pragma once

#include <cstddef>

#include "common/status.h"
#include "kernels/backend.h"

namespace icecache::kernels {

struct OpTable;

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // `bytes` of uninitialised memory on `backend` (kAuto resolved). FAILED_PRECONDITION when the
  // backend is unavailable, RESOURCE_EXHAUSTED when the allocation fails.
  static StatusOr<DeviceBuffer> Allocate(Backend backend, size_t bytes);

  // `bytes` of host memory at `host` as memory of `backend`: a copy in device memory, or, where
  // the backend's memory is host memory (the CPU backend), a view of `host` itself: no copy, not
  // freed by the buffer, so `host` must outlive it. Weights are uploaded this way (a CPU model
  // reads its memory-mapped checkpoint in place).
  static StatusOr<DeviceBuffer> Upload(Backend backend, const void* host, size_t bytes);

  // Makes *buf hold at least `bytes` on `backend`, reallocating (contents lost) when it is
  // smaller or on another backend. For scratch areas that grow with the batch.
  static Status Reserve(Backend backend, size_t bytes, DeviceBuffer* buf);

  // Copies host memory in / out at a byte offset. INVALID_ARGUMENT if the range exceeds size().
  // Both return after the copy is complete.
  Status CopyFromHost(const void* src, size_t bytes, size_t offset = 0);
  Status CopyToHost(void* dst, size_t bytes, size_t offset = 0) const;
  // Copies `bytes` from the start of `src` (same backend) to the start of this buffer.
  Status CopyFrom(const DeviceBuffer& src, size_t bytes);
  // Copies `bytes` from `src`, memory of this buffer's backend, to the start of this buffer.
  Status CopyFromDevice(const void* src, size_t bytes);

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }
  Backend backend() const { return backend_; }

 private:
  void Release();

  const OpTable* table_ = nullptr;
  bool owned_ = true;  // false for a view of host memory (Upload on the CPU backend)
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Backend backend_ = Backend::kCpu;
};

// Copies between host memory and memory of `backend` that no DeviceBuffer of the caller owns
// (e.g. an op's output handed over by pointer). Both return after the copy is complete.
Status CopyToHost(Backend backend, void* host_dst, const void* src, size_t bytes);
Status CopyToDevice(Backend backend, void* dst, const void* host_src, size_t bytes);

// Host memory page-locked for `backend`'s copies (cudaHostRegister on CUDA: host→device copies
// from it run as asynchronous DMA; nothing on the CPU). Unregisters on destruction; move-only.
// The memory must outlive the registration.
class PinnedHostRegion {
 public:
  PinnedHostRegion() = default;
  ~PinnedHostRegion();
  PinnedHostRegion(PinnedHostRegion&& other) noexcept;
  PinnedHostRegion& operator=(PinnedHostRegion&& other) noexcept;
  PinnedHostRegion(const PinnedHostRegion&) = delete;
  PinnedHostRegion& operator=(const PinnedHostRegion&) = delete;

  static StatusOr<PinnedHostRegion> Register(Backend backend, void* ptr, size_t bytes);

 private:
  const OpTable* table_ = nullptr;
  void* ptr_ = nullptr;
};

// Waits until every op this thread queued on `backend` has finished (CUDA ops are asynchronous;
// CPU ops complete before they return). FAILED_PRECONDITION when the backend is unavailable.
Status Synchronize(Backend backend);

}  // namespace icecache::kernels
