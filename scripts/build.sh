#!/usr/bin/env bash
# Configures and builds a preset (default: release) with ccache.
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET="${1:-release}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
# Hits across clones of the repository: paths are hashed relative to the checkout.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
[ -f "build/$PRESET/build.ninja" ] || cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET"
