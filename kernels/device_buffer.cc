#include "kernels/device_buffer.h"

#include <string>
#include <utility>

#include "kernels/op_table.h"

namespace icecache::kernels {

DeviceBuffer::~DeviceBuffer() { Release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : table_(std::exchange(other.table_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      backend_(other.backend_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = std::exchange(other.table_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    backend_ = other.backend_;
  }
  return *this;
}

void DeviceBuffer::Release() {
  if (ptr_ != nullptr && table_ != nullptr) table_->free(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(Backend backend, size_t bytes) {
  ICE_ASSIGN_OR_RETURN(const OpTable* table, GetOpTable(backend));
  DeviceBuffer buf;
  ICE_RETURN_IF_ERROR(table->alloc(bytes, &buf.ptr_));
  buf.table_ = table;
  buf.bytes_ = bytes;
  buf.backend_ = table->backend;
  return buf;
}

Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_ || (bytes > 0 && src == nullptr)) {
    return InvalidArgumentError("DeviceBuffer::CopyFromHost: range [" + std::to_string(offset) + ", " +
                                std::to_string(offset + bytes) + ") outside buffer of " +
                                std::to_string(bytes_) + " bytes");
  }
  if (bytes == 0) return Status::Ok();
  return table_->copy_to_device(static_cast<char*>(ptr_) + offset, src, bytes);
}

Status DeviceBuffer::CopyToHost(void* dst, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_ || (bytes > 0 && dst == nullptr)) {
    return InvalidArgumentError("DeviceBuffer::CopyToHost: range [" + std::to_string(offset) + ", " +
                                std::to_string(offset + bytes) + ") outside buffer of " +
                                std::to_string(bytes_) + " bytes");
  }
  if (bytes == 0) return Status::Ok();
  return table_->copy_to_host(dst, static_cast<const char*>(ptr_) + offset, bytes);
}

Status DeviceBuffer::CopyFrom(const DeviceBuffer& src, size_t bytes) {
  if (bytes > bytes_ || bytes > src.bytes_ || src.backend_ != backend_) {
    return InvalidArgumentError("DeviceBuffer::CopyFrom: " + std::to_string(bytes) +
                                " bytes exceed a buffer, or the backends differ");
  }
  if (bytes == 0) return Status::Ok();
  return table_->copy_on_device(ptr_, src.ptr_, bytes);
}

Status Synchronize(Backend backend) {
  ICE_ASSIGN_OR_RETURN(const OpTable* table, GetOpTable(backend));
  return table->synchronize();
}

}  // namespace icecache::kernels
