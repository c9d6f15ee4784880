#!/usr/bin/env bash
# Per-layer page retrieval on real keys: runs `icecache-bench retrieval` on every (layer, kv head)
# written by `icecache-bench dump-keys --out DIR` and prints, per layer (mean over its kv heads and
# their queries), the attention mass kept at the budget by IceCache, by the tree's own best pages
# (oracle), by the exact best contiguous pages and by Quest, with query and build times.
#   scripts/real-key-retrieval.sh DIR [--first-layer 2] [retrieval options, e.g. --tuned, --budget-pages 8]
# Defaults are the serving ones: the DciParams preset kvstore::kServingDciPreset (flat; pass
# --tuned or --reference-dci to compare, and e.g. --leaf-layout projection after it), bf16 pages,
# 16-page budget with 2 sink + 2 window pages, and the query heads of a KV head's GQA group
# selecting one page set together (--group num_q_heads / num_kv_heads from meta.json; --group 1
# selects for each query alone).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/real-key-retrieval.sh DIR [--first-layer L] [retrieval options]}
shift
first=2
preset=(--flat)
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --first-layer) first=$2; shift ;;
    --flat) preset=(--flat) ;;
    --tuned) preset=(--tuned) ;;
    --reference-dci) preset=(--reference) ;;
    *) extra+=("$1") ;;
  esac
  shift
done
BIN=${ICECACHE_BENCH:-build/bin/icecache-bench}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
layers=$(sed -n 's/.*"num_layers": \([0-9]*\).*/\1/p' "$dir/meta.json")
heads=$(sed -n 's/.*"num_kv_heads": \([0-9]*\).*/\1/p' "$dir/meta.json")
qheads=$(sed -n 's/.*"num_q_heads": \([0-9]*\).*/\1/p' "$dir/meta.json")
case " ${extra[*]-} " in
  *" --group "*) ;;
  *) extra+=(--group $((qheads / heads))) ;;
esac
for ((l = first; l < layers; ++l)); do
  for ((h = 0; h < heads; ++h)); do
    "$BIN" retrieval --keys-file "$dir/keys_L${l}_H${h}.npy" --queries-file "$dir/queries_L${l}_H${h}.npy" \
      --dtype bf16 --no-faiss --json "${preset[@]}" "${extra[@]}" 2>/dev/null | sed "s/^/$l $h /" >> "$out"
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    l, h, js = line.split(" ", 2)
    rows.setdefault(int(l), []).append(json.loads(js))
print("| layer | icecache | oracle | contiguous | quest | icecache / oracle | query us (cpu) | quest us | build ms (cpu) |")
print("|---|---|---|---|---|---|---|---|---|")
tot = {k: [] for k in ("icecache", "oracle", "contiguous", "quest", "ratio")}
for l in sorted(rows):
    r = rows[l]
    m = {k: sum(x["kept_mass"][k] for x in r) / len(r) for k in ("icecache", "oracle", "contiguous", "quest")}
    ratio = sum(x["kept_mass"]["icecache"] / max(x["kept_mass"]["oracle"], 1e-12) for x in r) / len(r)
    for k in m: tot[k].append(m[k])
    tot["ratio"].append(ratio)
    q = sum(x["query_cpu_us_median"] for x in r) / len(r)
    qq = sum(x["quest_cpu_us_median"] for x in r) / len(r)
    b = sum(x["build_cpu_ms"] for x in r) / len(r)
    print(f"| {l} | {m['icecache']:.3f} | {m['oracle']:.3f} | {m['contiguous']:.3f} | {m['quest']:.3f} | {ratio:.3f} | {q:.0f} | {qq:.0f} | {b:.1f} |")
mean = {k: sum(v) / len(v) for k, v in tot.items()}
print(f"| mean | {mean['icecache']:.3f} | {mean['oracle']:.3f} | {mean['contiguous']:.3f} | {mean['quest']:.3f} | {mean['ratio']:.3f} | | | |")
print(f"| min | {min(tot['icecache']):.3f} | {min(tot['oracle']):.3f} | {min(tot['contiguous']):.3f} | {min(tot['quest']):.3f} | {min(tot['ratio']):.3f} | | | |")
PY
