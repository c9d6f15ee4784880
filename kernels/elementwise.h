// Elementwise ops and embedding lookup.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace icecache::kernels {

struct SwiGluParams {
  const float* gate = nullptr;  // [n]
  const float* up = nullptr;    // [n]
  float* out = nullptr;         // [n] = silu(gate) * up; may alias gate or up
  long n = 0;
};
Status SwiGlu(const SwiGluParams& p, Backend backend = Backend::kCpu);

struct AddParams {
  float* y = nullptr;        // [n], y += x
  const float* x = nullptr;  // [n]
  long n = 0;
};
Status Add(const AddParams& p, Backend backend = Backend::kCpu);

struct EmbeddingParams {
  const int32_t* ids = nullptr;  // [n] token ids, each in [0, vocab)
  const void* table = nullptr;   // [vocab, dim] of type table_dtype
  // Plain, or (CPU only) block-quantised with dim a multiple of 32: rows dequantised exactly.
  DType table_dtype = DType::kF32;
  float* out = nullptr;          // [n, dim]
  int n = 0;
  int vocab = 0;
  int dim = 0;
};
// OUT_OF_RANGE when an id is outside [0, vocab), naming the id and its position. The CPU backend
// checks before any write; the CUDA backend writes the rows of valid ids, then reports.
Status Embedding(const EmbeddingParams& p, Backend backend = Backend::kCpu);

}  // namespace icecache::kernels
