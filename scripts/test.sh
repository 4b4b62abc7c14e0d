#!/usr/bin/env bash
# README command 2: install what is missing, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
ctest --preset release -j2 "$@"
