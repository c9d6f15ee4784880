#!/usr/bin/env bash
# A bounded soak of a live local cluster: real processes (`icecache cluster`, 1 prefill + 2 decode
# workers on 127.0.0.1) and a mix of well-formed and hostile requests from parallel clients for a
# fixed time, then checks that every decode worker's KV pool is empty again and that the cluster
# still serves. Exit 0 when every check held.
#   scripts/soak.sh [--seconds S (60)] [--clients C (8)] [--port P (52100)] [--build DIR (build)]
# Requests per client, round robin: a greedy stream, a sampled stream with a stop string, a
# sparse-budget stream, invalid UTF-8 or a 300-byte stop string (must be INVALID_ARGUMENT; the CLI
# itself refuses NaN or negative sampling values, which cluster_failure_test sends), a prompt
# token outside the vocabulary (INVALID_ARGUMENT) and a client killed mid-stream after 0.3 s.
# A small decode.max_sequences makes requests queue in the router's admission queue.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=60 clients=8 port=52100 build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "soak: unknown option $1" >&2; exit 2 ;;
  esac
done
bin=$build/bin
work=$(mktemp -d)
trap 'kill $cluster 2>/dev/null; wait $cluster 2>/dev/null; rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} UCX_TLS=${UCX_TLS:-tcp,sm,self} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}

"$bin/icecache" make-model --out "$work/model" --arch llama --hidden 64 --layers 4 --vocab 320 >/dev/null || exit 1
metrics=$((port + 100))
"$bin/icecache" cluster --model "$work/model" --port "$port" --prefill 1 --decode 2 --metrics-port "$metrics" \
  --set decode.max_sequences=4 --set cache.page_size=4 --set cache.sink_pages=1 --set cache.default_budget_pages=8 \
  >"$work/cluster.log" 2>&1 &
cluster=$!
for _ in $(seq 100); do "$bin/icecache" health --router "127.0.0.1:$port" >/dev/null 2>&1 && break; sleep 0.2; done
"$bin/icecache" health --router "127.0.0.1:$port" >/dev/null || { echo "soak: cluster did not start"; cat "$work/cluster.log"; exit 1; }

# Runs one request; `expect` is OK, or the gRPC code the request must fail with.
run() {
  local id=$1 expect=$2
  shift 2
  if "$bin/icecache" generate --router "127.0.0.1:$port" "$@" >/dev/null 2>"$work/err.$id"; then
    [ "$expect" = OK ]
  else
    [ "$expect" != OK ] && grep -q "$expect" "$work/err.$id"
  fi
}
client() {
  local id=$1 end=$2 i=0 ok=0 bad=0 r
  while [ "$(date +%s)" -lt "$end" ]; do
    case $((i % 6)) in
      0) run "$id" OK --prompt "client $id request $i greedy" --max-tokens 24 --ignore-eos ;;
      1) run "$id" OK --prompt "client $id sampled $i" --max-tokens 24 --temperature 0.8 --top-p 0.9 \
           --seed $((i + 1)) --stop "zz" ;;
      2) run "$id" OK --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12 --max-tokens 32 --budget 6 --ignore-eos ;;
      3) if [ $((i % 12)) -eq 3 ]; then
           run "$id" INVALID_ARGUMENT --prompt $'invalid \xff utf-8' --max-tokens 4
         else
           run "$id" INVALID_ARGUMENT --prompt "long stop" --max-tokens 4 --stop "$(printf 'x%.0s' $(seq 300))"
         fi ;;
      4) run "$id" INVALID_ARGUMENT --prompt-ids 1,99999 --max-tokens 4 ;;
      5) # The client vanishes mid-stream (killed); whatever it prints does not matter.
         timeout 0.3 "$bin/icecache" generate --router "127.0.0.1:$port" --prompt-ids 5,6,7 --max-tokens 4000 \
           --ignore-eos >/dev/null 2>&1
         true ;;
    esac
    r=$?
    if [ $r -eq 0 ]; then ok=$((ok + 1)); else bad=$((bad + 1)); echo "soak: client $id request $i (kind $((i % 6))) failed: $(tail -1 "$work/err.$id")"; fi
    i=$((i + 1))
  done
  echo "$ok $bad" >"$work/result.$id"
}
end=$(( $(date +%s) + seconds ))
for c in $(seq "$clients"); do client "$c" "$end" & done
wait $(jobs -p | grep -v "^$cluster$") 2>/dev/null
total_ok=0 total_bad=0
for c in $(seq "$clients"); do read -r o b <"$work/result.$c"; total_ok=$((total_ok + o)); total_bad=$((total_bad + b)); done
echo "soak: $seconds s, $clients clients: $total_ok requests behaved as expected, $total_bad did not"

# Every decode worker's pool returns to empty (the metrics refresh every 0.5 s).
status=0
for d in 1 2; do
  mport=$((metrics + 1 + d))
  usage=""
  for _ in $(seq 50); do
    usage=$(curl -s "http://127.0.0.1:$mport/metrics" | awk '/^icecache_kv_cache_usage_ratio/ {print $2}')
    [ "$usage" = "0" ] && break
    sleep 0.2
  done
  echo "soak: decode worker $d icecache_kv_cache_usage_ratio = ${usage:-?}"
  [ "$usage" = "0" ] || status=1
done
"$bin/icecache" health --router "127.0.0.1:$port" >/dev/null || { echo "soak: router no longer SERVING"; status=1; }
[ "$total_bad" -eq 0 ] || status=1
[ "$total_ok" -gt 0 ] || status=1
exit $status
