// Marks a measured region for callgrind, so that a benchmark's instruction counts can be read on a
// machine whose timings are noise (shared cores, no hardware counters):
//   valgrind --tool=callgrind --instr-atstart=no icecache-bench cluster --parts tpot ...
// instruments only the regions (every thread of the process, from Begin to End) and writes one
// profile per region, named by its label (callgrind.out.PID.N, "desc: Trigger: Client Request:
// LABEL"). Outside valgrind, or built without valgrind's headers, both calls do nothing.
#pragma once

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define ICE_HAVE_CALLGRIND 1
#endif

namespace icecache::bench {

inline void CallgrindBegin() {
#ifdef ICE_HAVE_CALLGRIND
  CALLGRIND_START_INSTRUMENTATION;
#endif
}

// Stops instrumenting and writes the counts since the last dump (`label`: which region).
inline void CallgrindEnd([[maybe_unused]] const char* label) {
#ifdef ICE_HAVE_CALLGRIND
  CALLGRIND_STOP_INSTRUMENTATION;
  CALLGRIND_DUMP_STATS_AT(label);
#endif
}

}  // namespace icecache::bench
