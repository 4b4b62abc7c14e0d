#!/usr/bin/env bash
# README command 1: install what is missing, build, and train the quickstart on Fashion-MNIST.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# kiln_installable: kiln, libkiln and the built-in plugins, all that `cmake --install` copies.
scripts/build.sh release kiln_installable
exec build/release/bin/kiln run configs/quickstart.toml --metrics build/release/quickstart.jsonl "$@"
