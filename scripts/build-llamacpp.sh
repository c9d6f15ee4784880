#!/usr/bin/env bash
# Builds llama.cpp programs (the peer of the benchmarks) once, from the llama.cpp sources inside
# PyPI's llama-cpp-python sdist, and prints the path of the first one asked for. None of its code is
# part of icecache; nothing of it is committed.
#   scripts/build-llamacpp.sh TARGET...      e.g. llama-bench, llama-server
# Cache: ${ICECACHE_LLAMACPP_DIR:-${XDG_CACHE_HOME:-~/.cache}/icecache/llama.cpp}; a target already
# built there (any sdist version) is reused. GGML_NATIVE: the best SIMD of this CPU, so a build is
# tied to the machine's CPU. Building takes ~10 minutes on 2 cores (llama-server a few more).
# Environment: ICECACHE_JOBS (parallel build jobs, default: nproc).
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/build-llamacpp.sh TARGET..." >&2; exit 2; }
cache=${ICECACHE_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/icecache/llama.cpp}
mkdir -p "$cache"

missing=()
for t in "$@"; do
  find "$cache" -path "*/build/bin/$t" -type f 2>/dev/null | grep -q . || missing+=("$t")
done
if [ ${#missing[@]} -gt 0 ]; then
  src=$(ls -d "$cache"/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | tail -1 || true)
  if [ -z "$src" ]; then
    echo "build-llamacpp: fetching PyPI's llama-cpp-python sdist into $cache" >&2
    (cd "$cache" && python3 -m pip download llama-cpp-python --no-binary :all: --no-deps -d . -q)
    sdist=$(ls "$cache"/llama_cpp_python-*.tar.gz | tail -1)
    tar -xzf "$sdist" -C "$cache"
    src=$(ls -d "$cache"/llama_cpp_python-*/vendor/llama.cpp | tail -1)
  fi
  server=OFF
  for t in "${missing[@]}"; do [ "$t" = llama-server ] && server=ON; done
  echo "build-llamacpp: building ${missing[*]} in $src/build" >&2
  cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=$server >/dev/null
  cmake --build "$src/build" --target "${missing[@]}" -j "${ICECACHE_JOBS:-$(nproc)}" >/dev/null
fi
find "$cache" -path "*/build/bin/$1" -type f | head -1
