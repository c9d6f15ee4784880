#!/usr/bin/env bash
# icecache against llama.cpp on the same model, the same bf16 weights and the same threads, in one
# run: prefill tokens/s over a CONTEXT-token prompt and decode tokens/s after CONTEXT tokens, each
# engine measured in turn (llama.cpp first, then icecache, per context), written as JSON lines to
# OUT (default llamacpp-bench.jsonl) and as a table on stdout, with the CPU and icecache's SIMD target.
#   scripts/bench-llamacpp.sh [--contexts 1024,4096] [--threads T (nproc)] [--gguf BF16.gguf]
#                             [--llama-bench PATH] [--bin build/bin] [--decode-steps 32]
#                             [--variants default,int8,bf16]
# --variants: icecache configurations measured after the same llama.cpp run, each its own row:
#   default (the serving settings), int8 (ICECACHE_MATMUL_PRECISION=int8: x rounded to int8 per
#   block for a GGUF's kept Q8_0/Q4 blocks, llama.cpp's numerics), bf16 (--gguf-weights bf16: the
#   quantised weights dequantised to bf16 at load, as before 2026-12-07).
# --gguf: default: the SmolLM2-135M-Instruct GGUF of scripts/fetch-smollm2.sh rewritten to bf16 by
#   tools/gguf/to_bf16.py (PyPI gguf + numpy under /usr/bin/python3; installed if missing).
# --llama-bench: default: built once into ${ICECACHE_LLAMACPP_DIR:-~/.cache/icecache/llama.cpp}
#   from the llama.cpp sources inside PyPI's llama-cpp-python sdist (GGML_NATIVE: the best SIMD of
#   this CPU; none of its code is part of icecache). Building takes ~10 minutes on 2 cores.
# The machine should be otherwise idle: both engines are timed by wall clock.
set -euo pipefail
cd "$(dirname "$0")/.."

contexts=1024,4096
threads=$(nproc)
gguf=""
llama_bench=""
bin=build/bin
steps=32
variants=default
while [ $# -gt 0 ]; do
  case "$1" in
    --contexts) contexts=$2; shift ;;
    --threads) threads=$2; shift ;;
    --gguf) gguf=$2; shift ;;
    --llama-bench) llama_bench=$2; shift ;;
    --bin) bin=$2; shift ;;
    --decode-steps) steps=$2; shift ;;
    --variants) variants=$2; shift ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    *) echo "bench-llamacpp: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-llamacpp-bench.jsonl}
cache=${ICECACHE_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/icecache/llama.cpp}
mkdir -p "$cache"

if [ -z "$llama_bench" ]; then
  llama_bench=$(ICECACHE_JOBS=$threads scripts/build-llamacpp.sh llama-bench)
fi
if [ -z "$gguf" ]; then
  gguf="$cache/SmolLM2-135M-Instruct.bf16.gguf"
  if [ ! -f "$gguf" ]; then
    src_gguf=$(scripts/fetch-smollm2.sh)
    /usr/bin/python3 -c 'import gguf, numpy' 2>/dev/null ||
      /usr/bin/python3 -m pip install -q --break-system-packages gguf numpy
    /usr/bin/python3 tools/gguf/to_bf16.py "$src_gguf" "$gguf.tmp" && mv "$gguf.tmp" "$gguf"
  fi
fi

export GOMP_SPINCOUNT=${GOMP_SPINCOUNT-300}  # the serving setting (Containerfile, chart); GOMP_SPINCOUNT= (empty) leaves libgomp's default
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
target=$("$bin/icecache-bench" decode --no-such-option 2>&1 | sed -n 's/.*CPU kernels: SIMD target \([a-z0-9]*\).*/\1/p' | head -1 || true)
: > "$OUT"
printf '%-8s %-8s %-18s %14s %14s %8s\n' context variant figure llama.cpp icecache ratio
for n in ${contexts//,/ }; do
  # llama.cpp: prompt processing of n tokens; then generation of `steps` tokens after n tokens of context.
  lp=$("$llama_bench" -m "$gguf" -t "$threads" -p "$n" -n 0 -r 2 -o jsonl 2>/dev/null | tail -1)
  ld=$("$llama_bench" -m "$gguf" -t "$threads" -p 0 -n "$steps" -d "$n" -r 2 -o jsonl 2>/dev/null | tail -1)
  # icecache: the same, dense attention (budget 0), one sequence; each variant in turn.
  for variant in ${variants//,/ }; do
    case "$variant" in
      default) venv=(); vargs=() ;;
      int8) venv=(ICECACHE_MATMUL_PRECISION=int8); vargs=() ;;
      bf16) venv=(); vargs=(--gguf-weights bf16) ;;
      *) echo "bench-llamacpp: unknown variant $variant (default, int8, bf16)" >&2; exit 2 ;;
    esac
    ic=$(env "${venv[@]}" "$bin/icecache-bench" decode --model "$gguf" --batch 1 --prompt-len "$n" --prefill-len "$n" \
         --steps "$steps" --threads "$threads" "${vargs[@]}" --json 2>/dev/null | tail -1)
    printf '{"context":%d,"threads":%d,"cpu":"%s","icecache_simd":"%s","icecache_variant":"%s","load":"%s","llamacpp_prefill":%s,"llamacpp_decode":%s,"icecache":%s}\n' \
      "$n" "$threads" "$cpu" "$target" "$variant" "$(cut -d' ' -f1-3 /proc/loadavg)" "$lp" "$ld" "$ic" >> "$OUT"
    python3 - "$lp" "$ld" "$ic" "$n" "$variant" <<'PY'
import json, sys
lp, ld, ic, n, v = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
rows = [("prefill tokens/s", lp["avg_ts"], ic["prefill_tokens_per_s"]),
        ("decode tokens/s", ld["avg_ts"], ic["batch1_tokens_per_s"])]
for name, a, b in rows:
    print("%-8s %-8s %-18s %14.1f %14.1f %7.2fx" % (n, v, name, a, b, b / a))
PY
  done
done
echo "bench-llamacpp: CPU $cpu, $threads threads, icecache SIMD target $target; llama.cpp: $llama_bench; model $gguf; JSON lines in $OUT" >&2
