#!/usr/bin/env bash
# Builds the wheel, kiln-train (docs/install.md), from a release build tree, compiling nothing
# that tree has built already: pip runs scikit-build-core (pyproject.toml) with KILN_WHEEL_FROM,
# which brings the tree's installable files up to date, installs them stripped and makes the
# RUNPATHs relative to the wheel. Then auditwheel repairs it into a manylinux wheel: the Debian
# libraries Kiln links (Boost, spdlog, fmt, TOML++, libjpeg-turbo, libpng, libcsv, cairo) are copied
# into it (kiln_train.libs/), so it installs on any x86_64 Linux with a new enough glibc. Torch's
# own libraries stay out: the torch wheel beside it provides them. Prints the wheel's path.
# Usage: scripts/wheel.sh [build dir (build/release)] [output dir (dist)]
#        scripts/wheel.sh --repair WHEEL [output dir (dist)]   repairs a wheel `pip wheel .` made
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${KILN_PYTHON:-$HOME/.cache/kiln/venv/bin/python}"
repair_only=""
if [ "${1:-}" = "--repair" ]; then
  repair_only=$(realpath "${2:?usage: scripts/wheel.sh --repair WHEEL [output dir]}")
  shift 2
  set -- build/release "$@"
fi
BUILD=$(realpath -m "${1:-build/release}")
OUT=$(realpath -m "${2:-dist}")
mkdir -p "$OUT"
# The packaging project's own build folder and the unrepaired wheel: removed after.
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-wheel-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
version=$(sed -nE 's/^project\(kiln VERSION ([0-9.]+).*/\1/p' CMakeLists.txt)

if [ -n "$repair_only" ]; then
  raw=$repair_only
else
  if [ ! -f "$BUILD/CMakeCache.txt" ] && [ "$BUILD" = "$PWD/build/release" ]; then
    scripts/build.sh release kiln_installable
  fi
  "$PY" -m pip wheel . --no-build-isolation --no-deps --quiet --wheel-dir "$work/raw" \
    --config-settings=cmake.define.KILN_WHEEL_FROM="$BUILD" --config-settings=build-dir="$work/pkg" \
    --config-settings=logging.level=WARNING >&2
  raw=$(ls "$work"/raw/kiln_train-"$version"-*.whl)
fi

# auditwheel picks the most widely installable manylinux tag the libraries' symbol versions
# allow. Excluded: what torch==2.11.0's wheel and its nvidia-* requirements install (found at
# run time through the RUNPATHs' $ORIGIN/../../torch/lib and nvidia/cu13/lib).
PATH="$(dirname "$PY"):$PATH" "$PY" -m auditwheel repair --wheel-dir "$OUT" \
  --exclude 'libtorch*.so' --exclude 'libc10*.so' --exclude 'libshm.so' \
  --exclude 'libgomp.so.1' --exclude 'libcudart.so.*' "$raw" >"$work/repair.log" 2>&1 ||
  { cat "$work/repair.log" >&2; exit 1; }
wheel=$(sed -n 's/^.*Fixed-up wheel written to \(.*\.whl\)$/\1/p' "$work/repair.log")
[ -f "$wheel" ] || { cat "$work/repair.log" >&2; exit 1; }
echo "$wheel"
