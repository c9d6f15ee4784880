#!/usr/bin/env bash
# README command (1): set up, build, start a local cluster (router + 1 prefill + 1 decode worker as
# separate processes on loopback) on the embedded default model, stream one generation through the
# router, print TTFT, TPOT and KV memory, and leave the cluster serving (Ctrl-C stops it).
#   scripts/demo.sh [--once] [--context TOKENS] [--budget PAGES|full]
# --once: stop the cluster after the generation.
# The default model is tools/models/passkey (a 4-layer Llama that retrieves a passkey hidden in
# filler text; see its MODEL_CARD.md). The prompt hides a passkey 20 % into ~CONTEXT tokens of filler
# and asks for it; IceCache answers with a 16-page (256-token) budget.
set -euo pipefail
cd "$(dirname "$0")/.."

once=0
context=4000
budget=16
while [ $# -gt 0 ]; do
  case "$1" in
    --once) once=1 ;;
    --context) context=$2; shift ;;
    --budget) budget=$2; shift ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) echo "demo: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

scripts/setup.sh build
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

BIN=build/bin
MODEL=${ICECACHE_MODEL:-tools/models/passkey}
PORT=${ICECACHE_PORT:-50051}
METRICS=${ICECACHE_METRICS_PORT:-9400}

$BIN/icecache cluster --model "$MODEL" --port "$PORT" --metrics-port "$METRICS" &
cluster_pid=$!
cleanup() { kill -INT "$cluster_pid" 2>/dev/null || true; wait "$cluster_pid" 2>/dev/null || true; }
trap cleanup EXIT

for _ in $(seq 1 120); do
  if $BIN/icecache health --router "127.0.0.1:$PORT" >/dev/null 2>&1; then break; fi
  kill -0 "$cluster_pid" 2>/dev/null || { echo "demo: the cluster exited early" >&2; exit 1; }
  sleep 0.5
done
$BIN/icecache health --router "127.0.0.1:$PORT"

# The passkey prompt (template of tools/models/passkey/MODEL_CARD.md); ~25 tokens per filler group.
passkey=$(( (RANDOM % 90000) + 10000 ))
groups=$(( context / 25 ))
needle_at=$(( groups / 5 ))
filler="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
prompt="There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information there.
"
for i in $(seq 1 "$groups"); do
  [ "$i" -eq "$needle_at" ] && prompt+=" The pass key is $passkey. Remember it. $passkey is the pass key."
  prompt+=" $filler"
done
prompt+="
What is the pass key? The pass key is"

echo "demo: passkey $passkey hidden at ${needle_at}/${groups} of the filler; asking with budget $budget pages"
answer=$($BIN/icecache generate --router "127.0.0.1:$PORT" --prompt "$prompt" --max-tokens 6 --budget "$budget" | tee /dev/stderr)
echo "demo: the cluster answered '$answer'"
if [ "${answer// /}" = "$passkey" ]; then echo "demo: correct"; else echo "demo: wrong (expected $passkey)"; fi

if [ "$once" -eq 1 ]; then
  exit 0
fi
echo "demo: cluster serving on 127.0.0.1:$PORT (metrics on :$METRICS..); Ctrl-C stops it"
trap - EXIT
wait "$cluster_pid"
