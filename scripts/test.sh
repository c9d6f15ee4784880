#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (README command 2).
#   scripts/test.sh                            Release build in build/, every test
#   scripts/test.sh --sanitize address         ASan + UBSan build in build-asan/ (RelWithDebInfo)
#   scripts/test.sh --sanitize thread          TSan build in build-tsan/ (RelWithDebInfo)
#   scripts/test.sh --sanitize address --unit  the core libraries and their unit tests only (no
#                                              gRPC/UCX services, no cluster tests): what CI runs
# Extra arguments after the options go to ctest (e.g. -R 'kvstore|cluster_failure').
# Environment: ICECACHE_TEST_JOBS (ctest -j, default 2), ICECACHE_JOBS (build jobs).
# What runs under each sanitizer, what is excluded and why: docs/cluster.md, "Under sanitizers".
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

sanitize=""
unit=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=${2:?"--sanitize needs address or thread"}; shift 2 ;;
    --unit) unit=1; shift ;;
    *) break ;;
  esac
done
if [ "$unit" = 1 ] && [ -z "$sanitize" ]; then
  echo "scripts/test.sh: --unit goes with --sanitize (the Release run is the whole suite)" >&2
  exit 2
fi

export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# The sanitizer builds are cold for ccache the first time (their flags differ from Release's);
# with a launcher a second run, or another checkout, compiles almost nothing.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
services=(-DICECACHE_BUILD_SERVICES=ON)
[ "$unit" = 1 ] && services=(-DICECACHE_BUILD_SERVICES=OFF)
# Tests ctest leaves out under a sanitizer (a regex for ctest -E), each with its reason in
# docs/cluster.md ("Under sanitizers"). Empty: everything runs.
exclude=""
case "$sanitize" in
  "")
    scripts/setup.sh build
    cd build
    ;;
  address)
    flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
    # -O1 -g1 (line tables): half the compile time of -O2 -g (-O3 for kernels, kvstore) with the same
    # checks and file:line in every report; docs/cluster.md, "Under sanitizers", has the figures.
    opt="-O1 -g1 -DNDEBUG"
    scripts/setup.sh build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DICECACHE_BUILD_BENCH=OFF "${launcher[@]}" \
      "${services[@]}" "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_C_FLAGS=$flags" \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$opt" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$opt" -DICECACHE_HOT_OPT=-O1 \
      "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined"
    # UCX and OpenMP keep allocations alive until exit on purpose: report errors, not leaks.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$root/scripts/sanitizers/ubsan.supp}
    cd build-asan
    ;;
  thread)
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    scripts/setup.sh build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DICECACHE_BUILD_BENCH=OFF "${launcher[@]}" \
      "${services[@]}" "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread"
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/sanitizers/tsan.supp}
    # libgomp is not built with TSan: its team barriers are invisible to it, so every OpenMP
    # region would read as racing. One thread per region (OMP_THREAD_LIMIT caps the kernels'
    # num_threads clauses too, which OMP_NUM_THREADS does not); our own threads are all checked.
    export OMP_THREAD_LIMIT=${OMP_THREAD_LIMIT:-1}
    # UCX's memory hooks (libucm's madvise/mmap interposers) call into TSan from a thread that is
    # exiting, which crashes it (SIGSEGV in __tsan::MutexPreReadLock under ucm_madvise); without
    # memory events UCX registers memory without its cache, same transfers.
    export UCX_MEM_EVENTS=${UCX_MEM_EVENTS:-no}
    cd build-tsan
    ;;
  *)
    echo "scripts/test.sh: --sanitize takes address or thread, not '$sanitize'" >&2
    exit 2
    ;;
esac
ctest --output-on-failure -j "${ICECACHE_TEST_JOBS:-2}" ${exclude:+-E "$exclude"} "$@"
