#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (README command 2).
#   scripts/test.sh                       Release build in build/, every test
#   scripts/test.sh --sanitize address    ASan + UBSan build in build-asan/ (RelWithDebInfo)
#   scripts/test.sh --sanitize thread     TSan build in build-tsan/ (RelWithDebInfo)
# Extra arguments after the options go to ctest (e.g. -R 'kvstore|cluster_failure').
# Environment: ICECACHE_TEST_JOBS (ctest -j, default 2), ICECACHE_JOBS (build jobs).
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=""
if [ "${1:-}" = "--sanitize" ]; then
  sanitize=${2:?"--sanitize needs address or thread"}
  shift 2
fi

export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
case "$sanitize" in
  "")
    scripts/setup.sh build
    cd build
    ;;
  address)
    flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
    scripts/setup.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DICECACHE_BUILD_BENCH=OFF \
      "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined"
    # UCX and OpenMP keep allocations alive until exit on purpose: report errors, not leaks.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    cd build-asan
    ;;
  thread)
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    scripts/setup.sh build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DICECACHE_BUILD_BENCH=OFF \
      "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread"
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
    cd build-tsan
    ;;
  *)
    echo "scripts/test.sh: --sanitize takes address or thread, not '$sanitize'" >&2
    exit 2
    ;;
esac
ctest --output-on-failure -j "${ICECACHE_TEST_JOBS:-2}" "$@"
