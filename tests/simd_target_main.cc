// main() of the kernel and store test binaries, which CTest runs once per SIMD target with
// ICECACHE_SIMD=<target> (tests/CMakeLists.txt, EVERY_SIMD_TARGET). When this CPU lacks the
// requested target, every case of the binary runs SimdTarget.RequestedTargetIsActive instead,
// which skips with the reason (so CTest reports the case as skipped, not passed).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/simd_target.h"

namespace icecache::kernels {
namespace {

// The target ICECACHE_SIMD asks for, if any.
const char* Requested() {
  const char* env = std::getenv("ICECACHE_SIMD");
  return env != nullptr && *env != '\0' ? env : nullptr;
}

bool RequestedIsUnsupported() {
  if (Requested() == nullptr) return false;
  auto want = ParseSimdTarget(Requested());
  return want.ok() && !SimdTargetSupported(*want);
}

TEST(SimdTarget, RequestedTargetIsActive) {
  if (Requested() == nullptr) GTEST_SKIP() << "ICECACHE_SIMD not set: the best supported target runs";
  auto want = ParseSimdTarget(Requested());
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  if (!SimdTargetSupported(*want)) {
    std::string have;
    for (SimdTarget t : SupportedSimdTargets()) have += " " + std::string(SimdTargetName(t));
    GTEST_SKIP() << "ICECACHE_SIMD=" << Requested() << ": this CPU does not support the " << Requested()
                 << " kernels (it supports:" << have << "); they are compiled but not run here";
  }
  EXPECT_EQ(ActiveSimdTarget(), *want);
}

}  // namespace
}  // namespace icecache::kernels

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (icecache::kernels::RequestedIsUnsupported()) GTEST_FLAG_SET(filter, "SimdTarget.RequestedTargetIsActive");
  return RUN_ALL_TESTS();
}
