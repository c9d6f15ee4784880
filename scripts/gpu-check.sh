#!/usr/bin/env bash
# GPU checks for the kernels layer, in one go, for a short lease on a GPU machine.
#
#   scripts/gpu-check.sh stage   HERE (Debian dev machine, network to the Debian archive): puts what
#                                a bare GPU machine lacks into .gpu-deps/ (GoogleTest sources,
#                                yaml-cpp and nlohmann-json .debs). Carry .gpu-deps with the tree.
#   scripts/gpu-check.sh [run]   THERE (nvcc, cmake, ninja; no -dev packages, no network): builds
#                                only the core libraries, their GPU tests and icecache-bench with
#                                CUDA on, runs kernels_test (every CUDA kernel against its CPU
#                                twin), model_device_test (the engine on CUDA against the CPU on
#                                every fixture architecture: 32 greedy tokens, logits) and
#                                decode_backend_test (IceCache decode through the device page
#                                cache against the CPU), parallel_test (NCCL all-reduce over
#                                every GPU found; TP = 1 with one), the attention/gemv benchmarks and the
#                                decode benchmark on the CUDA device, and prints one summary.
#                                Exit status 0 only if every test passed and no GPU case was
#                                skipped.
#
# Environment: ICECACHE_CUDA_ARCHS (default 90 = H100/H200), ICECACHE_GPU_BUILD (default
# build-gpu). Logs and benchmark JSON go to <build>/gpu-check-logs; when $OUT is set (the device
# tool's output folder) the summary, the test log and a tarball of all logs are copied there.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEPS="$ROOT/.gpu-deps"
MODE=${1:-run}

if [[ "$MODE" == "stage" ]]; then
  set -e
  mkdir -p "$DEPS/debs"
  grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >> .git/info/exclude
  rm -rf "$DEPS/googletest"
  cp -r /usr/src/googletest "$DEPS/googletest"
  (cd "$DEPS/debs" && apt-get download libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev)
  du -sh "$DEPS"
  echo "staged: carry .gpu-deps (e.g. run tool: carry=[\".gpu-deps\"]) and run scripts/gpu-check.sh"
  exit 0
fi

BUILD=${ICECACHE_GPU_BUILD:-build-gpu}
ARCHS=${ICECACHE_CUDA_ARCHS:-90}
LOGS="$ROOT/$BUILD/gpu-check-logs"
mkdir -p "$LOGS"
JOBS=$(nproc 2>/dev/null || echo 4)
summary=()
note() { summary+=("$1"); echo "== $1"; }

for tool in nvcc cmake ninja; do
  if ! command -v "$tool" >/dev/null 2>&1 && ! [[ "$tool" == nvcc && -x /usr/local/cuda/bin/nvcc ]]; then
    echo "gpu-check: $tool not found" >&2
    exit 2
  fi
done
export PATH="$PATH:/usr/local/cuda/bin"
nvidia-smi -L 2>/dev/null | head -1 || true

# yaml-cpp and nlohmann_json are REQUIRED by the root CMakeLists.txt (common/ uses yaml-cpp):
# use the system's if present, else the staged Debian packages.
PREFIX_PATH=""
if [[ ! -d /usr/include/yaml-cpp || ! -d /usr/include/nlohmann ]]; then
  if ls "$DEPS"/debs/*.deb >/dev/null 2>&1; then
    mkdir -p "$DEPS/root"
    for deb in "$DEPS"/debs/*.deb; do dpkg -x "$deb" "$DEPS/root" || ar p "$deb" data.tar.xz | tar -xJ -C "$DEPS/root"; done
    PREFIX_PATH="$DEPS/root/usr"
    export LD_LIBRARY_PATH="$DEPS/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
    note "yaml-cpp/nlohmann_json: from staged Debian packages"
  else
    echo "gpu-check: yaml-cpp/nlohmann_json missing and .gpu-deps/debs not staged (run 'scripts/gpu-check.sh stage' on the dev machine)" >&2
    exit 2
  fi
fi

# GoogleTest: system package, else build the staged (or /usr/src) sources once.
if [[ ! -f /usr/include/gtest/gtest.h ]]; then
  GTEST_SRC=""
  for d in "$DEPS/googletest" /usr/src/googletest; do [[ -f "$d/CMakeLists.txt" ]] && GTEST_SRC=$d && break; done
  if [[ -z "$GTEST_SRC" ]]; then
    echo "gpu-check: GoogleTest not installed and no sources in .gpu-deps/googletest or /usr/src/googletest" >&2
    exit 2
  fi
  if [[ ! -f "$DEPS/gtest-install/include/gtest/gtest.h" ]]; then
    cmake -S "$GTEST_SRC" -B "$DEPS/gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$DEPS/gtest-install" -DBUILD_GMOCK=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
      >"$LOGS/gtest-build.log" 2>&1 &&
      cmake --build "$DEPS/gtest-build" -j "$JOBS" >>"$LOGS/gtest-build.log" 2>&1 &&
      cmake --install "$DEPS/gtest-build" >>"$LOGS/gtest-build.log" 2>&1 ||
      { echo "gpu-check: building GoogleTest failed (see $LOGS/gtest-build.log)" >&2; exit 2; }
  fi
  PREFIX_PATH="${PREFIX_PATH:+$PREFIX_PATH;}$DEPS/gtest-install"
  note "GoogleTest: built from $GTEST_SRC"
fi

t0=$(date +%s)
if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DICECACHE_CUDA=ON \
    -DICECACHE_BUILD_SERVICES=OFF -DICECACHE_BUILD_BENCH=ON -DICECACHE_BUILD_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" ${PREFIX_PATH:+-DCMAKE_PREFIX_PATH="$PREFIX_PATH"} \
    >"$LOGS/configure.log" 2>&1; then
  tail -30 "$LOGS/configure.log"
  [[ -n "${OUT:-}" && -d "${OUT:-}" ]] && cp "$LOGS/configure.log" "$OUT/"
  echo "gpu-check: configure failed (log: $LOGS/configure.log)" >&2
  exit 1
fi
if ! cmake --build "$BUILD" --target kernels_test model_device_test decode_backend_test parallel_test icecache-bench -j "$JOBS" \
    >"$LOGS/build.log" 2>&1; then
  grep -E "error|FAILED" "$LOGS/build.log" | head -40
  [[ -n "${OUT:-}" && -d "${OUT:-}" ]] && cp "$LOGS/build.log" "$OUT/"
  echo "gpu-check: build failed (log: $LOGS/build.log)" >&2
  exit 1
fi
note "configure + build: $(( $(date +%s) - t0 )) s (CUDA archs $ARCHS)"

status=0
run_test() {
  local name=$1
  "$BUILD/bin/$name" --gtest_output="json:$LOGS/$name.json" >"$LOGS/$name.log" 2>&1
  local rc=$?
  local passed failed skipped
  passed=$(grep -c '^\[       OK \]' "$LOGS/$name.log")
  failed=$(grep -c '^\[  FAILED  \].*(' "$LOGS/$name.log")
  skipped=$(grep -c '^\[  SKIPPED \].*(' "$LOGS/$name.log")
  note "$name: rc=$rc passed=$passed failed=$failed skipped=$skipped"
  if [[ $rc -ne 0 ]]; then
    grep -E '^\[  FAILED  \]|Failure|off;' "$LOGS/$name.log" | head -40
    status=1
  fi
  if grep -q "no CUDA device\|built without NCCL" "$LOGS/$name.log"; then
    note "WARNING: $name skipped GPU cases (no usable CUDA device)"
    status=1
  fi
}
run_test kernels_test
run_test model_device_test
run_test decode_backend_test
run_test parallel_test  # NCCL all-reduce on every GPU found (TP = 1 with one GPU) and the CPU collectives

bench() {
  local name=$1; shift
  if "$BUILD/bin/icecache-bench" "$@" --json >"$LOGS/$name.json" 2>"$LOGS/$name.err"; then
    note "$name: $(cat "$LOGS/$name.json")"
  else
    note "$name: FAILED ($(tail -1 "$LOGS/$name.err"))"
    status=1
  fi
}
for ctx in 4096 32768 131072; do
  bench "attention_b32_ctx$ctx" attention --backend cuda --batch 32 --context "$ctx" --budget-pages 16 --page-size 16 --dtype bf16
done
bench attention_b1_ctx32768 attention --backend cuda --batch 1 --context 32768 --budget-pages 16 --page-size 16 --dtype bf16
bench gemv_m1 gemv --backend cuda --m 1 --n 14336 --k 4096 --dtype bf16
bench gemm_m256 gemv --backend cuda --m 256 --n 14336 --k 4096 --dtype bf16
# The engine end to end on the GPU: an 8B-shaped model (4 layers), dense decode at 4k and 32k.
bench decode_8b_ctx4096 decode --device cuda --layers 4 --context 4096 --batch 1 --steps 16
bench decode_8b_ctx32768 decode --device cuda --layers 4 --context 32768 --batch 1 --steps 16

{
  echo "================ gpu-check summary ================"
  for line in "${summary[@]}"; do echo "$line"; done
  echo "logs: $LOGS"
  echo "result: $([[ $status -eq 0 ]] && echo PASS || echo FAIL)"
} | tee "$LOGS/summary.txt"
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
  cp "$LOGS/summary.txt" "$LOGS"/*_test.log "$OUT/" 2>/dev/null
  tar czf "$OUT/gpu-check-logs.tgz" -C "$LOGS" . 2>/dev/null
fi
exit $status
