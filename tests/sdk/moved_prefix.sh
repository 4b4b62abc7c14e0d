#!/usr/bin/env bash
# A relocatable install: cmake --install into a temporary prefix, move the prefix, and use it from
# its new place — kiln version, plugins list (every built-in plugin, none refused), a short run on
# synthetic data, the Python binding over the moved libkiln. Every installed ELF must find Kiln's
# own libraries through $ORIGIN (first) and torch through the venv's absolute paths only (never
# the first prefix or the build tree), by DT_RUNPATH, so that LD_LIBRARY_PATH naming another
# venv's torch/lib comes first (README.md, "Moving an installed prefix"); and every library the
# torch wheel ships (libcudart included) must come from the wheel, not from a system CUDA toolkit.
# Usage: moved_prefix.sh <kiln build dir> <kiln source dir> <torch lib dir>
set -euo pipefail
build=$(realpath "$1")
src=$2
torch_lib=$(realpath "$3")
site=$(realpath "$torch_lib/../..")  # site-packages: torch/lib and the wheel's nvidia/*/lib
work=$(mktemp -d /tmp/kiln-moved-prefix.XXXXXX)
trap 'rm -rf "$work"' EXIT
first=$work/first
moved=$work/elsewhere/moved
fail() { echo "moved_prefix: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$first" >"$work/install.log"
mkdir -p "$work/elsewhere"
mv "$first" "$moved"
[ ! -e "$first" ] || fail "$first still exists after mv"

# Nothing installed names the first prefix (ELF, CMake package, pkg-config files alike).
if grep -rlF "$first" "$moved" >"$work/named.txt"; then
  fail "installed files name the first prefix $first: $(tr '\n' ' ' <"$work/named.txt")"
fi

libkiln=$moved/lib/libkiln.so
[ -e "$libkiln" ] || fail "no lib/libkiln.so under the prefix"
libdir=$(realpath "$(dirname "$libkiln")")
elves=()
while IFS= read -r -d '' f; do
  if [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ]; then elves+=("$f"); fi
done < <(find "$moved" -type f -print0)
[ "${#elves[@]}" -ge 3 ] || fail "only ${#elves[@]} ELF files installed"

for f in "${elves[@]}"; do
  dyn=$(readelf -d "$f")
  ! grep -q '(RPATH)' <<<"$dyn" || fail "$f has DT_RPATH (LD_LIBRARY_PATH would not come first)"
  runpath=$(sed -n 's/.*(RUNPATH) *Library runpath: \[\(.*\)\]$/\1/p' <<<"$dyn")
  [ -n "$runpath" ] || fail "$f has no RUNPATH"
  IFS=: read -r -a entries <<<"$runpath"
  case ${entries[0]} in
    '$ORIGIN'*) ;;
    *) fail "$f: RUNPATH $runpath does not start with Kiln's \$ORIGIN entry" ;;
  esac
  has_torch=0
  for e in "${entries[@]}"; do
    case $e in
      '$ORIGIN'*)
        # Resolved from the file's own folder, it is the prefix's lib folder.
        dir=$(realpath -m "$(dirname "$f")${e#\$ORIGIN}")
        [ "$dir" = "$libdir" ] || fail "$f: RUNPATH entry $e is $dir, not $libdir"
        ;;
      /*)
        case $e in "$build"* | "$work"*) fail "$f: RUNPATH entry $e is in the build tree or a prefix" ;; esac
        real=$(realpath -m "$e")
        case $real in "$site"/*) ;; *) fail "$f: RUNPATH entry $e is not in torch's venv ($site)" ;; esac
        [ "$real" = "$torch_lib" ] && has_torch=1
        ;;
      *) fail "$f: RUNPATH entry '$e' is neither \$ORIGIN-relative nor absolute" ;;
    esac
  done
  [ $has_torch = 1 ] || fail "$f: RUNPATH $runpath lacks torch's lib dir $torch_lib"
  # Whatever the torch wheel ships, the loader takes from the wheel (one copy of the CUDA runtime,
  # the one torch was built with; present on a machine with the wheel and no CUDA toolkit).
  env -u LD_LIBRARY_PATH ldd "$f" >"$work/ldd.txt" || fail "ldd $f: $(cat "$work/ldd.txt")"
  ! grep -q 'not found' "$work/ldd.txt" || fail "$f: $(grep 'not found' "$work/ldd.txt")"
  while read -r soname _ path _; do
    [ -n "$path" ] || continue
    if compgen -G "$site/torch/lib/$soname" >/dev/null || compgen -G "$site/nvidia/*/lib/$soname" >/dev/null; then
      case $(realpath "$path") in
        "$site"/*) ;;
        *) fail "$f: $soname resolves to $path, not to the copy in torch's wheel under $site" ;;
      esac
    fi
  done < <(grep '=> /' "$work/ldd.txt")
done
echo "RUNPATHs of ${#elves[@]} installed ELF files: \$ORIGIN to $libdir first, then torch's venv"

# The moved kiln runs.
"$moved/bin/kiln" version >"$work/version.txt"
grep -q '^kiln ' "$work/version.txt" || fail "kiln version: $(cat "$work/version.txt")"
"$moved/bin/kiln" plugins list >"$work/plugins.txt" 2>"$work/plugins.err" ||
  fail "plugins list: $(cat "$work/plugins.err")"
! grep -qi refused "$work/plugins.err" || fail "plugins refused: $(cat "$work/plugins.err")"
for p in "$moved"/lib/kiln/plugins/*.so; do
  grep -qF " $p" "$work/plugins.txt" || fail "plugins list does not show $p: $(cat "$work/plugins.txt")"
done
! grep -qF "$build" "$work/plugins.txt" || fail "plugins loaded from the build tree: $(cat "$work/plugins.txt")"

cat >"$work/pipeline.toml" <<TOML
[run]
device = "cpu"
epochs = 1
max_steps = 3
eval = false
checkpoints = false
tensorboard = false
output_dir = "$work/out"
[data]
dataset = "synthetic"
synthetic_train = 256
batch_size = 32
workers = 0
[model]
name = "mlp"
hidden = [16]
[optimizer]
name = "sgd"
lr = 0.1
TOML
(cd "$work" && "$moved/bin/kiln" run "$work/pipeline.toml" --metrics "$work/metrics.jsonl") \
  >"$work/run.log" 2>&1 || fail "kiln run: $(cat "$work/run.log")"
steps=$(grep -c '"type":"step"' "$work/metrics.jsonl" || true)
[ "$steps" = 3 ] || fail "kiln run wrote $steps step records, not 3: $(cat "$work/run.log")"

# The Python binding over the moved libkiln (which finds the plugins beside itself).
KILN_LIBRARY="$libkiln" PYTHONPATH="$src/bindings/python" python3 - "$work/pipeline.toml" "$moved" <<'PY'
import sys, kiln
with kiln.Session.from_file(sys.argv[1], log_level="warn") as s:
    s.run()
    p = s.progress()
    assert p.state == "finished" and p.step == 3, p
print(f"moved libkiln ({kiln.version()}): {p.step} steps")
PY

# Torch from another venv (here a second path to the same one): LD_LIBRARY_PATH is searched before
# DT_RUNPATH, so the loader takes torch — and the wheel's CUDA runtime — from there.
ln -s "$site" "$work/other-venv"
other=$work/other-venv/torch/lib
for d in "$site"/nvidia/*/lib; do
  if compgen -G "$d/libcudart.so.*" >/dev/null; then other=$other:$work/other-venv/${d#"$site"/}; fi
done
LD_LIBRARY_PATH=$other ldd "$moved/bin/kiln" >"$work/ldd-other.txt"
grep -qF "libtorch.so => $work/other-venv/torch/lib/libtorch.so" "$work/ldd-other.txt" ||
  fail "LD_LIBRARY_PATH=$other did not supply libtorch: $(grep libtorch "$work/ldd-other.txt")"
if grep -q 'libcudart' "$work/ldd-other.txt"; then
  grep -q "libcudart.* => $work/other-venv/" "$work/ldd-other.txt" ||
    fail "LD_LIBRARY_PATH=$other did not supply libcudart: $(grep libcudart "$work/ldd-other.txt")"
fi
LD_LIBRARY_PATH=$other "$moved/bin/kiln" plugins list >"$work/plugins-other.txt" 2>&1 ||
  fail "plugins list with LD_LIBRARY_PATH=$other: $(cat "$work/plugins-other.txt")"
echo "moved_prefix: ok ($moved)"
