#!/usr/bin/env bash
# README command 1 (scripts/quickstart.sh) builds every file `cmake --install` copies out of the
# build, so the README's install, find_package(Kiln), libkiln and Python paths work after it
# alone. Compares the files the install rules name (cmake_install.cmake) that the build makes
# (ninja's outputs) with everything the quickstart's build targets depend on (ninja's graph).
# Usage: quickstart_installable.sh <kiln build dir (Ninja)> <kiln source dir> [ninja]
set -euo pipefail
build=$(cd "$1" && pwd)
src=$2
ninja=${3:-ninja}

line=$(grep -E '^scripts/build\.sh release ' "$src/scripts/quickstart.sh") ||
  { echo "scripts/quickstart.sh has no 'scripts/build.sh release <targets>' line"; exit 1; }
read -r -a targets <<<"${line#scripts/build.sh release }"
[ "${#targets[@]}" -gt 0 ] || { echo "scripts/quickstart.sh builds everything: nothing to check"; exit 0; }

# Every build-tree path the install scripts name (the files they copy, and other scripts they
# include), relative to the build tree.
installed=$(grep -rhoE "\"$build/[^\"]+\"" --include=cmake_install.cmake "$build" | tr -d '"' |
  sed "s|^$build/||" | sort -u)
[ -n "$installed" ] || { echo "no install rules found under $build"; exit 1; }
# Of those, the ones the build makes (configure-time files such as KilnConfig.cmake always exist).
made=$("$ninja" -C "$build" -t targets all | sed -E 's/: [^:]+$//' | sort -u)
need=$(comm -12 <(echo "$installed") <(echo "$made"))
# Everything the quickstart's targets build, directly or through their dependencies: the graph's
# files, and the words of its commands (an edge's other outputs, such as libkiln.so.1 beside
# libkiln.so, appear only in its command).
built=$( ("$ninja" -C "$build" -t graph "${targets[@]}" | grep -oE 'label="[^"]+"' |
  sed -E 's/^label="(.*)"$/\1/'
  "$ninja" -C "$build" -t commands "${targets[@]}" | tr -s ' ;' '\n\n' | sed "s|^$build/||") | sort -u)
missing=$(comm -23 <(echo "$need") <(echo "$built"))
if [ -n "$missing" ]; then
  echo "scripts/quickstart.sh builds '${targets[*]}', which leaves out what cmake --install copies:"
  echo "$missing"
  exit 1
fi
echo "scripts/quickstart.sh (${targets[*]}) builds all $(echo "$need" | wc -l) built files cmake --install copies"
