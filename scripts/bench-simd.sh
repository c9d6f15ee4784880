#!/usr/bin/env bash
# The SIMD-sensitive benchmarks, once per SIMD target of ONE icecache-bench binary (run-time
# dispatch, kernels/simd_target.h; the target is forced with ICECACHE_SIMD), one JSON line per run
# in OUT (default simd-bench.jsonl), each tagged with the CPU and the target.
#   decode (prefill tok/s at 1k and 4k, decode tok/s at 1k and 8k) on the demo model and on a
#   SmolLM2-135M-shaped model; DCI-tree build and query at 32k keys (retrieval --tuned, d = 64 and
#   128); causal prefill attention at 4k (SmolLM2 heads).
# usage: scripts/bench-simd.sh BIN DEMO_MODEL SMOL_MODEL [TARGET...]   (default: every supported)
#   SMOL_MODEL: icecache make-model --out DIR --arch llama --hidden 576 --layers 30 --heads 9
#               --kv-heads 3 --intermediate 1536 --vocab 49152 --max-position 16384 --tie
#   SIMD_BENCH_SCALAR_FULL=1 also runs the 4k/8k model runs on the scalar target (slow: tens of
#   minutes on 2 cores); by default scalar runs the 1k ones only.
set -euo pipefail
BIN=${1:?usage: $0 BIN DEMO_MODEL SMOL_MODEL [TARGET...]}
DEMO=${2:?demo model dir}
SMOL=${3:?SmolLM2-shaped model dir}
shift 3
OUT=${OUT:-simd-bench.jsonl}
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-300}  # the serving setting (Containerfile, chart)
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(scalar avx2)
  grep -q avx512vnni /proc/cpuinfo && grep -q avx512_bf16 /proc/cpuinfo && targets+=(avx512)
fi
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
flags=$(grep -o -w 'avx2\|fma\|f16c\|avx512f\|avx512bw\|avx512vl\|avx512dq\|avx512vnni\|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
: > "$OUT"
run() {  # run TARGET NAME ARGS...
  local target=$1 name=$2
  shift 2
  echo "== $target $name: $*" >&2
  local line
  line=$(ICECACHE_SIMD=$target "$BIN" "$@" --json 2>/dev/null | tail -1)
  printf '{"target":"%s","run":"%s","cpu":"%s","cpu_flags":"%s","load":"%s","result":%s}\n' "$target" "$name" \
    "$cpu" "$flags" "$(cut -d' ' -f1-3 /proc/loadavg)" "$line" | tee -a "$OUT"
}
for t in "${targets[@]}"; do
  full=1
  [ "$t" = scalar ] && [ "${SIMD_BENCH_SCALAR_FULL:-0}" != 1 ] && full=0
  for m in "$DEMO" "$SMOL"; do
    run "$t" "decode1k $(basename "$m")" decode --model "$m" --batch 1 --prompt-len 1024 --steps 16 --prefill-len 1024
    [ "$full" = 1 ] && run "$t" "decode8k $(basename "$m")" decode --model "$m" --batch 1 --prompt-len 8192 --steps 16 --prefill-len 4096
  done
  for d in 64 128; do
    run "$t" "retrieval32k d$d" retrieval --keys 32768 --dim "$d" --queries 200 --dtype bf16 --no-faiss --tuned
  done
  run "$t" "prefill-attention4k" prefill-attention --len 4096 --q-heads 9 --kv-heads 3 --head-dim 64 --reps 2 --no-baseline
done
