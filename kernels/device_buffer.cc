#include "kernels/device_buffer.h"

#include <string>
#include <utility>

#include "kernels/op_table.h"

namespace icecache::kernels {

DeviceBuffer::~DeviceBuffer() { Release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : table_(std::exchange(other.table_, nullptr)),
      owned_(other.owned_),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      backend_(other.backend_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = std::exchange(other.table_, nullptr);
    owned_ = other.owned_;
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    backend_ = other.backend_;
  }
  return *this;
}

void DeviceBuffer::Release() {
  if (ptr_ != nullptr && table_ != nullptr && owned_) table_->free(ptr_);
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

StatusOr<DeviceBuffer> DeviceBuffer::Upload(Backend backend, const void* host, size_t bytes) {
  ICE_ASSIGN_OR_RETURN(const OpTable* table, GetOpTable(backend));
  if (table->host_memory) {
    DeviceBuffer view;
    view.table_ = table;
    view.owned_ = false;
    view.ptr_ = const_cast<void*>(host);
    view.bytes_ = bytes;
    view.backend_ = table->backend;
    return view;
  }
  ICE_ASSIGN_OR_RETURN(DeviceBuffer buf, Allocate(backend, bytes));
  ICE_RETURN_IF_ERROR(buf.CopyFromHost(host, bytes));
  return buf;
}

Status DeviceBuffer::Reserve(Backend backend, size_t bytes, DeviceBuffer* buf) {
  const Backend want = ResolveBackend(backend);
  if (buf->data() != nullptr && buf->size() >= bytes && buf->backend() == want && buf->owned_) return Status::Ok();
  buf->Release();
  ICE_ASSIGN_OR_RETURN(*buf, Allocate(want, bytes));
  return Status::Ok();
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

Status DeviceBuffer::CopyFromDevice(const void* src, size_t bytes) {
  if (bytes > bytes_ || (bytes > 0 && src == nullptr)) {
    return InvalidArgumentError("DeviceBuffer::CopyFromDevice: " + std::to_string(bytes) + " bytes into a buffer of " +
                                std::to_string(bytes_));
  }
  if (bytes == 0) return Status::Ok();
  return table_->copy_on_device(ptr_, src, bytes);
}

Status CopyToHost(Backend backend, void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (host_dst == nullptr || src == nullptr) return InvalidArgumentError("CopyToHost: null pointer");
  ICE_ASSIGN_OR_RETURN(const OpTable* table, GetOpTable(backend));
  return table->copy_to_host(host_dst, src, bytes);
}

Status CopyToDevice(Backend backend, void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr || host_src == nullptr) return InvalidArgumentError("CopyToDevice: null pointer");
  ICE_ASSIGN_OR_RETURN(const OpTable* table, GetOpTable(backend));
  return table->copy_to_device(dst, host_src, bytes);
}

PinnedHostRegion::~PinnedHostRegion() {
  if (table_ != nullptr && ptr_ != nullptr) table_->unregister_host(ptr_);
}

PinnedHostRegion::PinnedHostRegion(PinnedHostRegion&& other) noexcept
    : table_(std::exchange(other.table_, nullptr)), ptr_(std::exchange(other.ptr_, nullptr)) {}

PinnedHostRegion& PinnedHostRegion::operator=(PinnedHostRegion&& other) noexcept {
  if (this != &other) {
    if (table_ != nullptr && ptr_ != nullptr) table_->unregister_host(ptr_);
    table_ = std::exchange(other.table_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
  }
  return *this;
}

StatusOr<PinnedHostRegion> PinnedHostRegion::Register(Backend backend, void* ptr, size_t bytes) {
  ICE_ASSIGN_OR_RETURN(const OpTable* table, GetOpTable(backend));
  PinnedHostRegion r;
  if (ptr == nullptr || bytes == 0) return r;
  ICE_RETURN_IF_ERROR(table->register_host(ptr, bytes));
  r.table_ = table;
  r.ptr_ = ptr;
  return r;
}

Status Synchronize(Backend backend) {
  ICE_ASSIGN_OR_RETURN(const OpTable* table, GetOpTable(backend));
  return table->synchronize();
}

}  // namespace icecache::kernels
