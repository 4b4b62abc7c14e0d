#!/usr/bin/env bash
# Configures and builds a preset (default: release) with ccache: everything, or the targets
# given after the preset (scripts/build.sh release kiln kiln_plugins).
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET="${1:-release}"
shift || true
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
# Hits across clones of the repository: paths are hashed relative to the checkout.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
[ -f "build/$PRESET/build.ninja" ] || cmake --preset "$PRESET" >/dev/null
if (($#)); then
  cmake --build --preset "$PRESET" --target "$@"
else
  cmake --build --preset "$PRESET"
fi
