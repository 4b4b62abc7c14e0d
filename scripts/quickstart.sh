#!/usr/bin/env bash
# README command 1: install what is missing, build, and train the quickstart on Fashion-MNIST.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release kiln kiln_plugins
exec build/release/bin/kiln run configs/quickstart.toml --metrics build/release/quickstart.jsonl "$@"
