#!/usr/bin/env bash
# KV reuse across requests, measured over the OpenAI API in one run on one machine (the client is
# scripts/bench_chat.py on the official `openai` package, which scripts/setup.sh installs):
#   chat    a ~7k-token document (Debian's GPL-3, cut by SmolLM2's tokenizer) as the first user
#           message with a question, then 3 short follow-ups, each turn resending the whole
#           conversation; streamed, greedy, max_tokens 24. TTFT per turn and the ratio to llama-server.
#   shared  32 requests = one ~4k-token shared system prompt (MPL-2.0 + Apache-2.0) + a distinct
#           ~100-token question (GFDL), 4 at a time: requests/s and the prompt tokens computed.
# Engines, one after the other on the same GGUF (SmolLM2-135M-Instruct Q4_1 of scripts/fetch-smollm2.sh):
#   llama-server (-t T -c 32768 -np 4; prompt caching on by default), then `icecache cluster
#   --http-port` with KV reuse on (the defaults), then off (--set decode.prefix_cache=false --set
#   router.prefix_routing=false). Each (engine, workload) gets a fresh server and one warm-up request.
#   scripts/bench-chat.sh [--workloads chat,shared] [--engines llamacpp,reuse,noreuse] [--threads T (2)]
#                         [--gguf F.gguf] [--llama-server PATH] [--bin build/bin] [--requests 32]
#                         [--keep DIR]
# Output: JSON lines in OUT (default bench-chat.jsonl) and markdown tables on stdout (the CPU,
# the command and the date with them; `scripts/bench_chat.py table --jsonl OUT` prints them again).
# Server logs go to a temporary directory, kept when a client failed or an icecache log names an
# error (--keep DIR: always, in DIR).
# llama-server is built once into ${ICECACHE_LLAMACPP_DIR:-~/.cache/icecache/llama.cpp}
# (scripts/build-llamacpp.sh). Loopback ports only, picked free at start.
# The machine should be otherwise idle: everything is timed by wall clock.
set -euo pipefail
cd "$(dirname "$0")/.."

workloads=chat,shared
engines=llamacpp,reuse,noreuse
threads=2
gguf=""
llama_server=""
bin=build/bin
requests=32
keep=""
cmdline="scripts/bench-chat.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --workloads) workloads=$2; shift ;;
    --engines) engines=$2; shift ;;
    --threads) threads=$2; shift ;;
    --gguf) gguf=$2; shift ;;
    --llama-server) llama_server=$2; shift ;;
    --bin) bin=$2; shift ;;
    --requests) requests=$2; shift ;;
    --keep) keep=$2; shift ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "bench-chat: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-bench-chat.jsonl}
python3 -c 'import openai' 2>/dev/null || { echo "bench-chat: the openai Python package is missing (scripts/setup.sh installs it)" >&2; exit 1; }
[ -x "$bin/icecache" ] || { echo "bench-chat: no $bin/icecache (scripts/setup.sh builds it)" >&2; exit 1; }
[ -n "$gguf" ] || gguf=$(scripts/fetch-smollm2.sh)
[ -n "$llama_server" ] || llama_server=$(ICECACHE_JOBS=$threads scripts/build-llamacpp.sh llama-server)

work=${keep:-$(mktemp -d /tmp/bench-chat.XXXXXX)}
mkdir -p "$work"
pids=()
failed=0
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "$keep" ] || [ "$failed" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

# N consecutive free loopback ports; prints the first.
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randint(20000, 60000 - n)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks: s.close()
    if len(socks) == n:
        print(base); break
PY
}
wait_http() {  # URL PID SECONDS
  for _ in $(seq 1 $(($3 * 4))); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.25
  done
  return 1
}
stop() {  # PID
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local rest=()
  for p in "${pids[@]}"; do [ "$p" = "$1" ] || rest+=("$p"); done
  pids=("${rest[@]}")
}

export GOMP_SPINCOUNT=${GOMP_SPINCOUNT-300}  # the serving setting (Containerfile, chart)
llama_args=(-m "$gguf" -t "$threads" -c 32768 -np 4 --host 127.0.0.1)
start_llama() {  # LOG; sets port and server_pid
  port=$(free_ports 1)
  "$llama_server" "${llama_args[@]}" --port "$port" >"$1" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  wait_http "http://127.0.0.1:$port/health" "$server_pid" 120 || { echo "bench-chat: llama-server did not start; log:" >&2; tail -20 "$1" >&2; exit 1; }
}

# The texts, cut by SmolLM2's tokenizer (llama-server's /tokenize on the same GGUF).
start_llama "$work/llama-prepare.log"
python3 scripts/bench_chat.py prepare --server "http://127.0.0.1:$port" --out "$work/texts.json" --requests "$requests"
stop "$server_pid"

: > "$OUT"
run_client() {  # WORKLOAD ENGINE URL [client args...]
  local w=$1 e=$2 url=$3
  shift 3
  python3 scripts/bench_chat.py "$w" --texts "$work/texts.json" --base-url "$url" --engine "$e" \
    --requests "$requests" "$@" | tee -a "$OUT" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    r.pop("reply", None)
    print("  " + json.dumps(r), file=sys.stderr)' ||
    { echo "bench-chat: the client failed on $w / $e (server logs kept in $work)" >&2; failed=1; }
}
for w in ${workloads//,/ }; do
  for e in ${engines//,/ }; do
    echo "bench-chat: $w on $e" >&2
    case "$e" in
      llamacpp)
        start_llama "$work/llama-$w.log"
        run_client "$w" llamacpp "http://127.0.0.1:$port/v1"
        stop "$server_pid" ;;
      reuse|noreuse)
        sets=()
        [ "$e" = noreuse ] && sets=(--set decode.prefix_cache=false --set router.prefix_routing=false)
        base=$(free_ports 3); http=$(free_ports 1); metrics=$(free_ports 3)
        "$bin/icecache" cluster --model "$gguf" --port "$base" --http-port "$http" --metrics-port "$metrics" \
          "${sets[@]}" >"$work/icecache-$e-$w.log" 2>&1 &
        server_pid=$!
        pids+=("$server_pid")
        wait_http "http://127.0.0.1:$http/health" "$server_pid" 180 ||
          { echo "bench-chat: icecache cluster did not start; log:" >&2; tail -30 "$work/icecache-$e-$w.log" >&2; exit 1; }
        run_client "$w" "$e" "http://127.0.0.1:$http/v1" \
          --prefill-metrics "http://127.0.0.1:$((metrics + 1))/metrics" \
          --decode-metrics "http://127.0.0.1:$((metrics + 2))/metrics"
        stop "$server_pid"
        if grep -qi 'error\|fatal\|abort\|terminat' "$work/icecache-$e-$w.log"; then
          failed=1
          echo "bench-chat: icecache log $work/icecache-$e-$w.log has errors (kept):" >&2
          grep -i 'error\|fatal\|abort\|terminat' "$work/icecache-$e-$w.log" | head -20 >&2
        fi ;;
      *) echo "bench-chat: unknown engine $e (llamacpp, reuse, noreuse)" >&2; exit 2 ;;
    esac
  done
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
family=$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
model=$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
simd=$(grep -o 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/ $//')
python3 scripts/bench_chat.py table --jsonl "$OUT" --command "$cmdline" --commit "$(git rev-parse --short HEAD)" \
  --cpu "$cpu, family $family model $model ($simd), $(nproc) cores" --threads "$threads"
echo "bench-chat: JSON lines in $OUT${keep:+; logs in $keep}" >&2
