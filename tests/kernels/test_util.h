// Shared helpers of the kernels tests: random data, running an op on a backend from host vectors,
// and a closeness check that reports the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/device_buffer.h"
#include "kernels/dtype.h"
#include "kernels/simd_target.h"

namespace icecache::kernels::testing {

inline constexpr char kNoCudaMessage[] = "no CUDA device: GPU differential cases skipped";

#define ICE_SKIP_WITHOUT_CUDA()                                                  \
  do {                                                                           \
    if (!::icecache::kernels::CudaAvailable())                                   \
      GTEST_SKIP() << ::icecache::kernels::testing::kNoCudaMessage;              \
  } while (0)

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The bytes of `v` stored as dtype t, and the fp32 values those bytes hold (what a kernel sees).
struct Typed {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};
inline Typed ToTyped(DType t, const std::vector<float>& v) {
  Typed out;
  out.bytes.resize(DTypeBytes(t, v.size()));
  ConvertFromF32(t, v.data(), out.bytes.data(), v.size());
  out.values.resize(v.size());
  ConvertToF32(t, out.bytes.data(), out.values.data(), v.size());
  return out;
}

// A host vector uploaded to a backend. Test-fatal on failure.
template <typename T>
DeviceBuffer Upload(Backend b, const std::vector<T>& v) {
  auto buf = DeviceBuffer::Allocate(b, v.size() * sizeof(T) + 1);
  EXPECT_TRUE(buf.ok()) << buf.status().ToString();
  EXPECT_TRUE(buf->CopyFromHost(v.data(), v.size() * sizeof(T)).ok());
  return std::move(*buf);
}

template <typename T>
std::vector<T> Download(const DeviceBuffer& buf, size_t n) {
  std::vector<T> v(n);
  EXPECT_TRUE(buf.CopyToHost(v.data(), n * sizeof(T)).ok());
  return v;
}

// Expects |got[i] - want[i]| <= atol + rtol * |want[i]| for all i; reports the worst index.
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double atol,
                        double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst_excess = 0;
  size_t worst = 0;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;  // also covers equal infinities
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = atol + rtol * std::fabs(want[i]);
    if (!(err <= tol)) {
      ++bad;
      if (!(err - tol <= worst_excess)) {
        worst_excess = err - tol;
        worst = i;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size()
                    << " elements off; worst at " << worst << " got " << got[worst] << " want "
                    << want[worst] << " (atol " << atol << ", rtol " << rtol << ")";
}

// Fixture of tests that run once per backend (checked against a naive reference each time). The
// CUDA instance skips with kNoCudaMessage when no device is usable.
class BackendTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kCuda && !CudaAvailable()) GTEST_SKIP() << kNoCudaMessage;
  }
};

inline std::string BackendParamName(const ::testing::TestParamInfo<Backend>& info) {
  return std::string(BackendName(info.param));
}

#define ICE_INSTANTIATE_ON_BACKENDS(suite)                                              \
  INSTANTIATE_TEST_SUITE_P(Backends, suite,                                             \
                           ::testing::Values(::icecache::kernels::Backend::kCpu,        \
                                             ::icecache::kernels::Backend::kCuda),      \
                           ::icecache::kernels::testing::BackendParamName)

// Calls fn(target) once per SIMD target this CPU supports (kernels/simd_target.h), lowest first,
// with that target active; restores the previous target after.
template <typename F>
void ForEachSimdTarget(F&& fn) {
  const SimdTarget saved = ActiveSimdTarget();
  for (SimdTarget t : SupportedSimdTargets()) {
    SCOPED_TRACE("SIMD target " + std::string(SimdTargetName(t)));
    ASSERT_TRUE(SetSimdTarget(t).ok());
    fn(t);
  }
  ASSERT_TRUE(SetSimdTarget(saved).ok());
}

}  // namespace icecache::kernels::testing
