#!/usr/bin/env bash
# Builds a libFuzzer target (tests/fuzz, clang with ASan and UBSan, its own build folder) and
# fuzzes it for SECONDS (default 60) over a scratch copy of tests/fuzz/corpus/<TARGET>; the
# checked-in corpus never grows by itself. Targets:
#   config            pipeline files and --set overrides, parsed and validated (the default)
#   safetensors       safetensors files (model.init weights, checkpoint tensors)
#   checkpoint_state  a checkpoint's state.toml
#   idx               IDX image and label files, plain or gzip
#   image             JPEG and PNG files as the image_folder dataset probes and decodes them
#   cifar             cifar10 and cifar100 binary files through the dataset's slots
#   image_list        an image_list dataset's CSV list
#   coco              a coco dataset's annotation file (JSON)
#   tensors           a tensors dataset's safetensors file through the dataset's slots
#   all               each of the above in turn, SECONDS each
# Exits 1 on a finding (crash reproducers are left in <build>/artifacts; minimise one with
# `<build>/<TARGET>_fuzz -minimize_crash=1 -runs=10000 FILE` and add it to the target's corpus),
# 77 when clang with libFuzzer is missing (ctest: skipped).
#   scripts/fuzz.sh [SECONDS] [TARGET]   KILN_FUZZ_BUILD_DIR (default build/fuzz), KILN_FUZZ_JOBS (1)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
SECONDS_TO_RUN="${1:-60}"
TARGET="${2:-config}"
BUILD="${KILN_FUZZ_BUILD_DIR:-$ROOT/build/fuzz}"
JOBS="${KILN_FUZZ_JOBS:-1}"
CC_FUZZ="${KILN_FUZZ_CC:-clang}"
CXX_FUZZ="${KILN_FUZZ_CXX:-clang++}"

ALL_TARGETS=(config safetensors checkpoint_state idx image cifar image_list coco tensors)
if [ "$TARGET" = all ]; then
  targets=("${ALL_TARGETS[@]}")
elif [[ " ${ALL_TARGETS[*]} " == *" $TARGET "* ]]; then
  targets=("$TARGET")
else
  echo "fuzz: unknown target '$TARGET' (one of: ${ALL_TARGETS[*]} all)" >&2
  exit 2
fi

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
build_targets=()
for t in "${targets[@]}"; do build_targets+=("${t}_fuzz"); done
cmake --build "$BUILD" -j "$JOBS" --target "${build_targets[@]}"

# The targets link no LibTorch, so LeakSanitizer stays on; UBSan stops at the first report.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
mkdir -p "$BUILD/artifacts"
for t in "${targets[@]}"; do
  # A scratch corpus: libFuzzer adds what it finds here, not to the checked-in seeds.
  work="$BUILD/corpus-run/$t"
  rm -rf "$work"
  mkdir -p "$work"
  cp "tests/fuzz/corpus/$t"/* "$work/"
  # libFuzzer's own default error exit code is 77, which ctest would read as "skipped".
  rc=0
  "$BUILD/${t}_fuzz" "$work" -max_total_time="$SECONDS_TO_RUN" -timeout=10 -rss_limit_mb=2048 \
    -max_len=16384 -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
    -artifact_prefix="$BUILD/artifacts/${t}-" || rc=$?
  if ((rc != 0)); then
    echo "fuzz: $t: finding (exit $rc); reproducers in $BUILD/artifacts:" >&2
    ls -1 "$BUILD/artifacts" >&2 || true
    exit 1
  fi
  echo "fuzz: $t: no findings in ${SECONDS_TO_RUN}s"
done
