#!/usr/bin/env bash
# Checkpoints and weights stay data (docs/security.md): neither the host nor a built-in plugin
# may call one of LibTorch's loaders that read pickles or TorchScript archives, formats that can
# carry code. Kiln reads safetensors with its own reader and TOML with toml++.
# One exception, by design: the torchscript model plugin loads the program its model.path names
# (a model written in Python is code, as a plugin is). It is allowed in that one file, once, and
# nowhere else: its weights still go to checkpoints as safetensors.
# Usage: no_pickle.sh <kiln source dir>
set -euo pipefail
src=$1
# torch::load and torch::serialize::InputArchive read TorchScript archives; the others read
# pickles or TorchScript archives directly.
pattern='torch::load\b|serialize::InputArchive|\bpickle_load\b|\bunpickle\b|jit::load\b|_load_for_mobile|import_ir_module|\bUnpickler\b'
model_program=plugins/model/torchscript/scripted.cpp
if hits=$(grep -rnE "$pattern" "$src/host" "$src/plugins" "$src/sdk/include" \
  --include='*.c' --include='*.cpp' --include='*.h' --include='*.hpp' |
  grep -v "^$src/$model_program:"); then
  echo "a loader that can run code from a file (see docs/security.md):"
  echo "$hits"
  exit 1
fi
n=$(grep -cE "$pattern" "$src/$model_program" || true)
if [ "$n" != 1 ]; then
  echo "$model_program: expected exactly one TorchScript load (model.path), found $n"
  exit 1
fi
echo "no pickle or TorchScript loader in host/, plugins/ or the SDK (torchscript: model.path only)"
