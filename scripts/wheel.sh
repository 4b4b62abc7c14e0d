#!/usr/bin/env bash
# Builds the wheel, kiln-train (docs/install.md), from a release build tree, compiling nothing
# that tree has built already: pip runs scikit-build-core (pyproject.toml) with KILN_WHEEL_FROM,
# which brings the tree's installable files up to date, installs them stripped and makes the
# RUNPATHs relative to the wheel. Prints the wheel's path.
# Usage: scripts/wheel.sh [build dir (build/release)] [output dir (dist)]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath -m "${1:-build/release}")
OUT=$(realpath -m "${2:-dist}")
PY="${KILN_PYTHON:-$HOME/.cache/kiln/venv/bin/python}"
if [ ! -f "$BUILD/CMakeCache.txt" ] && [ "$BUILD" = "$PWD/build/release" ]; then
  scripts/build.sh release kiln_installable
fi
# The packaging project's own build folder: configured in a second, removed after.
pkg=$(mktemp -d "${TMPDIR:-/tmp}/kiln-wheel-build.XXXXXX")
trap 'rm -rf "$pkg"' EXIT
mkdir -p "$OUT"
"$PY" -m pip wheel . --no-build-isolation --no-deps --quiet --wheel-dir "$OUT" \
  --config-settings=cmake.define.KILN_WHEEL_FROM="$BUILD" --config-settings=build-dir="$pkg" \
  --config-settings=logging.level=WARNING >&2
version=$(sed -nE 's/^project\(kiln VERSION ([0-9.]+).*/\1/p' CMakeLists.txt)
wheel=$(ls "$OUT"/kiln_train-"$version"-*.whl)
echo "$wheel"
