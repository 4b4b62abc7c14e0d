#!/usr/bin/env bash
# The wheel (docs/install.md), as a user gets it: scripts/wheel.sh packs this build tree into
# kiln-train; a fresh venv holding torch alone installs it offline (pip resolves its
# torch==2.11.0 against the torch already there); then, from a folder outside the checkout and
# with no KILN_LIBRARY, PYTHONPATH or LD_LIBRARY_PATH: every ELF file's search path is
# $ORIGIN-relative and reaches torch in that venv, every library it loads is the wheel's, torch's
# or one manylinux lets a wheel take from the system (the wheel's tag), `kiln version`, `kiln plugins list` (none refused), a plain-C
# plugin built against the wheel's CMake package (python -m kiln --cmake-prefix) and a program
# against its kiln.pc, `kiln run` of a quickstart-like pipeline on small IDX files written here
# with that plugin, a session through the Python binding, and the binding's example.
#
# The fresh venv does not download torch: torch and the closure of its requirements (nvidia-*,
# sympy, ...) in <python>'s venv are linked into its site-packages, where pip sees them installed
# and where the wheel's relative RUNPATHs ($ORIGIN/../../torch/lib) look for them.
# Usage: wheel.sh <kiln build dir> <kiln source dir> <python of the venv holding torch>
# KILN_TEST_WHEEL=<file.whl> tests that wheel instead of packing the build tree (the build tree
# still gives the plugin SDK's example its source).
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
py=$3
work=$(mktemp -d /tmp/kiln-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "wheel: $*" >&2; exit 1; }
start=$SECONDS

# ---- the wheel ----
if [ -n "${KILN_TEST_WHEEL:-}" ]; then  # a wheel built otherwise (e.g. `pip wheel .`)
  wheel=$KILN_TEST_WHEEL
else
  wheel=$(KILN_PYTHON="$py" "$src/scripts/wheel.sh" "$build" "$work/dist" 2>"$work/wheel.log") ||
    fail "scripts/wheel.sh: $(tail -30 "$work/wheel.log")"
fi
[ -f "$wheel" ] || fail "scripts/wheel.sh printed '$wheel', not a file"
echo "built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB) in $((SECONDS - start)) s"
"$py" - "$wheel" <<'PY'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = set(z.namelist())
need = ["kiln/__init__.py", "kiln/_capi.py", "kiln/_cli.py", "kiln/__main__.py", "kiln/bin/kiln",
        "kiln/lib/libkiln.so.1", "kiln/lib/libkiln_plot.so", "kiln/lib/kiln/plugins/libkiln_sgd.so", "kiln/include/kiln/kiln.h",
        "kiln/include/kiln/plugin.h", "kiln/lib/cmake/Kiln/KilnConfig.cmake",
        "kiln/lib/pkgconfig/kiln.pc", "kiln/lib/pkgconfig/kiln-sdk.pc"]
missing = [n for n in need if n not in names]
assert not missing, f"not in the wheel: {missing}"
# One libkiln file (a wheel would hold each symbolic link as a copy).
libs = sorted(n for n in names if n.startswith("kiln/lib/libkiln."))
assert libs == ["kiln/lib/libkiln.so.1"], libs
info = next(n for n in names if n.endswith(".dist-info/METADATA"))
meta = z.read(info).decode()
assert "Name: kiln-train" in meta and "Requires-Dist: torch==2.11.0" in meta, meta
eps = z.read(info.replace("METADATA", "entry_points.txt")).decode()
assert "kiln = kiln._cli:main" in eps, eps
# auditwheel's repair: a manylinux tag, and Debian's libraries inside (Boost, spdlog, fmt, ...).
assert re.search(r"-py3-none-manylinux_2_\d+_x86_64\.whl$", sys.argv[1]), sys.argv[1]
vendored = [n for n in names if n.startswith("kiln_train.libs/")]
assert any("libspdlog" in n for n in vendored), sorted(vendored)
PY

# ---- a fresh venv holding torch alone ----
"$py" -m venv --without-pip "$work/venv"
vpy=$work/venv/bin/python
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$py" - "$site" <<'PY'
import importlib.metadata as md, os, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
# (distribution, extra) pairs: cuda-toolkit[cublas,cudart,...] brings nvidia-* through extras.
pending, seen, dists = [("torch", "")], set(), {}
while pending:
    name, extra = pending.pop()
    name = canonicalize_name(name)
    if (name, extra) in seen:
        continue
    seen.add((name, extra))
    dists[name] = dist = md.distribution(name)
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            pending += [(req.name, "")] + [(req.name, e) for e in req.extras]
tops = set()
for dist in dists.values():
    home = os.path.realpath(dist.locate_file(""))
    for f in dist.files or []:
        if f.parts[0] not in ("..", "__pycache__"):
            tops.add(os.path.join(home, f.parts[0]))
for path in sorted(tops):
    os.symlink(path, os.path.join(sys.argv[1], os.path.basename(path)))
print(f"fresh venv: {len(dists)} distributions linked (torch and its requirements)")
PY
# pip of <python>'s venv installs into the fresh one (--python): offline, the wheel alone.
"$py" -m pip --python "$vpy" install --no-index --no-cache-dir --quiet "$wheel" >"$work/pip.log" 2>&1 ||
  fail "pip install --no-index: $(cat "$work/pip.log")"
"$py" -m pip --python "$vpy" list >"$work/pip-list.txt" 2>&1 || fail "pip list: $(cat "$work/pip-list.txt")"
grep -Eq '^kiln-train +[0-9]' "$work/pip-list.txt" ||
  fail "kiln-train not in the fresh venv: $(cat "$work/pip-list.txt")"
pkg=$site/kiln

# From here on: the fresh venv's bin on PATH, no path given by hand, outside the checkout.
export PATH="$work/venv/bin:$PATH"
unset KILN_LIBRARY PYTHONPATH LD_LIBRARY_PATH KILN_PLUGIN_PATH VIRTUAL_ENV
mkdir -p "$work/cwd"
cd "$work/cwd"
[ "$(command -v kiln)" = "$work/venv/bin/kiln" ] || fail "kiln on PATH is $(command -v kiln)"

# ---- search paths: $ORIGIN-relative only, reaching the wheel's libraries and torch here ----
# What manylinux lets a wheel of this tag load from the system (auditwheel's own policy).
allowed=" $("$py" - "$wheel" <<'PY'
import json, re, sys
from importlib import resources
tag = re.search(r"-(manylinux_\d+_\d+)_x86_64\.whl$", sys.argv[1]).group(1)
policies = json.loads((resources.files("auditwheel") / "policy" / "manylinux-policy.json").read_text())
print(" ".join(next(p for p in policies if p["name"] == tag)["lib_whitelist"]))
PY
) "
[ "$allowed" != "  " ] || fail "no manylinux policy for $(basename "$wheel")"
vendored=$site/kiln_train.libs
elves=0
while IFS= read -r -d '' f; do
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  elves=$((elves + 1))
  dyn=$(readelf -d "$f")
  # auditwheel writes DT_RPATH where it added its folder; the others keep Kiln's DT_RUNPATH.
  runpath=$(sed -n 's/.*(R\(UN\)\?PATH) *Library r\(un\)\?path: \[\(.*\)\]$/\3/p' <<<"$dyn")
  [ -n "$runpath" ] || [[ $f == "$vendored"/* ]] || fail "$f has no RPATH or RUNPATH"
  [ "$(grep -c -E '\((RPATH|RUNPATH)\)' <<<"$dyn")" -le 1 ] || fail "$f has both RPATH and RUNPATH"
  entries=()
  [ -z "$runpath" ] || IFS=: read -r -a entries <<<"$runpath"
  for e in ${entries[@]+"${entries[@]}"}; do
    case $e in
      '$ORIGIN'*) ;;
      *) fail "$f: RUNPATH entry '$e' is not \$ORIGIN-relative (RUNPATH $runpath)" ;;
    esac
    dir=$(realpath -s -m "$(dirname "$f")${e#\$ORIGIN}")  # lexically: through the venv's links
    case $dir in
      "$pkg/lib" | "$site/torch/lib" | "$site"/nvidia/*/lib | "$vendored") ;;
      *) fail "$f: RUNPATH entry $e is $dir, outside the wheel's lib and torch's wheels" ;;
    esac
    [ -d "$dir" ] || fail "$f: RUNPATH entry $e: no folder $dir"
  done
  env -u LD_LIBRARY_PATH ldd "$f" >"$work/ldd.txt" 2>&1 || fail "ldd $f: $(cat "$work/ldd.txt")"
  ! grep -q 'not found' "$work/ldd.txt" || fail "$f: $(grep 'not found' "$work/ldd.txt")"
  needed=" $(sed -n 's/.*(NEEDED) *Shared library: \[\(.*\)\]$/\1/p' <<<"$dyn" | tr '\n' ' ')"
  while read -r soname _ path _; do
    # What the file itself needs (a system library's own needs are the system's).
    if [[ $needed == *" $soname "* ]]; then
      case $(realpath -s "$path") in
        "$pkg"/* | "$vendored"/* | "$site"/torch/* | "$site"/nvidia/*) ;;
        *) [[ $allowed == *" $soname "* ]] ||
             fail "$f: $soname resolves to $path, outside the wheel and torch, and manylinux does not allow it" ;;
      esac
    fi
    case $soname in
      libtorch*.so | libc10*.so | libcudart.so.*)
        real=$(realpath -s "$path")
        case $real in
          "$site"/torch/lib/* | "$site"/nvidia/*) ;;
          *) fail "$f: $soname resolves to $path, not to the fresh venv's torch ($site)" ;;
        esac
        ;;
    esac
  done < <(grep '=> /' "$work/ldd.txt")
done < <(find "$pkg" "$vendored" -type f -print0)
[ "$elves" -ge 3 ] || fail "only $elves ELF files in the wheel"
echo "search paths of $elves ELF files: \$ORIGIN-relative, torch from the fresh venv, the rest the wheel's or manylinux's"

# ---- the kiln command ----
kiln version >version.txt || fail "kiln version failed"
grep -q '^kiln ' version.txt || fail "kiln version: $(cat version.txt)"
kiln plugins list >plugins.txt 2>plugins.err || fail "kiln plugins list: $(cat plugins.err)"
! grep -qi refused plugins.err || fail "plugins refused: $(cat plugins.err)"
for p in "$pkg"/lib/kiln/plugins/*.so; do
  grep -qF " $p" plugins.txt || fail "plugins list does not show $p: $(cat plugins.txt)"
done
! grep -qF "$build" plugins.txt || fail "plugins loaded from the build tree: $(cat plugins.txt)"
[ "$(python -m kiln --library)" = "$pkg/lib/libkiln.so.1" ] ||
  fail "python -m kiln --library: $(python -m kiln --library 2>&1)"

# ---- a plugin against the wheel's CMake package, a program against its kiln.pc ----
prefix=$(python -m kiln --cmake-prefix)
[ "${prefix%%;*}" = "$pkg" ] || fail "python -m kiln --cmake-prefix: $prefix"
cmake -S "$src/examples/lr_policy_c" -B plugin -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >plugin.log 2>&1 || fail "plugin configure: $(tail -20 plugin.log)"
cmake --build plugin >>plugin.log 2>&1 || fail "plugin build: $(tail -20 plugin.log)"
kiln plugins --plugin-path plugin describe inverse_sqrt >describe.txt 2>&1 ||
  fail "describe inverse_sqrt: $(cat describe.txt)"
cat >capi.c <<'C'
#include <kiln/kiln.h>
#include <stdio.h>
int main(void) {
  const kiln_api* api = kiln_get_api(KILN_CAPI_VERSION);
  if (!api) return 1;
  printf("libkiln: %s\n", api->version_string());
  return 0;
}
C
export PKG_CONFIG_PATH=$pkg/lib/pkgconfig
# shellcheck disable=SC2046
cc -std=c99 -Wall -Werror capi.c $(pkg-config --cflags --libs kiln) -o capi >cc.log 2>&1 ||
  fail "cc with kiln.pc: $(cat cc.log)"
./capi >capi.txt 2>&1 && grep -q '^libkiln: kiln ' capi.txt || fail "program over kiln.pc: $(cat capi.txt)"

# ---- a quickstart-like pipeline on small IDX files ----
python - data <<'PY'
import gzip, os, random, struct, sys
# Fashion-MNIST's files in miniature: per class a prototype image plus noise, so it can learn.
random.seed(0)
os.makedirs(sys.argv[1])
protos = [bytes(random.randrange(256) for _ in range(784)) for _ in range(10)]
for split, n in (("train", 512), ("t10k", 256)):
    labels = [i % 10 for i in range(n)]
    images = b"".join(bytes(min(255, max(0, p + random.randrange(-60, 61))) for p in protos[c])
                      for c in labels)
    with gzip.open(f"{sys.argv[1]}/{split}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + images)
    with gzip.open(f"{sys.argv[1]}/{split}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(labels))
PY
cat >pipeline.toml <<TOML
[run]
device = "cpu"
epochs = 1
max_steps = 4
seed = 0
checkpoints = false
tensorboard = false
output_dir = "$work/cwd/runs"
[data]
dataset = "fashion-mnist"
root = "$work/cwd/data"
batch_size = 64
workers = 1
random_flip = true
[model]
name = "resnet"
depth = "small"
width = 8
blocks = [1, 1, 1]
[norm]
name = "batchnorm"
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
nesterov = true
[lr_policy]
name = "inverse_sqrt"
offset = 2
[precision]
name = "fp32"
[plugins]
paths = ["$work/cwd/plugin"]
TOML
kiln run pipeline.toml --metrics metrics.jsonl >run.log 2>&1 || fail "kiln run: $(tail -30 run.log)"
steps=$(grep -c '"type":"step"' metrics.jsonl || true)
[ "$steps" = 4 ] || fail "kiln run wrote $steps step records, not 4: $(tail -30 run.log)"
# Plotting loads libkiln_plot (cairo) from the wheel; `kiln` and libkiln start without cairo's
# X11 libraries (a slim container has none).
kiln plot metrics.jsonl --output curves.png >plot.log 2>&1 || fail "kiln plot: $(cat plot.log)"
[ "$(head -c 4 curves.png | od -An -c | tr -d ' ')" = '211PNG' ] || fail "kiln plot wrote no PNG"
for f in "$pkg/bin/kiln" "$pkg/lib/libkiln.so.1"; do
  ! env -u LD_LIBRARY_PATH ldd "$f" | grep -Eq 'lib(X11|cairo)' ||
    fail "$f loads cairo or libX11 at start: $(env -u LD_LIBRARY_PATH ldd "$f" | grep -E 'X11|cairo')"
done
# The README's quickstart file itself, on the small set (the real one is not needed here).
kiln run "$src/configs/quickstart.toml" --set run.max_steps=3 --set run.device='"cpu"' \
  --set data.root="\"$work/cwd/data\"" --set run.output_dir="\"$work/cwd/runs\"" \
  --metrics quickstart.jsonl >quickstart.log 2>&1 || fail "kiln run quickstart.toml: $(tail -30 quickstart.log)"
steps=$(grep -c '"type":"step"' quickstart.jsonl || true)
[ "$steps" = 3 ] || fail "quickstart.toml wrote $steps step records, not 3: $(tail -30 quickstart.log)"

# ---- the Python binding: the bundled libkiln, no KILN_LIBRARY ----
python - pipeline.toml "$pkg" <<'PY'
import os, sys, kiln
from kiln import _capi
pkg = sys.argv[2]
assert os.path.dirname(kiln.__file__) == pkg, kiln.__file__
with kiln.Session.from_file(sys.argv[1], overrides={"run.max_steps": 3}, log_level="warn") as s:
    s.run()
    p = s.progress()
    assert p.state == kiln.FINISHED and p.step == 3, p
assert _capi.library().path == os.path.join(pkg, "lib", "libkiln.so.1"), _capi.library().path
print(f"python binding ({kiln.version()}): {p.step} steps over {_capi.library().path}")
PY

# ---- the binding's examples, run from the checkout: they import the installed package ----
python "$src/bindings/python/examples/train_quickstart.py" --config pipeline.toml --set run.max_steps=0 --set run.epochs=2 \
  --target 1.01 --patience 2 >example.log 2>&1 ||
  fail "train_quickstart.py: $(cat example.log)"
grep -Eq '^epoch 2/2  test accuracy' example.log && grep -q '^finished: 2 epochs, 16 steps' example.log ||
  fail "train_quickstart.py: $(cat example.log)"
python "$src/bindings/python/examples/python_api.py" --synthetic --epochs 1 >api.log 2>&1 ||
  fail "python_api.py: $(cat api.log)"
grep -q "^fresh session: .* after load_state_dict" api.log || fail "python_api.py: $(cat api.log)"
echo "wheel: ok in $((SECONDS - start)) s"
