#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (README command 2).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
cd build
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ctest --output-on-failure -j "${ICECACHE_TEST_JOBS:-2}"
