#!/usr/bin/env bash
# clang-tidy with the repository's .clang-tidy over the sources of host/ (or of the folders
# given), with build/release's compile commands (configure it first: scripts/build.sh release).
#   scripts/tidy.sh                 all of host/
#   scripts/tidy.sh host/engine     host/engine only (what CI runs, .ci/run)
# A function over readability-function-size's limit fails unless scripts/tidy-baseline.txt names
# it (file and function: the known ones, being split up); every other finding fails. A baseline
# entry that no longer offends is reported, so the list only shrinks.
# KILN_TIDY_JOBS: clang-tidy processes at once (default: the CPU count).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${KILN_TIDY_BUILD:-build/release}"
BASELINE=scripts/tidy-baseline.txt
JOBS="${KILN_TIDY_JOBS:-$(nproc)}"
(($#)) || set -- host
if [ ! -f "$BUILD/compile_commands.json" ]; then
  echo "tidy: no $BUILD/compile_commands.json (scripts/build.sh release configures it)" >&2
  exit 1
fi
command -v clang-tidy >/dev/null || { echo "tidy: clang-tidy is missing (scripts/setup.sh)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A copy of the compile commands clang can use: GCC's precompiled header is no PCH to clang, so
# the PCH's header is included as text from a copy with no .gch beside it; -Werror is dropped
# (clang's own warnings are not what this checks). One entry per source in the folders given.
python3 - "$BUILD" "$work" "$PWD" "$@" <<'PY'
import json, os, shlex, shutil, sys
build, work, root, folders = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
prefixes = [os.path.join(root, f.rstrip("/")) + "/" for f in folders]
seen, entries = set(), []
for e in json.load(open(os.path.join(build, "compile_commands.json"))):
    path = os.path.normpath(os.path.join(e["directory"], e["file"]))
    if path in seen or not any(path.startswith(p) for p in prefixes):
        continue
    seen.add(path)
    args = shlex.split(e["command"])
    out = []
    for i, a in enumerate(args):
        if a in ("-Werror", "-Winvalid-pch"):
            continue
        if i > 0 and args[i - 1] == "-include" and a.endswith("cmake_pch.hxx"):
            copy = os.path.join(work, "pch%d.hxx" % len(entries))
            shutil.copy(a, copy)
            a = copy
        out.append(a)
    entries.append(dict(directory=e["directory"], file=path, command=shlex.join(out)))
json.dump(entries, open(os.path.join(work, "compile_commands.json"), "w"), indent=1)
open(os.path.join(work, "files"), "w").write("".join(e["file"] + "\0" for e in entries))
PY
count=$(tr -cd '\0' <"$work/files" | wc -c)
echo "tidy: $count files in $* ($JOBS at a time)"
mkdir "$work/out"
# Every file's findings in a log of its own; the exit status says whether clang-tidy itself failed.
xargs -0 -P "$JOBS" -n 1 sh -c \
  'log="$0/out/$(echo "$1" | tr / _)"; clang-tidy -p "$0" --quiet "$1" >"$log" 2>&1; echo $? >"$log.rc"' \
  "$work" <"$work/files"

python3 - "$work" "$PWD" "$BASELINE" "$@" <<'PY'
import glob, os, re, sys
work, root, baseline_path, folders = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
diag = re.compile(r"^(/[^:]+):(\d+):(\d+): (warning|error): (.*) \[([^\]]+)\]$")
noise = re.compile(r"^\d+ warnings? (generated|treated as errors)|^Suppressed \d+|^Use -header-filter")
known = set()
for line in open(baseline_path):
    line = line.split("#", 1)[0].split()
    if line:
        known.add((line[0], line[1]))
findings, oversized, broken = {}, set(), []
for log in sorted(glob.glob(os.path.join(work, "out", "*"))):
    if log.endswith(".rc"):
        continue
    text = open(log, errors="replace").read()
    rc = int(open(log + ".rc").read())
    current, any_found = None, False
    for line in text.splitlines():
        m = diag.match(line)
        if m:
            path, row, col, _, message, checks = m.groups()
            rel = os.path.relpath(path, root)
            current = (rel, int(row), message)
            any_found = True
            name = re.match(r"function '(.+)' exceeds", message)
            if checks.startswith("readability-function-size") and name and (rel, name.group(1)) in known:
                oversized.add((rel, name.group(1)))
                current = None
            elif current not in findings:
                findings[current] = [line.replace(root + "/", "")]
            else:
                current = None  # a header's finding, met again from another source
        elif current and not noise.match(line):  # the source line, the caret, notes
            findings[current].append(line.replace(root + "/", ""))
    if rc != 0 and not any_found:
        broken.append(text)
for text in broken:
    print(text.rstrip())
for key in sorted(findings):
    print("\n".join(findings[key]))
for f, n in sorted(known):
    checked = any(f.startswith(d.rstrip("/") + "/") for d in folders)
    if checked and (f, n) not in oversized:
        print("tidy: %s %s is no longer over the limit; take it out of %s" % (f, n, baseline_path))
if findings or broken:
    print("tidy: %d finding(s)%s" % (len(findings), ", %d file(s) clang-tidy could not check" % len(broken) if broken else ""))
    sys.exit(1)
print("tidy: ok (%d known function(s) over the size limit, listed in %s)" % (len(oversized), baseline_path))
PY
