// OpenBLAS as a measured baseline (benchmarks and docs/BENCHMARKS.md), not used by the ops.
// Compiled against OpenBLAS when bench/CMakeLists.txt finds it (blas_reference_openblas.cc),
// else as "unavailable" (blas_reference_none.cc).
#pragma once

#include "common/status.h"

namespace icecache::bench {

bool OpenBlasAvailable();

// Row-major y[m, n] = x[m, k] · w[n, k]ᵀ in fp32 with OpenBLAS (cblas_sgemm, or cblas_sgemv when
// m == 1) on `threads` threads. UNIMPLEMENTED when OpenBLAS was not found at build time.
Status OpenBlasMatmulF32(const float* x, const float* w, float* y, int m, int n, int k, int threads);

}  // namespace icecache::bench
