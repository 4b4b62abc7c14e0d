#!/usr/bin/env bash
# Builds and tests Kiln on the GPU machine of the device tool (docs/device.md), which has CUDA,
# cmake, ninja and a python3 with torch 2.11 but no network and none of our Debian libraries.
#
#   scripts/device_build.sh fetch               HERE (Debian 12, network): apt-get download the
#                                               .debs below into .devkit/debs (git-ignored;
#                                               carry `.devkit` in the device call), and copy
#                                               Fashion-MNIST into .devdata (the precision
#                                               phase's call carries it)
#   scripts/device_build.sh build [BUILD_DIR]   THERE: dpkg -x the .debs into $KILN_DEPS_PREFIX
#                                               (default /tmp/kiln-deps, never /), configure
#                                               (Ninja, RelWithDebInfo as the release preset,
#                                               sm_90) into BUILD_DIR (default build/device), and
#                                               ninja with all cores
#   scripts/device_build.sh configure [BUILD_DIR]
#                                               the same without ninja
#   scripts/device_build.sh test [BUILD_DIR] [CTEST ARGS...]
#                                               ctest -j16 --output-on-failure in that environment
#   scripts/device_build.sh exec CMD [ARGS...]  runs CMD in that environment (LD_LIBRARY_PATH for
#                                               the extracted libraries, pkg-config, fonts), e.g.
#                                               a bench: ... exec python3 bench/memory.py ...
#   scripts/device_build.sh env                 prints that environment as shell exports
#   scripts/device_build.sh pack                HERE: builds the release preset and installs it,
#                                               stripped (~6 MiB), into .devkit/prebuilt with a
#                                               stamp of the sources it was built from
#   scripts/device_build.sh prebuilt            THERE: prints the prebuilt kiln's path when its
#                                               stamp matches the sources sent and it loads all
#                                               its plugins against this machine's torch; else
#                                               says why and exits 1 (then build)
#
# build and test are incremental: a second `build` on the same (still warm) machine skips the
# extraction and the configure and resumes ninja where an interrupted call stopped. Logs go to
# BUILD_DIR/device-{configure,build,test}.log, and also into $OUT when it is set (the device tool
# brings $OUT back).
#
# The packages (exact versions installed on this Debian 12 machine, so headers, libraries and
# CMake/pkg-config files agree with what the CPU build uses). Chosen by reading every
# find_package / pkg_check_modules / #include of the tree and `apt-cache depends` / `dpkg -L`:
#   libboost1.74-dev                headers (dll, property_tree, crc, optional, filesystem) and
#                                   BoostConfig / boost_headers CMake files (9 MB of the total)
#   libboost-filesystem1.74-dev     Boost::filesystem's CMake file and .so link; its config needs
#   libboost-filesystem1.74.0       only boost_headers (no boost_system); the runtime library
#   libtomlplusplus-dev/-3          pkg-config tomlplusplus, compiled TOML++ (TOML_HEADER_ONLY=0)
#   libspdlog-dev, libspdlog1.10    spdlog (compiled, SPDLOG_FMT_EXTERNAL) ...
#   libfmt-dev, libfmt9             ... and the fmt 9 it was built with (the include shim's fmt)
#   libgtest-dev                    GTestConfig + static libgtest(_main).a; GMock is included
#                                   OPTIONAL by GTestConfig and Kiln uses none: no libgmock-dev
#   libcli11-dev, libdlpack-dev     header-only (CLI11Config; <dlpack/dlpack.h> in kiln/abi.h)
#   libgloo-dev                     headers only, for torch's ProcessGroupGloo.hpp; nothing links
#                                   -lgloo (torch carries its own gloo), so no libgloo0 (and none
#                                   of its hiredis / ibverbs dependencies)
#   libcairo2-dev, libcairo2        cairo.h + cairo.pc, and the library
#   libpixman-1-0 libfontconfig1 libfreetype6 libpng16-16 libxcb1 libxcb-render0 libxcb-shm0
#   libxrender1 libx11-6 libxext6 libxau6 libxdmcp6 libbsd0 libmd0 libexpat1 libbrotli1
#   libbz2-1.0                      libcairo2's run-time closure (without libc6/libgcc/libstdc++
#                                   and without fontconfig-config, whose adduser/debconf/passwd
#                                   chain a bare image does not need: a fonts.conf is generated).
#                                   At build time only those the machine's ldconfig lacks go on
#                                   LD_LIBRARY_PATH, so its own (newer) libz/libexpat/... win
#   fonts-dejavu-core               a font for the plots' text (cairo + fontconfig)
#   zlib1g-dev, zlib1g              zlib.h and libz.so (a bare image has the runtime at most)
#   libturbojpeg0-dev, libturbojpeg0
#                                   the image_folder dataset's JPEG decoder (pkg-config
#                                   libturbojpeg: turbojpeg.h and the library)
#   libpng-dev (libpng16-16 above)  its PNG decoder (pkg-config libpng: png.h, libpng16.so)
#   libcsv-dev, libcsv3             the image_list dataset's CSV parser (csv.h, libcsv.so)
#   pkgconf-bin, libpkgconf3        a pkg-config, in case the image has none
# Not carried: the Fashion-MNIST dataset (the tests make their own data; see docs/device.md for
# bench/precision.py), compilers, cmake, ninja, CUDA and torch (the machine has them).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HOME="${HOME:-/root}"
DEBS="$ROOT/.devkit/debs"
PREFIX="${KILN_DEPS_PREFIX:-/tmp/kiln-deps}"
MA=x86_64-linux-gnu

PACKAGES=(
  libboost1.74-dev libboost-filesystem1.74-dev libboost-filesystem1.74.0
  libtomlplusplus-dev libtomlplusplus3
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libgtest-dev libcli11-dev libdlpack-dev libgloo-dev
  libcairo2-dev libcairo2
  libpixman-1-0 libfontconfig1 libfreetype6 libpng16-16 libxcb1 libxcb-render0 libxcb-shm0
  libxrender1 libx11-6 libxext6 libxau6 libxdmcp6 libbsd0 libmd0 libexpat1 libbrotli1 libbz2-1.0
  fonts-dejavu-core
  zlib1g-dev zlib1g
  libturbojpeg0-dev libturbojpeg0 libpng-dev
  libcsv-dev libcsv3
  pkgconf-bin libpkgconf3
)

die() { echo "device_build: ERROR: $*" >&2; exit 1; }
note() { echo "device_build: $*"; }

# ---------------------------------------------------------------------------------------------
fetch() {
  command -v apt-get >/dev/null || die "fetch needs apt-get (run it on the Debian machine)"
  local exclude
  exclude="$(cd "$ROOT" && git rev-parse --git-path info/exclude 2>/dev/null || true)"
  if [ -n "$exclude" ]; then
    case "$exclude" in /*) ;; *) exclude="$ROOT/$exclude" ;; esac
    mkdir -p "$(dirname "$exclude")"
    grep -qxF '/.devkit/' "$exclude" 2>/dev/null || { echo '/.devkit/' >>"$exclude"; note "added /.devkit/ to $exclude"; }
  fi
  local tmp="$ROOT/.devkit/debs.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  local specs=() p v
  for p in "${PACKAGES[@]}"; do
    v=""
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      v="$(dpkg-query -W -f='${Version}' "$p")"
      specs+=("$p=$v")
    else
      note "warning: $p is not installed here; downloading apt's candidate version"
      specs+=("$p")
    fi
  done
  note "downloading ${#specs[@]} packages into .devkit/debs"
  # apt-get download as root warns that it runs unsandboxed; that is harmless here.
  (cd "$tmp" && apt-get download -qq "${specs[@]}" 2>&1 | grep -v "unsandboxed as root") || true
  local got
  got=$(find "$tmp" -maxdepth 1 -name '*.deb' | wc -l)
  if [ "$got" -ne "${#specs[@]}" ]; then
    note "got $got of ${#specs[@]}; retrying one by one (installed version, else apt's candidate)"
    for p in "${specs[@]}"; do
      ls "$tmp/${p%%=*}_"*.deb >/dev/null 2>&1 && continue
      (cd "$tmp" && apt-get download -qq "$p" >/dev/null 2>&1) ||
        { note "warning: $p is no longer in the archive; taking apt's candidate of ${p%%=*}"
          (cd "$tmp" && apt-get download -qq "${p%%=*}" 2>&1 | grep -v "unsandboxed as root") || true
          ls "$tmp/${p%%=*}_"*.deb >/dev/null 2>&1 || die "cannot download ${p%%=*} (apt-get update?)"; }
    done
  fi
  rm -rf "$DEBS"
  mv "$tmp" "$DEBS"
  (cd "$DEBS" && for f in *.deb; do
     printf '%-34s %-30s %8d\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" "$(stat -c %s "$f")"
   done) >"$DEBS/MANIFEST"
  cat "$DEBS/MANIFEST"
  local total
  total=$(cat "$DEBS"/*.deb | wc -c)
  note "$(ls "$DEBS"/*.deb | wc -l) .debs, $((total / 1024)) KiB total, in $DEBS"
  fetch_pylib
  fetch_data
  note "carry '.devkit' in the device call; there: scripts/device_build.sh build && scripts/device_build.sh test"
}

# pytest and what it imports (pure Python, any Python 3), at the versions setup.sh's venv holds,
# into .devkit/pylib: the device's python3 has torch but no pytest, and the Python API's suites
# (capi_python_pytest, capi_python_cuda) run under it. runtime_env puts it on PYTHONPATH.
PYLIB_DISTS=(pytest iniconfig pluggy packaging pygments exceptiongroup tomli)
fetch_pylib() {
  local venv_py="$HOME/.cache/kiln/venv/bin/python" specs=() d v
  [ -x "$venv_py" ] || die "fetch needs scripts/setup.sh's venv ($venv_py) for pytest's versions"
  for d in "${PYLIB_DISTS[@]}"; do
    v="$("$venv_py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$d" 2>/dev/null || true)"
    specs+=("$d${v:+==$v}")
  done
  rm -rf "$ROOT/.devkit/pylib"
  # Pure-Python wheels only (tomli's default one is compiled for this machine's CPython).
  "$venv_py" -m pip install -q --no-deps --target "$ROOT/.devkit/pylib" --only-binary=:all: \
    --implementation py --abi none --platform any --python-version 3.10 "${specs[@]}" ||
    die "cannot download ${specs[*]} from PyPI"
  note "pylib: ${specs[*]} in .devkit/pylib"
}

# Fashion-MNIST for bench/precision.py (device_check.sh's `precision` phase), beside .devkit and
# not in it: with it .devkit would pass the 64 MiB a device call carries.
fetch_data() {
  local src=/usr/share/datasets/fashion-mnist
  if ! ls "$src"/*-ubyte.gz >/dev/null 2>&1; then
    note "warning: no Fashion-MNIST in $src (Debian's dataset-fashion-mnist): no .devdata"
    return 0
  fi
  mkdir -p "$ROOT/.devdata/fashion-mnist"
  cp -u "$src"/*-ubyte.gz "$ROOT/.devdata/fashion-mnist/"
  note "Fashion-MNIST in .devdata/fashion-mnist (for the precision phase)"
}

# ---------------------------------------------------------------------------------------------
check_prefix() {
  case "$PREFIX" in /*) ;; *) die "KILN_DEPS_PREFIX must be an absolute path (got '$PREFIX')" ;; esac
  local real
  real="$(realpath -m "$PREFIX")"
  case "$real" in
    / | /usr | /usr/local | /opt | /tmp | /root | /home | /var | /etc | /lib | /lib64 | "$HOME" | "$ROOT")
      die "refusing to unpack into $real (KILN_DEPS_PREFIX must be a folder of its own, e.g. /tmp/kiln-deps)" ;;
  esac
  PREFIX="$real"
  LIBDIR="$PREFIX/usr/lib/$MA"
}

# Unpacks the .debs (once per set of .debs) and prepares what points into the prefix: absolute
# symlinks and the .pc files rewritten, a pkg-config wrapper, the runtime-lib folder, a fonts.conf.
extract() {
  ls "$DEBS"/*.deb >/dev/null 2>&1 ||
    die "no .deb files in $DEBS: run scripts/device_build.sh fetch first on a machine with network, and carry '.devkit'"
  check_prefix
  local stamp
  stamp="$(cd "$DEBS" && ls -l --time-style=+ ./*.deb | awk '{print $5, $NF}' | sha256sum | cut -c1-16)"
  if [ -f "$PREFIX/.kiln-devkit-stamp" ] && [ "$(cat "$PREFIX/.kiln-devkit-stamp")" = "$stamp" ]; then
    note "dependencies already unpacked in $PREFIX"
  else
    if [ -e "$PREFIX" ]; then
      if [ -f "$PREFIX/.kiln-devkit-stamp" ] || [ -z "$(ls -A "$PREFIX")" ]; then
        rm -rf "$PREFIX"
      else
        die "$PREFIX exists and was not made by this script; remove it or set KILN_DEPS_PREFIX"
      fi
    fi
    mkdir -p "$PREFIX"
    local f n=0
    for f in "$DEBS"/*.deb; do
      if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$f" "$PREFIX" || die "dpkg-deb -x $f failed"
      else  # no dpkg: a .deb is an ar archive holding data.tar.*
        local member tmpd
        member=$(ar t "$f" | grep '^data\.tar') || die "cannot read $f (no dpkg-deb, no ar?)"
        tmpd="$(mktemp -d)"
        (cd "$tmpd" && ar x "$f" "$member") && tar -xf "$tmpd/$member" -C "$PREFIX" ||
          die "cannot unpack $f"
        rm -rf "$tmpd"
      fi
      n=$((n + 1))
    done
    # Absolute symlinks (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) point into the prefix.
    local l t
    while IFS= read -r l; do
      t="$(readlink "$l")"
      case "$t" in /*) ln -sfn "$PREFIX$t" "$l" ;; esac
    done < <(find "$PREFIX" -type l)
    echo "$stamp" >"$PREFIX/.kiln-devkit-stamp"
    note "unpacked $n .debs into $PREFIX ($(du -sh "$PREFIX" | cut -f1))"
  fi

  # pkg-config: the .pc files (in place: CMake's FindPkgConfig also searches CMAKE_PREFIX_PATH's
  # pkgconfig folders) with /usr rewritten to the prefix (idempotent), and without their
  # Requires.private / Libs.private lines (we link shared; cairo's would need glib, X11, ... -dev).
  mkdir -p "$PREFIX/bin"
  local pc pcdirs="$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig"
  for pc in "$LIBDIR"/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] || continue
    sed -i -E -e "s#(^|[=[:space:]'\"]|-I|-L)/usr(/|$|[[:space:]])#\1$PREFIX/usr\2#g" \
              -e '/^Requires\.private:/d' -e '/^Libs\.private:/d' "$pc"
  done
  [ -x "$PREFIX/usr/bin/pkgconf" ] || die "pkgconf missing from the .debs (fetch again)"
  cat >"$PREFIX/bin/pkg-config" <<EOF
#!/bin/sh
# Kiln devkit (scripts/device_build.sh): pkgconf from the .debs, seeing only the prefix's .pc files
# (plus PKG_CONFIG_PATH).
PKG_CONFIG_LIBDIR="$pcdirs"
export PKG_CONFIG_LIBDIR
LD_LIBRARY_PATH="$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$PREFIX/usr/bin/pkgconf" "\$@"
EOF
  chmod +x "$PREFIX/bin/pkg-config"

  # Run time: the prefix's shared libraries that this machine does not have (by soname) go into
  # runtime-lib, which goes on LD_LIBRARY_PATH. The machine's own copies of the others (often
  # newer: libz, libexpat, libpng, ...) stay in use, also for the Python oracles the tests run.
  rm -rf "$PREFIX/runtime-lib"
  mkdir -p "$PREFIX/runtime-lib"
  local system_libs so sonames="" from_system=0 linked=()
  system_libs="$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true) | awk 'NF>1{print $1}')"
  for so in "$LIBDIR"/lib*.so.* "$PREFIX/lib/$MA"/lib*.so.*; do
    [ -f "$so" ] || continue
    local name
    name=""
    if command -v readelf >/dev/null; then
      name="$(readelf -d "$so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
    fi
    [ -n "$name" ] || name="$(basename "$so")"
    case " $sonames " in *" $name "*) continue ;; esac
    sonames="$sonames $name"
    local target
    target="$(dirname "$so")/$name"
    [ -e "$target" ] || target="$so"
    if grep -qxF "$name" <<<"$system_libs" ||
       [ -e "/lib/$MA/$name" ] || [ -e "/usr/lib/$MA/$name" ] || [ -e "/usr/lib64/$name" ]; then
      from_system=$((from_system + 1))
    else
      ln -sfn "$target" "$PREFIX/runtime-lib/$name"
      linked+=("$name")
    fi
  done
  note "runtime-lib: ${#linked[@]} libraries the machine lacks${linked[*]:+ (${linked[*]})}; $from_system taken from the machine"

  # Fonts for cairo's text: the machine's fontconfig setup if any, plus DejaVu from the .debs.
  mkdir -p "$PREFIX/etc/fonts" "$PREFIX/var/cache/fontconfig"
  cat >"$PREFIX/etc/fonts/kiln-fonts.conf" <<EOF
<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <include ignore_missing="yes">/etc/fonts/fonts.conf</include>
  <dir>$PREFIX/usr/share/fonts</dir>
  <cachedir>$PREFIX/var/cache/fontconfig</cachedir>
</fontconfig>
EOF
}

# The environment the build, the tests and the benches run in.
runtime_env() {
  check_prefix
  export PATH="$PREFIX/bin:$PATH"
  local torch_dirs
  torch_dirs="$(torch_libdirs)" || die "cannot ask python3 where torch's libraries are"
  export LD_LIBRARY_PATH="$PREFIX/runtime-lib:$torch_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export FONTCONFIG_FILE="$PREFIX/etc/fonts/kiln-fonts.conf"
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
  export PYTHONUNBUFFERED=1  # output survives a command killed at the device time limit
  if [ -d "$ROOT/.devkit/pylib" ]; then  # pytest (fetch_pylib), after anything already set
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT/.devkit/pylib"
  fi
}
# The folders of the torch that this machine's python3 imports, and of the CUDA runtime its wheel
# ships (nvidia/*/lib), for a kiln linked elsewhere: the prebuilt one's RUNPATH names the venv of
# the machine it was built on. LD_LIBRARY_PATH goes before RUNPATH; a kiln built here finds the
# same folders either way. Asked once per machine (importing torch takes seconds).
torch_libdirs() {
  local cache="$PREFIX/torch-libdirs"
  if [ ! -s "$cache" ]; then
    find_python
    mkdir -p "$PREFIX"
    "$PY" - >"$cache.tmp" <<'EOF' || { rm -f "$cache.tmp"; return 1; }
import glob, os, torch
lib = os.path.join(os.path.dirname(torch.__file__), "lib")
site = os.path.dirname(os.path.dirname(torch.__file__))
cudart = sorted({os.path.dirname(p) for p in glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcudart.so.*"))})
print(":".join([lib] + cudart))
EOF
    mv "$cache.tmp" "$cache"
  fi
  cat "$cache"
}

# Tests also compile headers and out-of-tree examples directly (sdk_header_*, sdk_install_example,
# sdk_plugin_guide): they need <dlpack/dlpack.h> and friends from the prefix, and find_package.
compile_env() {
  runtime_env
  export C_INCLUDE_PATH="${C_INCLUDE_PATH:+$C_INCLUDE_PATH:}$PREFIX/usr/include"
  export CPLUS_INCLUDE_PATH="${CPLUS_INCLUDE_PATH:+$CPLUS_INCLUDE_PATH:}$PREFIX/usr/include"
  export CMAKE_PREFIX_PATH="$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LIBRARY_PATH="${LIBRARY_PATH:+$LIBRARY_PATH:}$LIBDIR"
}

# compile_env over the unpacked .debs, unpacking them first on a machine that has not yet (the
# test, exec and prebuilt commands of a call that did not build).
unpacked_env() {
  check_prefix
  [ -d "$PREFIX/runtime-lib" ] || extract
  compile_env
}

find_python() {
  local c candidates=()
  [ -n "${KILN_PYTHON:-}" ] && candidates+=("$KILN_PYTHON")
  candidates+=(python3 /opt/torch/.venv/bin/python "$HOME/.cache/kiln/venv/bin/python")
  for c in "${candidates[@]}"; do
    c="$(command -v "$c" 2>/dev/null || true)"
    [ -n "$c" ] || continue
    if "$c" -c "import torch" 2>/dev/null; then PY="$c"; return 0; fi
  done
  die "no Python with torch found (tried: ${candidates[*]}); set KILN_PYTHON=/path/to/python"
}

save_log() {  # copies a log into $OUT (the device tool brings it back), when there is one
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ] && [ -w "$OUT" ]; then cp -f "$1" "$OUT/" 2>/dev/null || true; fi
}

build() {
  local configure_only=0
  if [ "${1:-}" = --configure-only ]; then configure_only=1; shift; fi
  local build_dir="${1:-build/device}"
  case "$build_dir" in /*) ;; *) build_dir="$ROOT/$build_dir" ;; esac
  local t0=$SECONDS
  extract
  runtime_env
  find_python
  "$PY" - <<'EOF' || die "the Python oracle check failed"
import importlib.util, torch
print(f"device_build: python {__import__('sys').executable}: torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"GPU {'yes: ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none visible'}")
missing = [m for m in ("numpy", "safetensors", "tensorboard") if importlib.util.find_spec(m) is None]
if missing:
    print(f"device_build: warning: the test oracles also import {', '.join(missing)}, missing from this Python")
EOF
  local tool
  for tool in cmake ninja c++ cc; do
    command -v "$tool" >/dev/null || die "$tool not found on PATH"
  done
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
    note "warning: no nvcc found; torch's CMake files may fail to find CUDA"

  # The prefix's headers are searched last (-idirafter), as /usr/include is on the Debian machine;
  # fmt and spdlog come first through the include shim. A library's own copy in this machine's
  # /usr/include would win over the prefix's: say so.
  local d shadow=()
  for d in boost toml++ CLI gtest cairo dlpack gloo; do [ -e "/usr/include/$d" ] && shadow+=("/usr/include/$d"); done
  ((${#shadow[@]} == 0)) ||
    note "warning: this machine has ${shadow[*]}, searched before the prefix's copies (the .debs' versions may differ)"
  local flags="-isystem $PREFIX/usr/include"
  local args=(-S "$ROOT" -B "$build_dir" -G Ninja
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
    -DKILN_PYTHON="$PY"
    -DKILN_WERROR=OFF
    -DTORCH_CUDA_ARCH_LIST="$TORCH_CUDA_ARCH_LIST"
    -DCMAKE_PREFIX_PATH="$PREFIX/usr;$LIBDIR/cmake;$PREFIX/usr/share/cmake"
    -DCMAKE_INCLUDE_PATH="$PREFIX/usr/include"
    -DCMAKE_LIBRARY_PATH="$LIBDIR;$PREFIX/lib/$MA"
    -DPKG_CONFIG_EXECUTABLE="$PREFIX/bin/pkg-config"
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags")
  # CMakeLists.txt links include-shim/{fmt,spdlog} to /usr/include/... unless they exist:
  # made here first, they point at the prefix's fmt 9 and spdlog.
  mkdir -p "$build_dir/include-shim"
  ln -sfn "$PREFIX/usr/include/fmt" "$build_dir/include-shim/fmt"
  ln -sfn "$PREFIX/usr/include/spdlog" "$build_dir/include-shim/spdlog"

  local cfg_stamp="$build_dir/.kiln-device-configure"
  if [ -f "$build_dir/build.ninja" ] && [ -f "$cfg_stamp" ] && [ "$(cat "$cfg_stamp")" = "${args[*]}" ]; then
    note "already configured: $build_dir"
  else
    note "configuring $build_dir"
    if ! cmake "${args[@]}" >"$build_dir/device-configure.log" 2>&1; then
      save_log "$build_dir/device-configure.log"
      tail -40 "$build_dir/device-configure.log" >&2
      die "CMake configure failed (whole log: $build_dir/device-configure.log)"
    fi
    echo "${args[*]}" >"$cfg_stamp"
    save_log "$build_dir/device-configure.log"
    grep -E "^-- (Found|Checking for module|  Found)|Caffe2: CUDA|TORCH_CUDA_ARCH|Boost" \
      "$build_dir/device-configure.log" | head -20 || true
  fi

  [ "$configure_only" = 1 ] && { note "configured $build_dir in $((SECONDS - t0)) s"; return 0; }
  local jobs
  jobs="$(nproc)"
  note "ninja -C $build_dir -j$jobs"
  set +e
  ninja -C "$build_dir" -j"$jobs" >"$build_dir/device-build.log" 2>&1
  local rc=$?
  set -e
  save_log "$build_dir/device-build.log"
  if [ $rc -ne 0 ]; then
    grep -E "error|FAILED" "$build_dir/device-build.log" | head -40 >&2 || true
    tail -20 "$build_dir/device-build.log" >&2
    die "build failed (whole log: $build_dir/device-build.log)"
  fi
  tail -1 "$build_dir/device-build.log"
  note "built $build_dir in $((SECONDS - t0)) s"
}

run_tests() {
  local build_dir=build/device
  if (($#)) && [ "${1#-}" = "$1" ]; then build_dir="$1"; shift; fi  # else: ctest arguments only
  case "$build_dir" in /*) ;; *) build_dir="$ROOT/$build_dir" ;; esac
  [ -f "$build_dir/CTestTestfile.cmake" ] ||
    die "$build_dir is not a built tree: run scripts/device_build.sh build first"
  unpacked_env
  local t0=$SECONDS rc
  set +e
  ctest --test-dir "$build_dir" -j"$(nproc)" --output-on-failure "$@" 2>&1 | tee "$build_dir/device-test.log"
  rc=${PIPESTATUS[0]}
  set -e
  save_log "$build_dir/device-test.log"
  echo "=== device_build test summary ($((SECONDS - t0)) s, ctest exit $rc)"
  grep -E "tests passed|tests failed" "$build_dir/device-test.log" | tail -1 || true
  sed -n '/The following tests FAILED/,$p' "$build_dir/device-test.log" | head -40
  echo "skipped: $(grep -c '\*\*\*Skipped\|Not Run' "$build_dir/device-test.log" || true)"
  return "$rc"
}

# A stamp of the sources the installed kiln is built from: every file under the folders the
# build reads, by relative path and content. Computed the same way here and there (the device
# tree is a copy of this working tree, so no git is needed).
source_stamp() {
  (cd "$ROOT" && find CMakeLists.txt CMakePresets.json cmake host plugins sdk -type f \
     ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) |
    sha256sum | cut -c1-32
}

PREBUILT="$ROOT/.devkit/prebuilt"

# HERE: the release build, installed stripped into .devkit/prebuilt, so that a device call that
# only runs benches needs no build there (2-3 of its 15 minutes). Its libraries load there:
# Debian 12's glibc and libstdc++ are older than that machine's, the torch wheel is the same
# (2.11.0, CUDA 13.0), and Kiln has no CUDA code of its own to compile for sm_90.
pack() {
  local stamp
  stamp="$(source_stamp)"
  # kiln_installable: all that `cmake --install` copies, without the tests (a third of the time).
  (cd "$ROOT" && scripts/build.sh release kiln_installable) || die "the release build failed"
  rm -rf "$PREBUILT"
  cmake --install "$ROOT/build/release" --prefix "$PREBUILT" --strip >/dev/null ||
    die "cmake --install into $PREBUILT failed"
  [ "$(source_stamp)" = "$stamp" ] || die "the sources changed during the build; pack again"
  echo "$stamp" >"$PREBUILT/SOURCE_STAMP"
  note "installed build/release into .devkit/prebuilt ($(du -sh "$PREBUILT" | cut -f1), sources $stamp);" \
    "device_check.sh runs its benches with it while the sources stay the same"
}

# THERE: is the prebuilt kiln usable? Prints its path, or why not (and exits 1).
prebuilt_check() {
  local kiln="$PREBUILT/bin/kiln" want have
  [ -x "$kiln" ] || { note "no prebuilt kiln (scripts/device_build.sh pack makes one)" >&2; return 1; }
  want="$(cat "$PREBUILT/SOURCE_STAMP" 2>/dev/null || true)"
  have="$(source_stamp)"
  [ "$want" = "$have" ] ||
    { note "the prebuilt kiln is stale (built from sources $want, these are $have): pack again" >&2; return 1; }
  unpacked_env >&2
  local log
  if ! log="$("$kiln" plugins list 2>&1)"; then
    note "the prebuilt kiln does not run here:" >&2
    echo "$log" | tail -5 >&2
    return 1
  fi
  if grep -qi "refused\|error" <<<"$log"; then
    note "the prebuilt kiln refused plugins here:" >&2
    grep -i "refused\|error" <<<"$log" | head -5 >&2
    return 1
  fi
  echo "$kiln"
}

print_env() {
  check_prefix
  compile_env
  local v
  for v in PATH LD_LIBRARY_PATH FONTCONFIG_FILE TORCH_CUDA_ARCH_LIST PYTHONUNBUFFERED C_INCLUDE_PATH CPLUS_INCLUDE_PATH \
           CMAKE_PREFIX_PATH LIBRARY_PATH; do
    printf 'export %s=%q\n' "$v" "${!v}"
  done
}

mode="${1:-}"
shift || true
case "$mode" in
  fetch) fetch ;;
  build) build "$@" ;;
  configure) build --configure-only "$@" ;;
  test) run_tests "$@" ;;
  exec)
    (($#)) || die "usage: scripts/device_build.sh exec CMD [ARGS...]"
    unpacked_env
    exec "$@" ;;
  env) print_env ;;
  pack) pack ;;
  prebuilt) prebuilt_check ;;
  *) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
