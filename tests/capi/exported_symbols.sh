#!/usr/bin/env bash
# libkiln's dynamic symbol table (symbol-version nodes aside) equals the checked-in list (host/capi/libkiln.symbols): a new
# export is a deliberate API change, never an accident of visibility.
# Usage: exported_symbols.sh <libkiln.so> <symbols file>
set -euo pipefail
lib=$1 list=$2
actual=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | sed 's/@.*//' | sort -u)
expected=$(grep -v '^#' "$list" | sed '/^$/d' | sort -u)
if [ "$actual" != "$expected" ]; then
  echo "exported symbols of $lib differ from $list:"
  diff <(echo "$expected") <(echo "$actual") || true
  exit 1
fi
echo "exported symbols of $lib: $(echo "$actual" | tr '\n' ' ')(as listed)"
