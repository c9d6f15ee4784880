// Which sanitizer this test binary was built with (scripts/test.sh --sanitize address|thread).
// Tests use it only to shrink a workload that is far too slow under a sanitizer, never to skip
// a check: the same assertions run on smaller inputs.
#pragma once

namespace icecache::sanitizer {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThread = true;
#else
inline constexpr bool kThread = false;
#endif

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddress = true;
#else
inline constexpr bool kAddress = false;
#endif

}  // namespace icecache::sanitizer
