"""Plain-PyTorch training loops for bench/precision.py: one run of one model under one precision
mode, in its own process (so peak memory is this run's alone), printed as one JSON line.

  python bench/precision_reference.py --pipeline P.json --mode o2 --device cuda --steps 200

P.json is the pipeline bench/precision.py also hands Kiln (as TOML): the [model], [optimizer]
(with custom_keys), [data] (root, batch_size, mean, std) and [run] (seed) sections.

Modes (the half dtype is fp16 on CUDA and bf16 on the CPU unless --dtype says otherwise):
- fp32 / tf32: float32 throughout; TF32 matmuls and convolutions off / on.
- amp:  torch.autocast to the half dtype; torch.amp.GradScaler when it is fp16.
- o2:   half model with fp32 norm layers; fp32 master copies of the half weights are what the
        optimizer steps; half gradients are copied into fp32 buffers, unscaled and checked in one
        _amp_foreach_non_finite_check_and_unscale_, and a non-finite step is skipped; fp16 uses
        GradScaler's dynamic scale (init 2^16, x2 every 2000 clean steps, x0.5 on overflow).
- o3:   model.to(half) with fp32 norm layers, the optimizer on the model's own tensors, no
        scaling and no check.
The loss is computed in fp32 (logits cast up), as Kiln does.

Timing: the training set is preloaded onto the device as normalised fp32 tensors; each step's
batch is gathered before the clock starts. A step is forward, loss, backward, optimizer and
loss.item(), between torch.cuda.synchronize() calls on CUDA.
"""
import argparse
import gzip
import json
import math
import os
import re
import resource
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from torch_optim import IMPLS, make_optimizer  # noqa: E402

HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_split(root, split, mean, std):
    """Fashion-MNIST images as normalised N x 1 x 28 x 28 float32, labels as int64 (Kiln's
    assembler: x / 255, minus mean, over std)."""
    prefix = "train" if split == "train" else "t10k"
    paths = {}
    for kind, idx in (("images", "idx3"), ("labels", "idx1")):
        base = os.path.join(root, f"{prefix}-{kind}-{idx}-ubyte")
        paths[kind] = base + ".gz" if os.path.exists(base + ".gz") else base
    images = torch.from_numpy(read_idx(paths["images"]).astype(np.float32))
    images = images.unsqueeze(1).div_(255.0).sub_(mean).div_(std)
    labels = torch.from_numpy(read_idx(paths["labels"]).astype(np.int64))
    return images, labels


def param_groups(model, opt):
    """Kiln's group rules (host/engine/param_groups.cpp): the longest-matching custom_keys rule,
    else norm-layer parameters, else biases, else the default group."""
    wd = opt.get("weight_decay", 0.0)
    norm_wd = opt.get("weight_decay_norm", float("nan"))
    norm_wd = wd * opt.get("norm_decay_mult", 1.0) if math.isnan(norm_wd) else norm_wd
    bias_lr = opt.get("bias_lr_mult", 1.0) * (2.0 if opt.get("bias_double_lr", False) else 1.0)
    bias_wd = wd * (opt.get("bias_decay_mult", 1.0) if opt.get("bias_weight_decay", True) else 0.0)
    custom = [(p, re.compile(p), r.get("lr_mult", 1.0), r.get("decay_mult", 1.0))
              for p, r in opt.get("custom_keys", {}).items()]
    norm_names = {f"{mn}.{pn}" if mn else pn
                  for mn, m in model.named_modules() if isinstance(m, models.NormLayer)
                  for pn, _ in m.named_parameters(recurse=False)}
    groups = {"default": dict(params=[], lr_scale=1.0, weight_decay=wd)}
    for name, p in model.named_parameters():
        best = None
        for pattern, rx, lr_mult, decay_mult in custom:
            m = rx.search(name)
            if m and (best is None or len(m.group(0)) > best[0] or
                      (len(m.group(0)) == best[0] and len(pattern) > len(best[1]))):
                best = (len(m.group(0)), pattern, lr_mult, decay_mult)
        if best:
            key, lr_scale, gwd = f"custom:{best[1]}", best[2], wd * best[3]
        elif name in norm_names:
            key, lr_scale, gwd = "norm", 1.0, norm_wd
        elif name == "bias" or name.endswith(".bias"):
            key, lr_scale, gwd = "bias", bias_lr, bias_wd
        else:
            key, lr_scale, gwd = "default", 1.0, wd
        groups.setdefault(key, dict(params=[], lr_scale=lr_scale, weight_decay=gwd))
        groups[key]["params"].append(p)
    return [g for g in groups.values() if g["params"]]


def cast_except_norms(model, dtype):
    """model.to(dtype) for everything but norm layers (host/engine/precision.cpp cast_model)."""
    for m in model.modules():
        if isinstance(m, models.NormLayer):
            continue
        for p in m.parameters(recurse=False):
            p.data = p.data.to(dtype)
        for name, b in m.named_buffers(recurse=False):
            if b.is_floating_point():
                setattr(m, name, b.to(dtype))


class Trainer:
    """One precision mode: step(x, y) -> (loss tensor, skipped) and logits(x) for evaluation."""

    def __init__(self, model, mode, half, device, opt_cfg, impl):
        self.model, self.mode, self.half, self.device = model, mode, half, device
        self.skipped = 0
        self.scale = 1.0
        if mode in ("o2", "o3"):
            cast_except_norms(model, half)
        groups = param_groups(model, opt_cfg)
        if mode == "o2":
            # Half tensors get fp32 masters (stepped by the optimizer); fp32 ones (norm layers)
            # are stepped in place, as apex and Kiln do.
            self.model_half, self.masters, self.master_grads = [], [], []
            for g in groups:
                stepped = []
                for p in g["params"]:
                    if p.dtype == torch.float32:
                        stepped.append(p)
                        continue
                    m = p.detach().float().clone().requires_grad_(True)
                    m.grad = torch.zeros_like(m)
                    self.model_half.append(p)
                    self.masters.append(m)
                    self.master_grads.append(m.grad)
                    stepped.append(m)
                g["params"] = stepped
            self.stepped = [p for g in groups for p in g["params"]]
            dynamic = half == torch.float16
            self.scale_t = torch.full((1,), 65536.0 if dynamic else 1.0, device=device)
            self.growth = torch.zeros(1, dtype=torch.int32, device=device) if dynamic else None
            self.found_inf = torch.zeros(1, device=device)
        self.opt = make_optimizer(groups, opt_cfg, impl)
        self.scaler = None
        if mode == "amp":
            self.scaler = torch.amp.GradScaler(device.type, enabled=half == torch.float16)

    def forward(self, x):
        if self.mode == "amp":
            with torch.autocast(self.device.type, dtype=self.half):
                return self.model(x).float()
        if self.mode in ("o2", "o3"):
            x = x.to(self.half)
        return self.model(x).float()

    def step(self, x, y):
        if self.mode == "o2":
            return self._step_o2(x, y)
        self.opt.zero_grad(set_to_none=True)
        if self.mode == "amp":
            with torch.autocast(self.device.type, dtype=self.half):
                logits = self.model(x)
            loss = F.cross_entropy(logits.float(), y)
            before = self.scaler.get_scale() if self.scaler.is_enabled() else None
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
            if before is not None:
                self.scale = self.scaler.get_scale()
                if self.scale < before:
                    self.skipped += 1
            return loss, False
        loss = F.cross_entropy(self.forward(x), y)
        loss.backward()
        self.opt.step()
        return loss, False

    def _step_o2(self, x, y):
        # The model's gradients go; the masters' fp32 gradient buffers are persistent.
        self.model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x.to(self.half)).float(), y)
        (loss * self.scale_t).backward()
        with torch.no_grad():
            torch._foreach_copy_(self.master_grads, [p.grad for p in self.model_half])
        grads = [p.grad for p in self.stepped]
        self.found_inf.zero_()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf,
                                                         self.scale_t.reciprocal())
        if self.growth is not None:
            torch._amp_update_scale_(self.scale_t, self.growth, self.found_inf, 2.0, 0.5, 2000)
        skipped = bool(self.found_inf.item())
        if skipped:
            self.skipped += 1
        else:
            self.opt.step()
            with torch.no_grad():
                torch._foreach_copy_(self.model_half, self.masters)
        if self.growth is not None:
            self.scale = float(self.scale_t.item())
        return loss, skipped


def peak_memory_mib(device, base):
    if device.type == "cuda":
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipeline", required=True, help="pipeline as JSON (see the docstring)")
    ap.add_argument("--mode", required=True, choices=["fp32", "tf32", "amp", "o2", "o3"])
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="auto", choices=["auto", "fp16", "bf16"])
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 = default")
    ap.add_argument("--optim-impl", default="default", choices=IMPLS)
    ap.add_argument("--no-eval", action="store_true")
    args = ap.parse_args()
    with open(args.pipeline) as f:
        pipe = json.load(f)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    half = HALF[args.dtype] if args.dtype != "auto" else (
        torch.float16 if device.type == "cuda" else torch.bfloat16)
    if device.type == "cuda":
        tf32 = args.mode == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        # Kiln's run.cudnn_benchmark default: cuDNN times its algorithms once per shape.
        torch.backends.cudnn.benchmark = pipe["run"].get("cudnn_benchmark", True)
    torch.manual_seed(pipe["run"].get("seed", 0))

    data = pipe["data"]
    mean, std = data.get("mean", 0.286), data.get("std", 0.353)
    xtr, ytr = (t.to(device) for t in load_split(data["root"], "train", mean, std))
    xte, yte = (t.to(device) for t in load_split(data["root"], "test", mean, std))
    batch = data["batch_size"]
    base = 0
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)  # the preloaded dataset, which Kiln keeps on the host

    model = models.build(pipe["model"]).to(device)
    model.train()
    trainer = Trainer(model, args.mode, half, device, pipe["optimizer"], args.optim_impl)

    gen = torch.Generator().manual_seed(pipe["run"].get("seed", 0))
    times, losses, skipped_steps = [], [], []
    order, pos = None, len(ytr)
    for _ in range(args.steps):
        if pos >= len(ytr):  # a new epoch; the last batch may be short (drop_last = false)
            order, pos = torch.randperm(len(ytr), generator=gen).to(device), 0
        idx = order[pos:pos + batch]
        pos += batch
        x, y = xtr[idx], ytr[idx]
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss, skipped = trainer.step(x, y)
        value = loss.item()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(value if math.isfinite(value) else None)
        skipped_steps.append(skipped)
    memory = peak_memory_mib(device, base)

    accuracy = None
    if not args.no_eval:
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(yte), 1000):
                logits = trainer.forward(xte[i:i + 1000])
                correct += int((logits.argmax(1) == yte[i:i + 1000]).sum())
        accuracy = correct / len(yte)
    print(json.dumps({"step_time": times, "loss": losses, "memory_mb": memory,
                      "accuracy": accuracy, "skipped": trainer.skipped,
                      "nonfinite": sum(1 for v in losses if v is None),
                      "loss_scale": trainer.scale, "dtype": str(half).replace("torch.", ""),
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
