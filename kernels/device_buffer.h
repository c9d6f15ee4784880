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

  // Copies host memory in / out at a byte offset. INVALID_ARGUMENT if the range exceeds size().
  // Both return after the copy is complete.
  Status CopyFromHost(const void* src, size_t bytes, size_t offset = 0);
  Status CopyToHost(void* dst, size_t bytes, size_t offset = 0) const;
  // Copies `bytes` from the start of `src` (same backend) to the start of this buffer.
  Status CopyFrom(const DeviceBuffer& src, size_t bytes);

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }
  Backend backend() const { return backend_; }

 private:
  void Release();

  const OpTable* table_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Backend backend_ = Backend::kCpu;
};

// Waits until every op this thread queued on `backend` has finished (CUDA ops are asynchronous;
// CPU ops complete before they return). FAILED_PRECONDITION when the backend is unavailable.
Status Synchronize(Backend backend);

}  // namespace icecache::kernels
