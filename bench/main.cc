#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "bench/workload.h"
#include "kernels/simd_target.h"

namespace icecache::bench {
namespace {
std::map<std::string, std::pair<const char*, WorkloadFn>>& Registry() {
  static std::map<std::string, std::pair<const char*, WorkloadFn>> r;
  return r;
}
}  // namespace

WorkloadRegistrar::WorkloadRegistrar(const char* name, const char* help, WorkloadFn fn) {
  Registry()[name] = {help, fn};
}

}  // namespace icecache::bench

int main(int argc, char** argv) {
  auto& reg = icecache::bench::Registry();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fprintf(stderr, "usage: icecache-bench WORKLOAD [options]   (WORKLOAD --help for its options)\n");
    for (auto& [name, entry] : reg) std::fprintf(stderr, "  %-10s %s\n", name.c_str(), entry.first);
    return argc < 2 ? 2 : 0;
  }
  auto it = reg.find(argv[1]);
  if (it == reg.end()) {
    std::fprintf(stderr, "icecache-bench: unknown workload '%s' (run with --help for the list)\n", argv[1]);
    return 2;
  }
  // Figures depend on the SIMD target of the CPU kernels: name it (ICECACHE_SIMD=avx512|avx2|scalar
  // forces one; kernels/simd_target.h).
  // On avx2 the int8 kernels' form too (ICECACHE_AVX_VNNI=off turns AVX-VNNI off).
  const auto target = icecache::kernels::ActiveSimdTarget();
  const char* vnni = target != icecache::kernels::SimdTarget::kAvx2 ? ""
                     : icecache::kernels::AvxVnniActive()       ? " (int8 kernels: AVX-VNNI)"
                                                                : " (int8 kernels: vpmaddubsw/vpmaddwd)";
  std::fprintf(stderr, "icecache-bench: CPU kernels on SIMD target %s%s\n",
               std::string(icecache::kernels::SimdTargetName(target)).c_str(), vnni);
  return it->second.second(argc - 1, argv + 1);
}
