"""The PyTorch arm of bench/train_throughput.py: one training run of a Kiln pipeline as a plain
Python loop, in its own process, printed as one JSON line.

  python bench/train_reference.py --pipeline P.json --save-init W.safetensors   # weights, exit
  python bench/train_reference.py --pipeline P.json --init W.safetensors --steps 60 --threads 2

P.json is the pipeline bench/train_throughput.py also hands Kiln (as TOML): [model], [optimizer]
(SGD with Kiln's parameter-group rules, bench/precision_reference.py's param_groups), [data]
(dataset, root, batch_size, mean, std, the synthetic_* and shape keys) and [run] (seed).

What one step does, as Kiln's trainer and its loader with data.workers = 0 and shuffle = false:
  data  the next batch_size rows of the in-memory uint8 training set gathered by index, made
        float32 and normalised in place (x / 255, minus mean, over std: host/data/assembler.cpp)
  step  zero_grad(set_to_none), forward, cross_entropy, backward, optimizer.step(), loss.item()
Both are timed with time.perf_counter; the JSON carries per-step data_time and step_time in
seconds (step_time excludes data_time, as in Kiln's metrics) and the per-step losses.

--compile MODE compiles the twin in place (model.compile(mode=...): the same module, parameter
names and state_dict keys; torch.compile's default backend, inductor) after its weights are
loaded; the loss (cross_entropy) and the optimizer step stay eager. The first step traces and
compiles the forward and, at its backward, the backward graph, so the first steps carry the
compile time. The JSON then also carries, per step, the number of graphs Dynamo has compiled so
far ("compiles": a recompile after the warm-up shows as a rise), the graph breaks and Dynamo's
own compile-time account (torch._dynamo.utils.calculate_time_spent, seconds).

A pipeline with an [ema] table (train_throughput.py --ema) also keeps timm's ModelEmaV3 of the
twin, made before the compile, and calls update(model, step=k) after the k-th optimizer step,
inside the timed step, as timm's train.py does and as Kiln's trainer does with [ema].

--profile DIR --warmup N (any arm) runs the steps after the first N under torch.profiler (CPU
activities) and writes the op table, sorted by self CPU time, to DIR/profile.txt.

Threads: torch.set_num_threads(--threads) and nothing else, which is all `kiln run` does with
run.threads (host/engine/trainer.cpp calls only at::set_num_threads; the inter-op pool stays at
torch's default on both sides).

data.dataset = "synthetic" is rebuilt here bit for bit: host/data/dataset.cpp's make_synthetic
(std::mt19937_64 seeded with run.seed, bilinear class prototypes, shuffled balanced labels,
uniform noise) ported to numpy, so both arms train on the same tensor; Kiln's IDX reader takes
single-channel images only, so a 3-channel set cannot be handed to it as files.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from bench_common import COMPILE_MODES  # noqa: E402
from precision_reference import param_groups, read_idx  # noqa: E402
from torch_optim import IMPLS, make_optimizer  # noqa: E402


# ---- data --------------------------------------------------------------------------------------

U64 = np.uint64


class MT19937_64:
    """std::mt19937_64, integer-seeded, drawing whole 312-word blocks with numpy."""

    N, M = 312, 156
    UPPER, LOWER = U64(0xFFFFFFFF80000000), U64(0x7FFFFFFF)
    MATRIX = U64(0xB5026F5AA96619E9)

    def __init__(self, seed):
        mt = [seed & 0xFFFFFFFFFFFFFFFF]
        for i in range(1, self.N):
            prev = mt[-1]
            mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & 0xFFFFFFFFFFFFFFFF)
        self.mt = np.array(mt, dtype=U64)
        self.buf = np.empty(0, dtype=U64)

    def _mix(self, hi, lo, far):
        y = (hi & self.UPPER) | (lo & self.LOWER)
        return far ^ (y >> U64(1)) ^ np.where((y & U64(1)) != 0, self.MATRIX, U64(0))

    def _block(self):
        mt, n, m = self.mt, self.N, self.M
        # The twist in three vectorised pieces: each reads only words already final for it.
        mt[:n - m] = self._mix(mt[:n - m], mt[1:n - m + 1], mt[m:])
        mt[n - m:n - 1] = self._mix(mt[n - m:n - 1], mt[n - m + 1:], mt[:m - 1])
        mt[n - 1:] = self._mix(mt[n - 1:], mt[:1], mt[m - 1:m])
        y = mt.copy()
        y ^= (y >> U64(29)) & U64(0x5555555555555555)
        y ^= (y << U64(17)) & U64(0x71D67FFFEDA60000)
        y ^= (y << U64(37)) & U64(0xFFF7EEE000000000)
        y ^= y >> U64(43)
        return y

    def draws(self, count):
        while len(self.buf) < count:
            blocks = [self._block() for _ in range(-(-(count - len(self.buf)) // self.N))]
            self.buf = np.concatenate([self.buf] + blocks)
        out, self.buf = self.buf[:count], self.buf[count:]
        return out

    def one(self):
        return int(self.draws(1)[0])


def make_synthetic(samples, classes, channels, height, width, seed):
    """host/data/dataset.cpp make_synthetic: uint8 N x C x H x W images, int64 labels."""
    gen = MT19937_64(seed)
    grid_n = 4
    protos = np.empty((classes, channels, height, width), dtype=np.uint8)
    ys, xs = np.arange(height, dtype=np.float64), np.arange(width, dtype=np.float64)
    gy = ys * (grid_n - 1) / (height - 1) if height > 1 else np.zeros(height)
    gx = xs * (grid_n - 1) / (width - 1) if width > 1 else np.zeros(width)
    y0 = np.minimum(gy.astype(np.int64), grid_n - 2)
    x0 = np.minimum(gx.astype(np.int64), grid_n - 2)
    fy, fx = (gy - y0)[:, None], (gx - x0)[None, :]
    for k in range(classes):
        for c in range(channels):
            grid = (gen.draws(grid_n * grid_n) % U64(256)).astype(np.float64)
            grid = grid.reshape(grid_n, grid_n)
            g00, g01 = grid[y0][:, x0], grid[y0][:, x0 + 1]
            g10, g11 = grid[y0 + 1][:, x0], grid[y0 + 1][:, x0 + 1]
            top = g00 * (1 - fx) + g01 * fx
            bottom = g10 * (1 - fx) + g11 * fx
            protos[k, c] = (top * (1 - fy) + bottom * fy + 0.5).astype(np.uint8)
    labels = np.arange(samples, dtype=np.int64) % classes
    for i in range(samples - 1, 0, -1):
        j = gen.one() % (i + 1)
        labels[i], labels[j] = labels[j], labels[i]
    pixels = channels * height * width
    words = gen.draws(samples * (-(-pixels // 8))).reshape(samples, -1)
    # Eight noise bytes per 64-bit word, lowest byte first; a sample starts on a fresh word.
    noise_bytes = words.astype("<u8").view(np.uint8).reshape(samples, -1)[:, :pixels]
    noise = noise_bytes.astype(np.int64) % 97 - 48
    images = np.clip(protos.reshape(classes, -1)[labels].astype(np.int64) + noise, 0, 255)
    return (torch.from_numpy(images.astype(np.uint8).reshape(samples, channels, height, width)),
            torch.from_numpy(labels))


def load_train(data, seed):
    """The training split as Kiln holds it: uint8 images N x C x H x W and int64 labels."""
    if data.get("dataset", "fashion-mnist") == "synthetic":
        n_train = data.get("synthetic_train", 2048)
        images, labels = make_synthetic(n_train + data.get("synthetic_test", 512),
                                        data.get("synthetic_classes", 10), data.get("channels", 1),
                                        data.get("height", 28), data.get("width", 28), seed)
        return images[:n_train].contiguous(), labels[:n_train].contiguous(), \
            data.get("synthetic_classes", 10)
    root = data.get("root", "/usr/share/datasets/fashion-mnist")
    paths = []
    for kind, idx in (("images", "idx3"), ("labels", "idx1")):
        base = os.path.join(root, f"train-{kind}-{idx}-ubyte")
        # Kiln reads the .gz name (zlib passes plain files through); prefer it here too.
        paths.append(base + ".gz" if os.path.exists(base + ".gz") else base)
    images = torch.from_numpy(read_idx(paths[0]).copy()).unsqueeze(1).contiguous()
    labels = torch.from_numpy(read_idx(paths[1]).astype(np.int64))
    return images, labels, 10


# ---- the run -----------------------------------------------------------------------------------


def build_model(pipe, images, classes):
    _, c, h, w = images.shape
    return models.build_for_input(pipe["model"], c, h, w, classes)


def save_init(pipe, path):
    """The twin's own initialisation (seeded with run.seed) as a safetensors file for both arms."""
    from safetensors.torch import save_file

    data = dict(pipe["data"])
    if data.get("dataset") == "synthetic":  # only the shape matters here
        data.update(synthetic_train=1, synthetic_test=1)
    images, _, classes = load_train(data, 0)
    torch.manual_seed(pipe["run"].get("seed", 0))
    model = build_model(pipe, images, classes)
    save_file({k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}, path)


def make_ema(model, spec):
    """timm's ModelEmaV3 with the [ema] table's settings, or None without one."""
    if not spec or spec.get("decay", 0.0) <= 0:
        return None
    from timm.utils.model_ema import ModelEmaV3

    return ModelEmaV3(model, decay=spec["decay"], update_after_step=spec.get("start_step", 0),
                      use_warmup=spec.get("warmup", False),
                      warmup_gamma=spec.get("warmup_gamma", 1.0),
                      warmup_power=spec.get("warmup_power", 2 / 3),
                      exclude_buffers=spec.get("buffers", "average") == "copy")


def train(pipe, args):
    from safetensors.torch import load_file

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    seed = pipe["run"].get("seed", 0)
    torch.manual_seed(seed)
    data = pipe["data"]
    images, labels, classes = load_train(data, seed)
    mean, std = data.get("mean", 0.286), data.get("std", 0.353)
    batch = data["batch_size"]
    model = build_model(pipe, images, classes)
    model.load_state_dict(load_file(args.init), strict=True)
    # --layout channels_last: the model's 4-D tensors and each batch NHWC, as a user asks for
    # with model.to(memory_format=torch.channels_last); contiguous is PyTorch's default.
    layout = torch.channels_last if args.layout == "channels_last" else torch.contiguous_format
    model = model.to(memory_format=layout)
    model.train()
    ema = make_ema(model, pipe.get("ema"))
    if args.compile != "none":
        model.compile(mode=None if args.compile == "default" else args.compile)
    opt = make_optimizer(param_groups(model, pipe["optimizer"]), pipe["optimizer"],
                         args.optim_impl)

    order = torch.arange(len(labels))  # data.shuffle = false: Kiln's sampler order
    pos = 0
    step_times, data_times, losses, compiles = [], [], [], []
    clock = time.perf_counter
    profiler = None
    for step in range(args.steps):
        if args.profile and step == args.warmup:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            profiler.start()
        t0 = clock()
        if pos >= len(labels):
            pos = 0
        idx = order[pos:pos + batch]
        pos += batch
        x = images.index_select(0, idx).float().div_(255.0).sub_(mean).div_(std)
        x = x.contiguous(memory_format=layout) if x.dim() == 4 else x
        y = labels.index_select(0, idx)
        t1 = clock()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if ema is not None:
            ema.update(model, step=step + 1)
        value = loss.item()
        t2 = clock()
        data_times.append(t1 - t0)
        step_times.append(t2 - t1)
        losses.append(value if math.isfinite(value) else None)
        if args.compile != "none":
            compiles.append(compiled_graphs())
    if profiler is not None:
        profiler.stop()
        write_profile(profiler, args)
    out = {"step_time": step_times, "data_time": data_times, "loss": losses,
           "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
           "optim_impl": args.optim_impl, "compile": args.compile}
    if args.compile != "none":
        from torch._dynamo.utils import calculate_time_spent, counters

        out.update(compiles=compiles, graph_breaks=sum(counters["graph_break"].values()),
                   compile_time_spent=calculate_time_spent())
    return out


def compiled_graphs():
    """Graphs Dynamo has compiled so far in this process: every recompile adds one."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def write_profile(profiler, args):
    os.makedirs(args.profile, exist_ok=True)
    steps = args.steps - args.warmup
    table = profiler.key_averages().table(sort_by="self_cpu_time_total",
                                          row_limit=args.profile_rows)
    with open(os.path.join(args.profile, "profile.txt"), "w") as f:
        f.write(f"# {steps} steps after {args.warmup} warm-up steps, compile = {args.compile}, "
                f"threads {torch.get_num_threads()}; self CPU time summed over the steps\n")
        f.write(table + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipeline", required=True, help="pipeline as JSON (see the docstring)")
    ap.add_argument("--save-init", help="write the initial weights to this safetensors file, exit")
    ap.add_argument("--init", help="initial weights (safetensors) for the run")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 = default")
    ap.add_argument("--optim-impl", default="fused", choices=IMPLS)
    ap.add_argument("--compile", default="none", choices=["none"] + COMPILE_MODES,
                    help="model.compile(mode=...) the twin (none: eager)")
    ap.add_argument("--layout", default="contiguous", choices=["contiguous", "channels_last"],
                    help="memory format of the model's 4-D tensors and of the batches")
    ap.add_argument("--warmup", type=int, default=0, help="steps before --profile starts")
    ap.add_argument("--profile", help="folder for the torch.profiler table of the steps after "
                                      "--warmup")
    ap.add_argument("--profile-rows", type=int, default=40, help="rows of the profile table")
    args = ap.parse_args()
    with open(args.pipeline) as f:
        pipe = json.load(f)
    if args.save_init:
        save_init(pipe, args.save_init)
        return
    if not args.init or args.steps < 1:
        ap.error("a run needs --init and --steps >= 1")
    if args.profile and not 0 <= args.warmup < args.steps:
        ap.error("--profile needs 0 <= --warmup < --steps")
    print(json.dumps(train(pipe, args)))


if __name__ == "__main__":
    main()
