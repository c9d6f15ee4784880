// Linked into the kernel and store test binaries, which CTest runs once per SIMD target with
// ICECACHE_SIMD=<target> (tests/CMakeLists.txt): checks that the requested target is the one the
// kernels run, or skips every case of the binary with the reason when this CPU lacks it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/simd_target.h"

namespace icecache::kernels {
namespace {

class SimdTargetEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* env = std::getenv("ICECACHE_SIMD");
    if (env == nullptr || *env == '\0') return;  // the best supported target
    auto want = ParseSimdTarget(env);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    if (!SimdTargetSupported(*want)) {
      std::string have;
      for (SimdTarget t : SupportedSimdTargets()) have += " " + std::string(SimdTargetName(t));
      GTEST_SKIP() << "ICECACHE_SIMD=" << env << ": this CPU does not support the " << env
                   << " kernels (it supports:" << have << "); they are compiled but not run here";
    }
    ASSERT_EQ(ActiveSimdTarget(), *want);
  }
};

const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new SimdTargetEnvironment);

}  // namespace
}  // namespace icecache::kernels
