#!/usr/bin/env bash
# Builds the pipeline-config libFuzzer target (tests/fuzz, clang, its own build folder) and
# fuzzes it for SECONDS (default 60) over a scratch copy of tests/fuzz/corpus; the checked-in
# corpus never grows by itself. Exits 1 on a finding (crash reproducers are left in
# <build>/artifacts; minimise one with `<build>/config_fuzz -minimize_crash=1 -runs=10000 FILE`
# and add it to tests/fuzz/corpus), 77 when clang with libFuzzer is missing (ctest: skipped).
#   scripts/fuzz.sh [SECONDS]     KILN_FUZZ_BUILD_DIR (default build/fuzz), KILN_FUZZ_JOBS (1)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
SECONDS_TO_RUN="${1:-60}"
BUILD="${KILN_FUZZ_BUILD_DIR:-$ROOT/build/fuzz}"
JOBS="${KILN_FUZZ_JOBS:-1}"
CC_FUZZ="${KILN_FUZZ_CC:-clang}"
CXX_FUZZ="${KILN_FUZZ_CXX:-clang++}"

probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
  >"$probe_dir/probe.cpp"
if ! command -v "$CXX_FUZZ" >/dev/null ||
   ! "$CXX_FUZZ" -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cpp" -o "$probe_dir/probe" \
     2>/dev/null; then
  echo "fuzz: $CXX_FUZZ with libFuzzer is not available (Debian: clang libclang-rt-dev); skipped"
  exit 77
fi

export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S tests/fuzz/standalone -B "$BUILD" -G Ninja -DCMAKE_C_COMPILER="$CC_FUZZ" \
    -DCMAKE_CXX_COMPILER="$CXX_FUZZ" >/dev/null
fi
cmake --build "$BUILD" -j "$JOBS"

# A scratch corpus: libFuzzer adds what it finds here, not to the checked-in seeds.
work="$BUILD/corpus-run"
rm -rf "$work"
mkdir -p "$work" "$BUILD/artifacts"
cp tests/fuzz/corpus/* "$work/"

# The target links no LibTorch, so LeakSanitizer stays on; UBSan stops at the first report.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# libFuzzer's own default error exit code is 77, which ctest would read as "skipped".
rc=0
"$BUILD/config_fuzz" "$work" -max_total_time="$SECONDS_TO_RUN" -timeout=10 -rss_limit_mb=2048 \
  -max_len=16384 -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
  -artifact_prefix="$BUILD/artifacts/" || rc=$?
if ((rc != 0)); then
  echo "fuzz: finding (exit $rc); reproducers in $BUILD/artifacts:" >&2
  ls -1 "$BUILD/artifacts" >&2 || true
  exit 1
fi
echo "fuzz: no findings in ${SECONDS_TO_RUN}s"
