#include <cblas.h>

#include "bench/blas_reference.h"

namespace icecache::bench {

bool OpenBlasAvailable() { return true; }

Status OpenBlasMatmulF32(const float* x, const float* w, float* y, int m, int n, int k, int threads) {
  openblas_set_num_threads(threads);
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.f, w, k, x, 1, 0.f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.f, x, k, w, k, 0.f, y, n);
  }
  return Status::Ok();
}

}  // namespace icecache::bench
