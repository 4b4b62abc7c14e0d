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
import os

import safetensors.torch
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from common import Mlp, Scratch, load_split, max_difference, save_state, write_pattern_set


def prepare(s, cfg):
    write_pattern_set(s.dir, cfg, noise=60)
    torch.manual_seed(cfg["seed"])
    save_state(Mlp(cfg["size"] ** 2, cfg["hidden"], 10), os.path.join(s.dir, "init.safetensors"))


def worker(rank, directory, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["port"])
    torch.set_num_threads(1)
    world = cfg["world"]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x_all, labels = load_split(directory, "train", cfg["mean"], cfg["std"])
    model = Mlp(cfg["size"] ** 2, cfg["hidden"], 10)
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
        save_state(model, os.path.join(directory, "oracle.safetensors"))
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
        (s.dir / "diff.txt").write_text(repr(max_difference(a, b, a)))
    else:
        mp.spawn(worker, args=(str(s.dir), cfg), nprocs=cfg["world"], join=True)


if __name__ == "__main__":
    main()
