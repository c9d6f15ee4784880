// Internal: the table of one backend's op implementations. The public entry points (ops.cc)
// validate arguments once, resolve the backend through the registry and call through this table,
// so CPU and CUDA implementations receive the same, already checked parameters.
// Not part of the public interface; included by kernels/*.cc, kernels/cpu and kernels/cuda only.
#pragma once

#include <cstddef>

#include "common/status.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/kv_pages.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"

namespace icecache::kernels {

struct OpTable {
  Backend backend;
  Status (*matmul)(const MatmulParams&);
  Status (*matmul_group)(const MatmulParams*, int);
  Status (*rms_norm)(const RmsNormParams&);
  Status (*apply_rope)(const RopeParams&);
  Status (*swiglu)(const SwiGluParams&);
  Status (*add)(const AddParams&);
  Status (*embedding)(const EmbeddingParams&);
  Status (*prefill_attention)(const PrefillAttentionParams&);
  Status (*paged_decode_attention)(const PagedDecodeAttentionParams&);
  Status (*store_kv)(const StoreKvParams&);
  Status (*gather_kv)(const GatherKvParams&);
  Status (*merge_token)(const MergeTokenParams&);
  Status (*merge_states)(const MergeStatesParams&);
  Status (*argmax)(const ArgmaxParams&);
  Status (*repetition_penalty)(const RepetitionPenaltyParams&);
  Status (*count_penalty)(const CountPenaltyParams&);
  // log(sum exp(logits[i])) over one row (NaN as -inf), written to host memory.
  Status (*log_sum_exp)(const float* logits, int vocab, float* host_out);
  // Fills `sorted` ([vocab] capacity, descending by logit) with the top `count` (logit, id) pairs
  // of one row; count = vocab when k <= 0. Host output; logits in the backend's memory.
  Status (*top_logits)(const float* logits, int vocab, int count, float* sorted_logits,
                       int32_t* sorted_ids);
  // True when this backend's memory is host memory (the CPU backend): buffers handed to it by the
  // host may be used in place (see DeviceBuffer::Upload).
  bool host_memory;
  // Memory of this backend (host memory for the CPU backend).
  Status (*alloc)(size_t bytes, void** out);
  void (*free)(void* ptr);
  Status (*copy_to_device)(void* dst, const void* host_src, size_t bytes);
  Status (*copy_to_host)(void* host_dst, const void* src, size_t bytes);
  Status (*copy_on_device)(void* dst, const void* src, size_t bytes);
  // Page gather host→device: for i < count, the page_bytes at host_base + host_pages[i] * page_bytes
  // (host memory) to device_base + slots[i] * page_bytes (this backend's memory); host_pages and
  // slots are host arrays. Complete on return. CUDA: one kernel reading the pinned pool through
  // its mapped device address when host_base is page-locked (PinnedHostRegion), else one
  // cudaMemcpyAsync per page.
  Status (*gather_pages)(void* device_base, const void* host_base, const int64_t* host_pages, const int32_t* slots,
                         int count, size_t page_bytes);
  Status (*synchronize)();
  // Page-locks host memory for fast asynchronous host→device copies (cudaHostRegister); the CPU
  // backend does nothing.
  Status (*register_host)(void* ptr, size_t bytes);
  void (*unregister_host)(void* ptr);
  // Devices of this backend, and making one current for the calling thread.
  int (*device_count)();
  Status (*use_device)(int index);
};

// The CPU table (always present).
const OpTable& CpuOpTable();

// The table for `backend` (kAuto resolved). FAILED_PRECONDITION when CUDA is requested but not
// compiled in or no device is usable.
StatusOr<const OpTable*> GetOpTable(Backend backend);

}  // namespace icecache::kernels
