"""Oracle for norm.running_stats_update in training: a PyTorch loop with gradient accumulation
that moves batch norm's running statistics by hand, as each mode says.

Phase "prepare" writes a small IDX dataset (Fashion-MNIST's file names and format) and the
initial weights of a twin of the kiln mlp plugin with norm layers (flatten, [linear,
BatchNorm1d, relu]..., head) as safetensors, named as Kiln names them.
Phase "train" trains the twin on one process: SGD with momentum, batches in order (no shuffle),
windows of `accumulation` micro-batches (the epoch's last window shorter), each micro-batch's
loss divided by its window's length. Two ranks of syncbn under DDP normalise and step as this
process does on their samples together, so the same loop is the oracle for both. The running
statistics move per `mode`:
  micro_batch        BatchNorm at its momentum m on every micro-batch (PyTorch's behaviour);
  adjusted_momentum  BatchNorm at 1 - (1 - m) ** (1 / k) on every micro-batch of a window of k;
  pooled_window      not during the window (momentum 0); after it, one update at m from
                     torch.nn.functional.batch_norm over the window's inputs to the layer,
                     concatenated: what one batch of the whole window would give.
Writes the final weights and buffers to oracle.safetensors.
Phase "compare" writes to diffs.json, for each pair [a, b] of safetensors files, the largest
absolute difference of the running statistics and of the other tensors.
"""
import json
import os

import safetensors.torch
import torch
import torch.nn.functional as F

from common import Mlp, Scratch, load_split, max_difference, save_state, write_pattern_set


def prepare(s, cfg):
    write_pattern_set(s.dir, cfg, noise=60, drift=80)
    torch.manual_seed(cfg["seed"])
    save_state(Mlp(cfg["size"] ** 2, cfg["hidden"], 10, 0.1),
               os.path.join(s.dir, "init.safetensors"))


def train(s, cfg):
    torch.set_num_threads(1)
    x_all, labels = load_split(s.dir, "train", cfg["mean"], cfg["std"])
    m, mode, k, batch = cfg["norm_momentum"], cfg["mode"], cfg["accumulation"], cfg["batch"]
    model = Mlp(cfg["size"] ** 2, cfg["hidden"], 10, m)
    model.load_state_dict(safetensors.torch.load_file(os.path.join(s.dir, "init.safetensors")),
                          strict=False)
    norms = [layer.norm for layer in model.layers]
    inputs = {id(bn): [] for bn in norms}
    for bn in norms:
        bn.register_forward_hook(lambda mod, args, out: inputs[id(mod)].append(args[0].detach()))
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    batches = x_all.shape[0] // batch
    windows = [k] * (batches // k) + ([batches % k] if batches % k else [])
    position = 0
    for window in windows:
        opt.zero_grad()
        for bn in norms:
            bn.momentum = {"micro_batch": m, "adjusted_momentum": 1 - (1 - m) ** (1 / window),
                           "pooled_window": 0.0}[mode]
            inputs[id(bn)].clear()
        for _ in range(window):
            idx = slice(position, position + batch)
            position += batch
            loss = F.cross_entropy(model(x_all[idx]), labels[idx]) / window
            loss.backward()
        if mode == "pooled_window":
            with torch.no_grad():
                for bn in norms:
                    F.batch_norm(torch.cat(inputs[id(bn)]), bn.running_mean, bn.running_var,
                                 training=True, momentum=m)
        opt.step()
    save_state(model, os.path.join(s.dir, "oracle.safetensors"))


def compare(s, cfg):
    out = []
    for a_path, b_path in cfg["pairs"]:
        a = safetensors.torch.load_file(a_path)
        b = safetensors.torch.load_file(b_path)
        assert sorted(a) == sorted(b), (sorted(a), sorted(b))
        stats = [k for k in a if k.endswith(("running_mean", "running_var"))]
        out.append({"stats": max_difference(a, b, stats),
                    "weights": max_difference(a, b, [k for k in a if k not in stats])})
    (s.dir / "diffs.json").write_text(json.dumps(out))


def main():
    s = Scratch()
    cfg = s.config
    {"prepare": prepare, "train": train, "compare": compare}[cfg["phase"]](s, cfg)


if __name__ == "__main__":
    main()
