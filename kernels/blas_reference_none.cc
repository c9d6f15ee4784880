#include "kernels/blas_reference.h"

namespace icecache::kernels {

bool OpenBlasAvailable() { return false; }

Status OpenBlasMatmulF32(const float*, const float*, float*, int, int, int, int) {
  return UnimplementedError("OpenBLAS was not found when icecache_kernels was built");
}

}  // namespace icecache::kernels
