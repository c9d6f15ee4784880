#include "bench/blas_reference.h"

namespace icecache::bench {

bool OpenBlasAvailable() { return false; }

Status OpenBlasMatmulF32(const float*, const float*, float*, int, int, int, int) {
  return UnimplementedError("OpenBLAS was not found when icecache-bench was built");
}

}  // namespace icecache::bench
