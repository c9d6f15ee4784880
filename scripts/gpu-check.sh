#!/usr/bin/env bash
# GPU checks for the kernels layer, in one go, for a short lease on a GPU machine (about 9 minutes
# on an H100: one build, the GPU tests, one sparse-vs-dense decode bench and a TPOT-vs-context sweep).
#
#   scripts/gpu-check.sh stage   HERE (Debian dev machine, network to the Debian archive): puts what
#                                a bare GPU machine lacks into .gpu-deps/ (GoogleTest sources,
#                                yaml-cpp and nlohmann-json .debs). Carry .gpu-deps with the tree.
#   scripts/gpu-check.sh [run]   THERE (nvcc, cmake, ninja; no -dev packages, no network): builds
#                                once (core libraries, their GPU tests, icecache and icecache-bench,
#                                CUDA on), runs kernels_test (every CUDA kernel against its CPU
#                                twin), model_device_test (the engine on CUDA against the CPU on
#                                every fixture architecture), decode_backend_test (IceCache decode
#                                through the device page cache against the CPU) and parallel_test
#                                (NCCL all-reduce over every GPU found; TP = 1 with one); writes an
#                                8B-shaped random model (Llama-3.1-8B layers: hidden 4096, 32/8 heads
#                                of 128, intermediate 14336; 4 layers, vocab 32768, no tokenizer)
#                                with `icecache make-model` while the tests run; then one attention
#                                and one GEMV bench, dense and IceCache (budget 16 pages) decode at
#                                32k (the sparse-vs-dense pair) and the same pair at 4k, 16k and 64k
#                                (TPOT vs context). Prints one summary. Exit status 0 only if every
#                                step passed, no GPU case was skipped and none ran out of time.
#   scripts/gpu-check.sh --dry-run [BUILD_DIR]
#                                ANY machine, no GPU: checks that every command line the run would
#                                use is accepted, against a CPU build (default build/): the cmake
#                                options are cache variables of that build, the build targets exist,
#                                each test binary lists its tests, and `icecache make-model` and every
#                                `icecache-bench` line parse (--check-args: options checked, nothing
#                                run). ctest runs it (GpuCheck.DryRun, tests/CMakeLists.txt).
#
# Environment: ICECACHE_CUDA_ARCHS (default 90 = H100/H200), ICECACHE_GPU_BUILD (default
# build-gpu), ICECACHE_GPU_CHECK_BUDGET_S (default 540: a step that would start past it is skipped,
# one that runs past it is stopped, and both fail the check). Logs and benchmark JSON go to
# <build>/gpu-check-logs; when $OUT is set (the device tool's output folder) each step's log and the
# summary so far are copied there as the step ends, so a lease cut short still returns them.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEPS="$ROOT/.gpu-deps"
MODE=${1:-run}

# ---- What the run runs: one definition for the run and the dry run. ----------------------------
# No FlashInfer there: the GPU machine has no network for cmake/flashinfer.cmake's pip download,
# the wheel (~97 MB) exceeds what a lease carries, and no FlashInfer kernel runs yet (its pool view
# is host code, tested where the CUDA build is configured with network).
CONFIGURE_ARGS=(-DICECACHE_CUDA=ON -DICECACHE_BUILD_SERVICES=OFF -DICECACHE_BUILD_BENCH=ON -DICECACHE_BUILD_TESTS=ON
                -DICECACHE_FLASHINFER=OFF)
TESTS=(kernels_test model_device_test decode_backend_test parallel_test)
TARGETS=("${TESTS[@]}" icecache icecache-bench)
MODEL_ARGS=(make-model --arch llama --hidden 4096 --layers 4 --heads 32 --kv-heads 8 --intermediate 14336
            --vocab 32768 --max-position 131072 --rope-theta 500000 --dtype bf16 --no-tokenizer --seed 1)
# benches CALLBACK MODEL_DIR: calls CALLBACK NAME ARGS... for every bench line, most wanted first.
# Decode: batch 1, 16 timed steps, no prefill timing; IceCache with every one of the 4 layers sparse
# (--dense-layers 0: they stand for the 30 sparse layers of the 8B model).
benches() {
  local cb=$1 model=$2
  local decode=(decode --model "$model" --device cuda --batch 1 --steps 16 --prefill-len 0)
  local sparse=(--budget-pages 16 --dense-layers 0)
  $cb attention_b32_ctx32768 attention --backend cuda --batch 32 --context 32768 --budget-pages 16 --page-size 16 --dtype bf16
  $cb gemv_m1 gemv --backend cuda --m 1 --n 14336 --k 4096 --dtype bf16
  local ctx
  for ctx in 32768 4096 16384 65536; do
    $cb "decode_dense_ctx$ctx" "${decode[@]}" --context "$ctx"
    $cb "decode_sparse_ctx$ctx" "${decode[@]}" --context "$ctx" "${sparse[@]}"
  done
}

if [[ "$MODE" == "--dry-run" ]]; then
  BUILD=${2:-build}
  [[ -d "$BUILD" ]] || { echo "gpu-check --dry-run: no build directory '$BUILD' (a CPU build: scripts/setup.sh)" >&2; exit 2; }
  BUILD=$(cd "$BUILD" && pwd)
  bad=0 checked=0
  check() {
    local what=$1; shift
    checked=$((checked + 1))
    local out
    if out=$("$@" 2>&1); then
      echo "ok    $what"
    else
      echo "FAIL  $what: $*"
      { echo "$out" | grep -m3 -iE "bad|unknown|error|required|must|no such" || echo "$out" | tail -3; } | sed 's/^/      /'
      bad=$((bad + 1))
    fi
  }
  in_cache() { grep -q "^$1:" "$BUILD/CMakeCache.txt"; }
  for arg in "${CONFIGURE_ARGS[@]}"; do
    name=${arg#-D}
    name=${name%%=*}
    check "cmake option $name" in_cache "$name"
  done
  for t in "${TARGETS[@]}"; do check "build target $t" ninja -C "$BUILD" -t query "$t"; done
  for t in "${TESTS[@]}"; do check "$t" "$BUILD/bin/$t" --gtest_list_tests; done
  check "icecache make-model" "$BUILD/bin/icecache" "${MODEL_ARGS[@]}" --out "$BUILD/gpu-check-model" --check-args
  bench_check() { local name=$1; shift; check "bench $name" "$BUILD/bin/icecache-bench" "$@" --json --check-args; }
  benches bench_check "$BUILD/gpu-check-model"
  echo "gpu-check --dry-run: $((checked - bad)) of $checked command lines accepted"
  [[ $bad -eq 0 ]]
  exit $?
fi

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

if [[ "$MODE" != run ]]; then
  echo "usage: scripts/gpu-check.sh [stage|run|--dry-run [BUILD_DIR]]" >&2
  exit 2
fi

BUILD=${ICECACHE_GPU_BUILD:-build-gpu}
ARCHS=${ICECACHE_CUDA_ARCHS:-90}
BUDGET=${ICECACHE_GPU_CHECK_BUDGET_S:-540}
LOGS="$ROOT/$BUILD/gpu-check-logs"
MODEL="$ROOT/$BUILD/gpu-check-model"
mkdir -p "$LOGS"
JOBS=$(nproc 2>/dev/null || echo 4)
START=$(date +%s)
status=0
summary=()
elapsed() { echo $(( $(date +%s) - START )); }
# Copies files to $OUT (when set), with the summary so far.
publish() {
  [[ -n "${OUT:-}" && -d "${OUT:-}" ]] || return 0
  [[ $# -gt 0 ]] && cp "$@" "$OUT/" 2>/dev/null
  printf '%s\n' "${summary[@]}" >"$OUT/summary.txt"
}
note() { summary+=("[$(elapsed) s] $1"); echo "== $1"; publish; }
# Seconds a step may take: its own cap, or what is left of the budget if less (0: none left).
step_limit() {
  local left=$(( BUDGET - $(elapsed) ))
  (( left < 0 )) && left=0
  echo $(( $1 < left ? $1 : left ))
}

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

if ! cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${CONFIGURE_ARGS[@]}" \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" ${PREFIX_PATH:+-DCMAKE_PREFIX_PATH="$PREFIX_PATH"} \
    >"$LOGS/configure.log" 2>&1; then
  tail -30 "$LOGS/configure.log"
  note "configure: FAILED (log: configure.log)"
  publish "$LOGS/configure.log"
  exit 1
fi
publish "$LOGS/configure.log"
if ! cmake --build "$BUILD" --target "${TARGETS[@]}" -j "$JOBS" >"$LOGS/build.log" 2>&1; then
  grep -E "error|FAILED" "$LOGS/build.log" | head -40
  note "build: FAILED (log: build.log)"
  publish "$LOGS/build.log"
  exit 1
fi
note "configure + build: $(elapsed) s (CUDA archs $ARCHS)"
publish "$LOGS/build.log"

# The model is CPU work (random weights, ~2.3 GB): written while the GPU tests run.
rm -rf "$MODEL"
"$BUILD/bin/icecache" "${MODEL_ARGS[@]}" --out "$MODEL" >"$LOGS/make-model.log" 2>&1 &
model_pid=$!

run_test() {
  local name=$1 limit
  limit=$(step_limit 150)
  if (( limit < 10 )); then
    note "$name: SKIPPED (time budget of $BUDGET s spent)"
    status=1
    return
  fi
  timeout "$limit" "$BUILD/bin/$name" --gtest_output="json:$LOGS/$name.json" >"$LOGS/$name.log" 2>&1
  local rc=$?
  local passed failed skipped
  passed=$(grep -c '^\[       OK \]' "$LOGS/$name.log")
  failed=$(grep -c '^\[  FAILED  \].*(' "$LOGS/$name.log")
  skipped=$(grep -c '^\[  SKIPPED \].*(' "$LOGS/$name.log")
  note "$name: rc=$rc$([[ $rc -eq 124 ]] && echo " (stopped after $limit s)") passed=$passed failed=$failed skipped=$skipped"
  if [[ $rc -ne 0 ]]; then
    grep -E '^\[  FAILED  \]|Failure|off;' "$LOGS/$name.log" | head -40
    status=1
  fi
  if grep -q "no CUDA device\|built without NCCL" "$LOGS/$name.log"; then
    note "WARNING: $name skipped GPU cases (no usable CUDA device)"
    status=1
  fi
  publish "$LOGS/$name.log" "$LOGS/$name.json"
}
for t in "${TESTS[@]}"; do run_test "$t"; done

if wait "$model_pid"; then
  note "make-model: $(tail -1 "$LOGS/make-model.log") ($(du -sh "$MODEL" | cut -f1))"
else
  note "make-model: FAILED ($(tail -1 "$LOGS/make-model.log"))"
  status=1
fi
publish "$LOGS/make-model.log"

# One bench: its JSON, and the per-step time (ms) in the summary.
run_bench() {
  local name=$1 limit; shift
  limit=$(step_limit 120)
  if (( limit < 15 )); then
    note "$name: SKIPPED (time budget of $BUDGET s spent)"
    status=1
    return
  fi
  local t0
  t0=$(date +%s)
  if timeout "$limit" "$BUILD/bin/icecache-bench" "$@" --json >"$LOGS/$name.json" 2>"$LOGS/$name.err"; then
    local tpot
    tpot=$(grep -o '"batch1_step_ms":[^,}]*' "$LOGS/$name.json" | cut -d: -f2)
    note "$name: ok in $(( $(date +%s) - t0 )) s${tpot:+, TPOT $tpot ms}"
  else
    note "$name: FAILED after $(( $(date +%s) - t0 )) s ($(tail -1 "$LOGS/$name.err"))"
    status=1
  fi
  publish "$LOGS/$name.json" "$LOGS/$name.err"
}
benches run_bench "$MODEL"
rm -rf "$MODEL"

summary+=("logs: $LOGS" "result: $([[ $status -eq 0 ]] && echo PASS || echo FAIL) in $(elapsed) s")
{
  echo "================ gpu-check summary ================"
  printf '%s\n' "${summary[@]}"
} | tee "$LOGS/summary.txt"
publish
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
  tar czf "$OUT/gpu-check-logs.tgz" -C "$LOGS" . 2>/dev/null
fi
exit $status
