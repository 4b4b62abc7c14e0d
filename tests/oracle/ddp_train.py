"""Oracle for Kiln's data-parallel training: PyTorch's own DistributedDataParallel (Gloo, CPU).

Phase "prepare" writes a small IDX dataset (Fashion-MNIST's file names and format) and the
initial weights of a twin of the kiln mlp plugin (flatten, [linear, relu]..., head) as
safetensors, so Kiln and PyTorch start from the same weights on the same data.
Phase "compare" writes the largest absolute difference between the tensors of two safetensors
files (cfg "a", "b"; same names) to diff.txt.
Phase "train" trains it with `world` processes under DDP (bucket_cap_mb as configured), SGD with
momentum, `accumulation` micro-batches per step with no_sync() on all but the last, data in
order (no shuffle), each rank taking every world-th sample as DistributedSampler does, and writes
the final weights to oracle.safetensors.
"""
import gzip
import os
import struct

import numpy as np
import safetensors.torch
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from common import Scratch


class Mlp(nn.Module):
    def __init__(self, inputs, hidden, classes):
        super().__init__()
        self.layers = nn.ModuleList()
        for width in hidden:
            layer = nn.Module()
            layer.linear = nn.Linear(inputs, width)
            self.layers.append(layer)
            inputs = width
        self.head = nn.Linear(inputs, classes)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers:
            x = F.relu(layer.linear(x))
        return self.head(x)


def write_idx(path, array, magic):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic))
        for d in array.shape:
            f.write(struct.pack(">I", d))
        f.write(array.astype(np.uint8).tobytes())


def prepare(s, cfg):
    rng = np.random.default_rng(cfg["seed"])
    size = cfg["size"]
    for prefix, n in (("train", cfg["train"]), ("t10k", cfg["test"])):
        labels = rng.integers(0, 10, n)
        # Learnable: a per-class brightness pattern plus noise.
        base = (np.arange(size * size).reshape(size, size) * 7 % 255)[None]
        images = (base * (labels[:, None, None] + 1) / 10 + rng.integers(0, 60, (n, size, size)))
        write_idx(os.path.join(s.dir, f"{prefix}-images-idx3-ubyte.gz"), np.clip(images, 0, 255), 0x803)
        write_idx(os.path.join(s.dir, f"{prefix}-labels-idx1-ubyte.gz"), labels, 0x801)
    torch.manual_seed(cfg["seed"])
    model = Mlp(size * size, cfg["hidden"], 10)
    safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                os.path.join(s.dir, "init.safetensors"))


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    dims = struct.unpack(">" + "I" * (magic & 0xFF), data[4:4 + 4 * (magic & 0xFF)])
    return np.frombuffer(data[4 + 4 * len(dims):], dtype=np.uint8).reshape(dims)


def worker(rank, directory, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["port"])
    torch.set_num_threads(1)
    world = cfg["world"]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    images = torch.from_numpy(load_idx(os.path.join(directory, "train-images-idx3-ubyte.gz")).copy())
    labels = torch.from_numpy(load_idx(os.path.join(directory, "train-labels-idx1-ubyte.gz")).astype(np.int64))
    x_all = ((images.float().unsqueeze(1) / 255.0) - cfg["mean"]) / cfg["std"]
    size = cfg["size"]
    model = Mlp(size * size, cfg["hidden"], 10)
    model.load_state_dict(safetensors.torch.load_file(os.path.join(directory, "init.safetensors")))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cfg["bucket_cap_mb"])
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    shard = torch.arange(rank, x_all.shape[0], world)  # in order, every world-th sample
    per_rank = cfg["batch"] // world
    k = cfg["accumulation"]
    position = 0
    for _ in range(cfg["steps"]):
        opt.zero_grad()
        for micro in range(k):
            idx = shard[position:position + per_rank]
            position += per_rank
            last = micro == k - 1
            context = ddp.no_sync() if not last else torch.enable_grad()
            with context:
                loss = F.cross_entropy(ddp(x_all[idx]), labels[idx]) / k
                loss.backward()
        opt.step()
    if rank == 0:
        safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                    os.path.join(directory, "oracle.safetensors"))
    dist.destroy_process_group()


def main():
    s = Scratch()
    cfg = s.config
    if cfg["phase"] == "prepare":
        prepare(s, cfg)
    elif cfg["phase"] == "compare":
        a = safetensors.torch.load_file(cfg["a"])
        b = safetensors.torch.load_file(cfg["b"])
        assert sorted(a) == sorted(b), (sorted(a), sorted(b))
        diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
        (s.dir / "diff.txt").write_text(repr(diff))
    else:
        mp.spawn(worker, args=(str(s.dir), cfg), nprocs=cfg["world"], join=True)


if __name__ == "__main__":
    main()
