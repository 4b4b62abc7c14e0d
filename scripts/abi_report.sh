#!/usr/bin/env bash
# libkiln's ABI against the last release, with libabigail (Debian: abigail-tools).
#
#   scripts/abi_report.sh [BUILD_DIR]            report: abidiff of BUILD_DIR/lib/libkiln.so
#                                                against sdk/abi/libkiln.abi (the last release)
#   scripts/abi_report.sh --update [BUILD_DIR]   at a release: record this build as the baseline
#
# Only the public C API counts: abidw/abidiff read the types behind the exported symbol
# (kiln_get_api and the kiln_api table it returns) from DWARF (--exported-interfaces-only;
# libkiln's C API files are built with -g), not libkiln's internals.
# Exit status is abidiff's: 0 unchanged; 4 (ABIDIFF_ABI_CHANGE) a change to review: an
# appended kiln_api slot is compatible, a moved or retyped field is not; 8 or more
# (ABIDIFF_ABI_INCOMPATIBLE_CHANGE) a removed interface. Either needs the rules of docs/abi.md
# ("The C API") and a new baseline in the same commit. The suite's capi_abi_report test wants 0.
# The report is also written to BUILD_DIR/abi-report.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
update=0
if [ "${1:-}" = "--update" ]; then update=1; shift; fi
build=${1:-build/release}
lib="$build/lib/libkiln.so"
baseline=sdk/abi/libkiln.abi
for tool in abidw abidiff; do
  command -v "$tool" >/dev/null || { echo "abi_report: $tool not found (apt-get install abigail-tools)" >&2; exit 2; }
done
[ -e "$lib" ] || { echo "abi_report: $lib not built (scripts/build.sh)" >&2; exit 2; }

if [ "$update" = 1 ]; then
  abidw --no-corpus-path --no-show-locs --exported-interfaces-only --out-file "$baseline" "$lib"
  echo "abi_report: baseline $baseline recorded from $lib ($(git describe --always --dirty))"
  exit 0
fi
[ -e "$baseline" ] || { echo "abi_report: no baseline $baseline (run with --update at a release)" >&2; exit 2; }
set +e
abidiff --exported-interfaces-only "$baseline" "$lib" > "$build/abi-report.txt"
rc=$?
set -e
cat "$build/abi-report.txt"
case $rc in
  0) echo "abi_report: libkiln's ABI is unchanged since the baseline" ;;
  *) if (( rc & 8 )); then echo "abi_report: INCOMPATIBLE changes (abidiff status $rc)";
     elif (( rc & 4 )); then echo "abi_report: ABI changes to review (abidiff status $rc)";
     else echo "abi_report: abidiff failed (status $rc)"; fi ;;
esac
exit $rc
