"""The PyTorch arm of bench/gpu_throughput.py: one ResNet-50 training run as a plain PyTorch
loop, in its own process (its peak memory is its own), printed as one JSON line on stdout.

  # once per image size: the twin's seeded weights (safetensors, no num_batches_tracked) and the
  # synthetic training set (uint8 .npy pair, Kiln's dataset bit for bit), then exit
  python bench/gpu_reference.py --pipeline P.json --save-init W.safetensors --save-data D
  # one run
  python bench/gpu_reference.py --pipeline P.json --init W.safetensors --data D --mode amp \\
      --device cuda --steps 200 --workers 4
  # the same with the twin compiled (the first --warmup steps compile)
  python bench/gpu_reference.py ... --mode amp --compile max-autotune --steps 60 --warmup 20

P.json is the pipeline bench/gpu_throughput.py also hands Kiln (as TOML): [model] (resnet,
depth 50), [data] (synthetic: channels, height, width, synthetic_*, batch_size, mean, std),
[optimizer] (sgd: lr, momentum, weight_decay) and [run] (seed, threads).

What a run does, mirroring `kiln run` with the same pipeline:
- model: bench/models.py's ResNet50 twin (plugins/model/resnet depth "50"), weights from --init
  (strict load), model.train(); mode amp: model and inputs channels_last, forward under
  torch.autocast (fp16 on CUDA, bf16 on the CPU), loss on fp32 logits, torch.amp.GradScaler
  (enabled for fp16 only, like Kiln's amp whose scaling "auto" is dynamic for fp16 and none for
  bf16; GradScaler's defaults are Kiln's: init 2^16, x2 every 2000 clean steps, x0.5 on
  overflow); modes tf32 / fp32: contiguous fp32 with TF32 on / off for cuBLAS and cuDNN (amp keeps
  PyTorch's defaults: cuDNN on, cuBLAS off = Kiln's run.tf32 "default"). CUDA:
  torch.backends.cudnn.benchmark = True (Kiln's run.cudnn_benchmark, set explicitly there too).
- data: torch.utils.data.DataLoader over the in-memory uint8 set, batched fetching (a
  BatchSampler over SequentialSampler, drop_last, as Kiln's data.shuffle = false and
  data.drop_last = true, repeated endlessly so that one iterator prefetches across epochs, as
  Kiln's loader does): each batch is gathered by index and normalised in one go in a worker
  process (x / 255, minus mean, over std: host/data/assembler.cpp's order of operations),
  num_workers = --workers (Kiln's data.workers threads), persistent_workers, pin_memory on CUDA
  (Kiln's assembler writes batches into pinned memory on a CUDA machine), prefetch_factor left
  at its default; then .to(device, non_blocking=True) and, under amp, channels_last on the
  device (Kiln: the same copy, then in_model_layout).
- optimizer: torch.optim.SGD (momentum, weight decay on every parameter as Kiln's default
  groups, constant lr), fused=True by default (Kiln's sgd plugin steps with ATen's fused SGD
  kernel); --optim-impl picks another. The fused twin starts from zeroed momentum buffers:
  torch 2.11's own start loses them when GradScaler skips the first step, and every loss after
  it is non-finite (bench/torch_optim.py; the first four GPU runs' PyTorch arms trained so).
- threads: torch.set_num_threads(run.threads) when it is above 0 (Kiln's run.threads).
- --compile MODE (not none): the twin compiled in place, model.compile(mode=...) (None for
  "default"; inductor), after its weights are loaded and it is moved to the device and memory
  format, as bench/train_reference.py does: the same module, so parameter names, the optimizer
  and GradScaler are unchanged; cross_entropy, the scaler and the optimizer step stay eager.
  Compilation is lazy: the first step traces and compiles the forward and, in its backward, the
  backward graph (max-autotune also benchmarks inductor's kernel choices then, and on CUDA adds
  CUDA graphs, which record in the next steps), so the first steps carry it; --warmup must cover
  them (the driver drops them). The JSON then also carries, per step, the number of graphs Dynamo
  has compiled so far ("compiles"), "compile_s" (the warm-up steps that compiled a graph, less
  the median measured step each), "recompiled_at" (the first step after --warmup in which a graph
  was compiled, counting from 0: its compile time is inside the measured steps; null when none),
  the graph breaks, inductor's count of graphs run without the CUDA graphs their mode asked for
  ("cudagraph_skips") and Dynamo's own account ("dynamo_compile_s",
  torch._dynamo.utils.calculate_time_spent's total_wall_time).

Timing, per step, as Kiln's trainer does: zero_grad(set_to_none) before the clock (Kiln zero_grads
before step_start); data_time = waiting for the loader's next batch; step_time = the host-to-device
copy, forward, loss, backward, GradScaler / optimizer step and loss.item(), which waits for the
GPU (Kiln reads the loss back once per step, so its step_time also ends after the device
finished): no torch.cuda.synchronize() beyond that. Peak memory: memory_mb =
torch.cuda.max_memory_allocated over the whole process (nothing else lives on the device: the
data set stays on the host, as in Kiln, whose memory_mb is the caching allocator's peak of
allocated bytes over the run), and memory_steady_mb = the same peak over the steps after
--warmup (the peak statistics are reset after zero_grad of step --warmup, where Kiln resets them
every step for its tensor_peak_mb), which leaves out cuDNN's benchmark search of the first steps
and its trial workspaces; on the CPU memory_mb is the process's peak RSS (workers not counted)
and there is no steady value.

Needs torch and numpy only: safetensors files are read and written by the safetensors package
when it is installed, else by the small codec below (the format is a JSON header and raw bytes).
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from bench_common import COMPILE_MODES, compile_time  # noqa: E402
from torch_optim import IMPLS, make_optimizer  # noqa: E402
from train_reference import compiled_graphs, load_train  # noqa: E402  (synthetic set bit for bit)

HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
MODES = ("amp", "tf32", "fp32")


# ---- safetensors without the package -----------------------------------------------------------

ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8"}


def save_safetensors(tensors, path):
    try:
        from safetensors.torch import save_file
    except ImportError:
        pass
    else:
        save_file(tensors, path)
        return
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def load_safetensors(path):
    try:
        from safetensors.torch import load_file
    except ImportError:
        pass
    else:
        return load_file(path)
    by_name = {v: k for k, v in ST_DTYPES.items()}
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = torch.frombuffer(bytearray(data[8 + n + a:8 + n + b]), dtype=torch.uint8)
        out[name] = raw.view(by_name[info["dtype"]]).reshape(info["shape"])
    return out


# ---- model, data ---------------------------------------------------------------------------------


def build_model(pipe):
    d = pipe["data"]
    return models.build_for_input(pipe["model"], d["channels"], d["height"], d["width"],
                                  d["synthetic_classes"])


def save_init(pipe, path):
    """The twin's seeded initialisation, without num_batches_tracked (Kiln's norm layers keep no
    such counter; load_state_dict puts it back on this side)."""
    torch.manual_seed(pipe["run"].get("seed", 0))
    model = build_model(pipe)
    save_safetensors({k: v.detach().contiguous().clone() for k, v in model.state_dict().items()
                      if not k.endswith("num_batches_tracked")}, path)


def save_data(pipe, prefix):
    images, labels, _ = load_train(pipe["data"], pipe["run"].get("seed", 0))
    np.save(prefix + ".images.npy", images.numpy())
    np.save(prefix + ".labels.npy", labels.numpy())


class BatchedSet(torch.utils.data.Dataset):
    """Map-style set indexed by a whole batch of indices: one gather and one normalisation per
    batch (the DataLoader's "loading batched data" path with batch_size=None)."""

    def __init__(self, images, labels, mean, std):
        self.images, self.labels, self.mean, self.std = images, labels, mean, std

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, indices):
        idx = torch.as_tensor(indices, dtype=torch.int64)
        x = self.images.index_select(0, idx).float().div_(255.0).sub_(self.mean).div_(self.std)
        return x, self.labels.index_select(0, idx)


def make_loader(pipe, data_prefix, workers, device):
    d = pipe["data"]
    images = torch.from_numpy(np.load(data_prefix + ".images.npy"))
    labels = torch.from_numpy(np.load(data_prefix + ".labels.npy"))
    expect = (d["synthetic_train"], d["channels"], d["height"], d["width"])
    if tuple(images.shape) != expect:
        raise SystemExit(f"{data_prefix}: images {tuple(images.shape)}, the pipeline says {expect}")
    ds = BatchedSet(images, labels, d["mean"], d["std"])
    epoch = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(ds),
                                          d["batch_size"], drop_last=d.get("drop_last", True))
    return torch.utils.data.DataLoader(ds, batch_size=None, sampler=EndlessBatches(epoch),
                                       num_workers=workers, pin_memory=device.type == "cuda",
                                       persistent_workers=workers > 0)


class EndlessBatches(torch.utils.data.Sampler):
    """One epoch's batches, again and again, as one stream. A DataLoader iterator ends with its
    sampler, and a new one starts with empty workers: at batch 256 on a GPU (16 batches an epoch)
    the restarts made the reference wait 65 ms a step for data, where Kiln's loader prefetches
    across epochs. One endless iterator keeps the prefetch going, as a long-running user loop
    does (detectron2's TrainingSampler is the same idea)."""

    def __init__(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        while True:
            yield from self.epoch


# ---- the run -------------------------------------------------------------------------------------


def train(pipe, args):
    device = torch.device(args.device)
    threads = pipe["run"].get("threads", 0)
    if threads > 0:
        torch.set_num_threads(threads)
    half = HALF[args.dtype] if args.dtype != "auto" else (
        torch.float16 if device.type == "cuda" else torch.bfloat16)
    amp = args.mode == "amp"
    if device.type == "cuda":
        if args.mode == "amp":  # PyTorch's defaults, = Kiln's run.tf32 = "default"
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = True
        else:
            torch.backends.cuda.matmul.allow_tf32 = args.mode == "tf32"
            torch.backends.cudnn.allow_tf32 = args.mode == "tf32"
        torch.backends.cudnn.benchmark = pipe["run"].get("cudnn_benchmark", True)
    torch.manual_seed(pipe["run"].get("seed", 0))
    layout = torch.channels_last if amp else torch.contiguous_format

    model = build_model(pipe)
    model.load_state_dict(load_safetensors(args.init), strict=True)
    model = model.to(device=device, memory_format=layout)
    model.train()
    if args.ddp:  # one process of torchrun's: NCCL on CUDA, Gloo on the CPU, as Kiln's DDP
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[local] if device.type == "cuda" else None)
    if args.compile != "none":  # in place and lazy: the first step compiles
        model.compile(mode=None if args.compile == "default" else args.compile)
    if pipe["optimizer"]["name"] != "sgd":
        raise SystemExit("gpu_reference.py mirrors the sgd optimizer only")
    group = dict(params=list(model.parameters()), lr_scale=1.0,
                 weight_decay=pipe["optimizer"].get("weight_decay", 0.0))
    opt = make_optimizer([group], pipe["optimizer"], args.optim_impl)
    scaler = torch.amp.GradScaler(device.type, enabled=amp and half == torch.float16)
    loader = make_loader(pipe, args.data, args.workers, device)

    step_times, data_times, losses, compiles = [], [], [], []
    clock = time.perf_counter
    it = iter(loader)
    run_peak = 0.0
    trace = StepTrace(args, device)
    for step in range(args.steps):
        trace.before(step + 1)
        opt.zero_grad(set_to_none=True)
        if step == args.warmup and device.type == "cuda":
            # The steady-state peak leaves out the first steps' cuDNN benchmark workspaces; Kiln
            # resets the device's peak at the same point of every step (tensor_peak_mb).
            torch.cuda.reset_peak_memory_stats(device)
        t0 = clock()
        x, y = next(it)  # endless: epochs follow each other in the same order (shuffle = false)
        t1 = clock()
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        if amp:
            x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=half):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        value = loss.item()
        t2 = clock()
        data_times.append(t1 - t0)
        step_times.append(t2 - t1)
        losses.append(value if math.isfinite(value) else None)
        if args.compile != "none":
            compiles.append(compiled_graphs())
        if step + 1 == args.warmup and device.type == "cuda":
            run_peak = torch.cuda.max_memory_allocated(device) / 2**20
        trace.after(step + 1)
    trace.close()

    steady = None
    if device.type == "cuda":
        steady = torch.cuda.max_memory_allocated(device) / 2**20
        memory = max(run_peak, steady)
        name = torch.cuda.get_device_name(device)
    else:
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
        name = "cpu"
    out = {"step_time": step_times, "data_time": data_times, "loss": losses,
           "memory_mb": memory, "memory_steady_mb": steady, "device_name": name,
           "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
           "dtype": str(half).replace("torch.", "") if amp else "float32",
           "loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
           "threads": torch.get_num_threads(), "workers": args.workers,
           "optim_impl": args.optim_impl, "compile": args.compile}
    if args.compile != "none":
        out.update(compile_account(step_times, compiles, args.warmup))
    return out


def compile_account(step_times, compiles, warmup):
    """The compiled twin's compile time (bench_common.compile_time) and the first measured step
    that compiled a graph, if any (not an error here: the run's numbers come back, flagged, rather
    than a GPU session's minutes lost)."""
    from torch._dynamo.utils import calculate_time_spent, counters

    compile_s, _, late = compile_time(step_times, compiles, warmup)
    return {"compiles": compiles, "compile_s": compile_s,
            "recompiled_at": late, "graph_breaks": sum(counters["graph_break"].values()),
            # graphs inductor ran without the CUDA graphs its mode asked for (max-autotune,
            # reduce-overhead on CUDA); TORCH_LOGS=perf_hints says why
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
            "dynamo_compile_s": calculate_time_spent().get("total_wall_time", math.nan)}


class StepTrace:
    """--profile: torch.profiler (Kineto) around steps --profile-start ... + --profile-steps - 1
    (counting from 1), each in a ProfilerStep#N span, as Kiln's run.profile_steps traces its
    steps; the Chrome trace goes to --profile."""

    def __init__(self, args, device):
        self.path, self.first = args.profile, args.profile_start
        self.last = args.profile_start + args.profile_steps - 1
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            self.activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = self.span = None

    def before(self, step):
        if not self.path or not self.first <= step <= self.last:
            return
        if self.profiler is None:
            self.profiler = torch.profiler.profile(activities=self.activities, record_shapes=True)
            self.profiler.__enter__()
        self.span = torch.profiler.record_function(f"ProfilerStep#{step}")
        self.span.__enter__()

    def after(self, step):
        if self.span is not None:
            self.span.__exit__(None, None, None)
            self.span = None
        if self.profiler is not None and step == self.last:
            self.close()

    def close(self):
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.profiler.export_chrome_trace(self.path)
            self.profiler = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline", required=True, help="pipeline as JSON (see the docstring)")
    ap.add_argument("--save-init", help="write the twin's initial weights here (safetensors)")
    ap.add_argument("--save-data", help="write the synthetic training set as PREFIX.{images,"
                                        "labels}.npy")
    ap.add_argument("--init", help="initial weights (safetensors) for the run")
    ap.add_argument("--data", help="PREFIX of the .npy pair written by --save-data")
    ap.add_argument("--mode", choices=MODES, default="amp")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="auto", choices=["auto", "fp16", "bf16"],
                    help="autocast dtype of amp; auto = fp16 on CUDA, bf16 on the CPU")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=0,
                    help="steps before the measured ones: CUDA's steady-state peak memory starts "
                         "after them, and --compile needs >= 1 (the compiling steps)")
    ap.add_argument("--workers", type=int, default=4, help="DataLoader num_workers")
    ap.add_argument("--optim-impl", default="fused", choices=IMPLS)
    ap.add_argument("--compile", default="none", choices=["none"] + COMPILE_MODES,
                    help="model.compile(mode=...) the twin (none: eager)")
    ap.add_argument("--ddp", action="store_true",
                    help="wrap the twin in DistributedDataParallel (run it under torchrun)")
    ap.add_argument("--profile", default="", help="Chrome trace of the steps below (StepTrace)")
    ap.add_argument("--profile-start", type=int, default=1, help="first step traced, from 1")
    ap.add_argument("--profile-steps", type=int, default=3, help="steps traced")
    args = ap.parse_args()
    with open(args.pipeline) as f:
        pipe = json.load(f)
    if args.save_init or args.save_data:
        if args.save_init:
            save_init(pipe, args.save_init)
        if args.save_data:
            save_data(pipe, args.save_data)
        return
    if not args.init or not args.data or args.steps < 1:
        ap.error("a run needs --init, --data and --steps >= 1")
    if args.compile != "none" and not 1 <= args.warmup < args.steps:
        ap.error("--compile needs 1 <= --warmup < --steps (the first steps compile)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this torch sees no CUDA device")
    result = train(pipe, args)
    if args.ddp:
        torch.distributed.destroy_process_group()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
