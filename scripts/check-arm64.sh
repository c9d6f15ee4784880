#!/usr/bin/env bash
# Cross-compiles the core libraries for 64-bit Arm (aarch64) and runs the kernels', the IceCache
# store's and common's unit tests under user-mode QEMU.
#   scripts/check-arm64.sh [BUILD_DIR]        (default build-arm64)
# Builds only icecache_common / icecache_kernels / icecache_kvstore and the test binaries
# kernels_test, kernels_prefill_attention_test, kvstore_test, kvstore_wire_fuzz_test and
# common_test (no gRPC, UCX, model, services or benchmarks), with cmake/toolchain-aarch64-linux-gnu.cmake.
# An aarch64 build has two SIMD targets, scalar and neon (kernels/simd_target.h): the per-target
# test binaries run with ICECACHE_SIMD=scalar and =neon, and once with ICECACHE_SIMD=avx2 to check
# that asking for an x86 target falls back (the binary reports it unsupported and skips).
# Installs the host tools it needs from Debian when missing (the cross compiler, qemu-user-static,
# the arm64 foreign architecture for apt's package lists): about 1 minute. The :arm64 libraries
# (libyaml-cpp-dev, libyaml-cpp0.7, libgtest-dev) are NOT installed into the system — an :arm64
# -dev package can replace the host's amd64 one (libyaml-cpp-dev does) — but downloaded with
# `apt-get download` and unpacked into BUILD_DIR/arm64-deps, which the build and QEMU use.
# None of this is in scripts/setup.sh: only this script needs it.
# Not in CI: a cold build took 1150 s on 2 shared cores and the tests ~8 minutes for both targets
# and the no-dotprod run under QEMU (docs/BENCHMARKS.md, "Arm (aarch64) under QEMU"): over the 10
# minutes we allow a CI check.
# Environment: ICECACHE_JOBS (parallel build jobs, default: nproc); ICECACHE_ARM64_GTEST_FILTER
# (a --gtest_filter for every binary, default all cases: QEMU runs scalar code 10-30x slower than
# the host, and on a loaded machine the full set takes long); ICECACHE_ARM64_TARGETS (the SIMD
# targets the per-target binaries run on, default "scalar neon"; SimdTargetTest.* compares every
# supported target with scalar in one process whichever is active).
# The neon int8 kernels have two forms, chosen by the CPU's HWCAP: sdot (Armv8.2 dotprod, which
# QEMU's default CPU model reports) and the baseline vmull_s8 form; kvstore_test runs once more on
# neon with QEMU_CPU=cortex-a72 (no dotprod) so both are checked.
# Prints one closing line "arm64: N passed, N failed"; exits non-zero if any test failed.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${1:-build-arm64}
TESTS=(kernels_test kernels_prefill_attention_test kvstore_test kvstore_wire_fuzz_test common_test)

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "check-arm64: adding the arm64 architecture to dpkg (package lists only; nothing :arm64 is installed)"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
fi
PACKAGES=(g++-aarch64-linux-gnu qemu-user-static file nlohmann-json3-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "check-arm64: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
QEMU=$(command -v qemu-aarch64-static || command -v qemu-aarch64)

# The arm64 libraries, unpacked (not installed) into the build folder.
mkdir -p "$BUILD_DIR"
deps="$(cd "$BUILD_DIR" && pwd)/arm64-deps"
lib="$deps/usr/lib/aarch64-linux-gnu"
if [ ! -f "$lib/cmake/yaml-cpp/yaml-cpp-config.cmake" ] || [ ! -f "$lib/cmake/GTest/GTestConfig.cmake" ]; then
  rm -rf "$deps"
  mkdir -p "$deps/debs"
  (cd "$deps/debs" && apt-get download -qq libyaml-cpp-dev:arm64 libyaml-cpp0.7:arm64 libgtest-dev:arm64 2>/dev/null) ||
    { echo "check-arm64: apt-get download of the :arm64 libraries failed (run apt-get update?)" >&2; exit 1; }
  for d in "$deps"/debs/*.deb; do dpkg -x "$d" "$deps"; done
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchain-aarch64-linux-gnu.cmake" \
  -Dyaml-cpp_DIR="$lib/cmake/yaml-cpp" -DGTest_DIR="$lib/cmake/GTest" \
  -DCMAKE_BUILD_TYPE=Release -DICECACHE_CUDA=OFF -DICECACHE_BUILD_SERVICES=OFF -DICECACHE_BUILD_BENCH=OFF \
  "${launcher[@]}" >/dev/null
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "${ICECACHE_JOBS:-$(nproc)}" --target "${TESTS[@]}"
echo "check-arm64: build $(( $(date +%s) - start )) s"
file "$BUILD_DIR/bin/kvstore_test" | grep -q "ARM aarch64" || { echo "check-arm64: kvstore_test is not an aarch64 binary" >&2; exit 1; }

# THREADS_NOTE: under Debian 12's qemu-aarch64-static (7.2) on the machines we have, a guest that
# creates a thread hangs (a ten-line std::thread + join program does). Run pinned to one CPU,
# OpenMP regions stay single-threaded and pass; the cases that start threads themselves are left
# out by default (DEFAULT_FILTER; set ICECACHE_ARM64_GTEST_FILTER='*' to run everything, e.g. on
# an Arm machine or a QEMU where threads work).
DEFAULT_FILTER="*-*Concurrent*:*ThreadPool*:SequenceCacheTest.*:Shapes/SequenceCacheShapeTest.*:Types/FullModeTest.*"
passed=0
failed=0
log_dir="$BUILD_DIR/arm64-test-logs"
mkdir -p "$log_dir"
run() {  # run NAME SIMD [QEMU_CPU]: one test binary under QEMU; adds its gtest counts
  local name=$1 simd=$2 cpu=${3:-} log="$log_dir/$1.$2${3:+.$3}.log" t0 rc=0 p f s
  t0=$(date +%s)
  # One CPU in the affinity mask: OpenMP then makes no threads (see THREADS_NOTE).
  local vars=(ICECACHE_SIMD="$simd")
  [ -n "$cpu" ] && vars+=(QEMU_CPU="$cpu")
  env "${vars[@]}" timeout "${ICECACHE_ARM64_TIMEOUT:-1200}" taskset -c 0 "$QEMU" -L /usr/aarch64-linux-gnu \
    "$BUILD_DIR/bin/$name" --gtest_color=no --gtest_filter="${ICECACHE_ARM64_GTEST_FILTER:-$DEFAULT_FILTER}" >"$log" 2>&1 || rc=$?
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  p=${p:-0}
  f=${f:-0}
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # crashed, timed out, or failed before gtest's summary
  echo "  $name ICECACHE_SIMD=$simd${cpu:+ QEMU_CPU=$cpu}: $p passed, $f failed, ${s:-0} skipped ($(( $(date +%s) - t0 )) s, log $log)"
  passed=$((passed + p))
  failed=$((failed + f))
}
start=$(date +%s)
for simd in ${ICECACHE_ARM64_TARGETS:-scalar neon}; do
  for t in kernels_test kernels_prefill_attention_test kvstore_test; do run "$t" "$simd"; done
done
# The int8 kernels' baseline NEON form (no dotprod on this CPU model; the test says which form).
if [[ " ${ICECACHE_ARM64_TARGETS:-scalar neon} " == *" neon "* ]]; then
  run kvstore_test neon cortex-a72
  a72_log="$log_dir/kvstore_test.neon.cortex-a72.log"
  if ! grep -q "RUN .*Int8KernelsAreExactOnEveryTargetForExtremeBytes" "$a72_log"; then
    echo "check-arm64: the filter left out VectorOpsTest.Int8KernelsAreExactOnEveryTargetForExtremeBytes: the vmull_s8 form's check did not run"
  elif ! grep -q "lacks dotprod" "$a72_log"; then
    echo "check-arm64: kvstore_test under QEMU_CPU=cortex-a72 did not run the vmull_s8 form" >&2
    failed=$((failed + 1))
  fi
fi
for t in kvstore_wire_fuzz_test common_test; do run "$t" scalar; done
# An x86 target asked for on Arm: the per-target binaries report it unsupported and skip.
for t in kernels_test kvstore_test; do
  run "$t" avx2
  grep -q "does not support the avx2 kernels" "$log_dir/$t.avx2.log" ||
    { echo "check-arm64: $t did not report avx2 as unsupported" >&2; failed=$((failed + 1)); }
done
echo "check-arm64: tests $(( $(date +%s) - start )) s under $(basename "$QEMU")"
echo "arm64: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
