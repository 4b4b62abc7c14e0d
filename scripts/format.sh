#!/usr/bin/env bash
# clang-format over every tracked C, C++ and CUDA source with the repository's .clang-format.
#   scripts/format.sh           rewrite the files that drift
#   scripts/format.sh --check   change nothing; list the files that drift and fail if any does
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT="${CLANG_FORMAT:-clang-format}"
mode=fix
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: scripts/format.sh [--check]" >&2; exit 2 ;;
esac

mapfile -d '' files < <(git ls-files -z -- '*.c' '*.h' '*.cc' '*.cpp' '*.cxx' '*.hpp' '*.hh' \
                                          '*.hxx' '*.inl' '*.cu' '*.cuh')
if [ "$mode" = fix ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -r -n 50 "$CLANG_FORMAT" -i --style=file
  exit 0
fi
# --dry-run reports each drifting spot as "FILE:LINE:COL: error: code should be clang-formatted"
# and exits 0; a non-zero exit is clang-format itself failing.
report=$(printf '%s\0' "${files[@]}" | xargs -0 -r -n 100 "$CLANG_FORMAT" --style=file --dry-run 2>&1) ||
  { echo "$report" >&2; echo "format: $CLANG_FORMAT failed" >&2; exit 1; }
mapfile -t drift < <(sed -n 's/^\(.*\):[0-9]*:[0-9]*: [a-z]*: code should be clang-formatted.*/\1/p' \
                       <<<"$report" | sort -u)
if ((${#drift[@]})); then
  echo "format: ${#drift[@]} file(s) differ from .clang-format (fix: scripts/format.sh):" >&2
  printf '  %s\n' "${drift[@]}" >&2
  exit 1
fi
echo "format: ${#files[@]} files ok"
