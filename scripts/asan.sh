#!/usr/bin/env bash
# Builds the asan preset (AddressSanitizer + UBSan, Debug) and runs its tests.
#   scripts/asan.sh                 everything, then the whole suite
#   scripts/asan.sh TARGET...       only these targets (and what they depend on), then the tests
#                                   of the test binaries among them
# KILN_ASAN_JOBS sets the build's parallelism (default: the generator's). Extra ctest arguments
# go in KILN_ASAN_CTEST_ARGS (e.g. "-R Config -j2").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build/asan

export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"

[ -f "$BUILD/build.ninja" ] || cmake --preset asan >/dev/null
jobs=()
[ -n "${KILN_ASAN_JOBS:-}" ] && jobs=(-j "$KILN_ASAN_JOBS")
if (($#)); then
  cmake --build --preset asan "${jobs[@]}" --target "$@"
else
  cmake --build --preset asan "${jobs[@]}"
fi

# LeakSanitizer stays on: LibTorch is not instrumented, but its allocations go through ASan's
# malloc, and a training run (`kiln run`) and precision_test exit with no leak report from it.
# fontconfig (under cairo, for the LR plot) keeps its caches until FcFini, which cairo never
# calls: suppressed, as its own allocations only.
cat >"$BUILD/lsan.supp" <<'SUPP'
leak:libfontconfig.so
SUPP

# halt_on_error: the first report fails the test (ASan halts anyway; UBSan would go on).
# protect_shadow_gap=0: CUDA maps device memory into the address range ASan reserves as its
# shadow gap; without it CUDA initialisation fails under ASan on GPU machines.
# Nothing goes into LD_PRELOAD: GCC links libasan into every instrumented binary itself, so the
# Python oracle scripts the tests spawn (uninstrumented) run exactly as they would otherwise.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:protect_shadow_gap=0"
export LSAN_OPTIONS="suppressions=$PWD/$BUILD/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
unset LD_PRELOAD

ctest_args=(--preset asan)
# The fuzz target carries its own sanitizers and build (scripts/fuzz.sh); here it would only be
# built a second time.
ctest_args+=(-LE fuzz)
# With a subset built, the test binaries that were not show up as <name>_NOT_BUILT; skip them.
(($#)) && ctest_args+=(-E _NOT_BUILT)
# shellcheck disable=SC2206
ctest_args+=(${KILN_ASAN_CTEST_ARGS:-})
ctest "${ctest_args[@]}"
