// Named benchmark workloads of icecache-bench. A workload file defines
//   int RunFoo(int argc, char** argv);   // argv[0] is the workload name
//   ICE_BENCH_WORKLOAD("foo", "one-line description", RunFoo);
// and is listed in bench/CMakeLists.txt. Workloads print human-readable results, or one JSON
// object with --json, and report speed as ratios against a baseline measured in the same run.
#pragma once

namespace icecache::bench {

using WorkloadFn = int (*)(int argc, char** argv);

struct WorkloadRegistrar {
  WorkloadRegistrar(const char* name, const char* help, WorkloadFn fn);
};

}  // namespace icecache::bench

#define ICE_BENCH_WORKLOAD(name, help, fn) \
  static ::icecache::bench::WorkloadRegistrar ice_bench_registrar_##fn(name, help, fn)
