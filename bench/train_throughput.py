"""Training throughput on the CPU: Kiln (`kiln run`) vs a plain PyTorch loop, eager and compiled.

Each case trains the same model for a few dozen steps in every arm and reports steps/s and data
time per step; Kiln ÷ X is the ratio of steps/s (above 1: Kiln is faster). The arms (--arms,
default kiln,eager,compiled; the first is the one the others are compared with):
  kiln      `kiln run` of the case's pipeline;
  eager     bench/train_reference.py: the Python twin of Kiln's model in a plain PyTorch loop;
  compiled  the same loop with the twin compiled in place, model.compile(mode=--compile-mode),
            torch.compile's inductor backend (C++/OpenMP kernels on the CPU);
  bare      (--bare, cnn and tiny) a bare C++ loop of the same ATen ops, see below.
What the arms share, per case (PyTorch arm = eager and compiled):

- the torch build: Kiln links the LibTorch of the Python venv's torch; the bench checks that
  `ldd kiln` resolves libtorch_cpu.so to the file in --python's torch/lib and says so with the
  table;
- the model: Python twins of Kiln's model plugins (bench/models.py, same parameter names), and
  the same initial weights: bench/train_reference.py --save-init writes the twin's seeded
  initialisation to a safetensors file that Kiln loads through model.init and the PyTorch arm
  through load_state_dict;
- the data, in memory as uint8 on both sides: Fashion-MNIST's IDX files (Kiln's own reader; the
  reference reads the same files), or for 3-channel images Kiln's synthetic dataset, which
  train_reference.py regenerates bit for bit (Kiln's IDX reader takes 1-channel images only);
  no shuffling (data.shuffle = false: both arms walk the set in order, so they see the same
  batches), no augmentation, Kiln's normalisation (x / 255, minus mean, over std, on the batch);
- batch size, SGD (momentum 0.9; lr, Nesterov, weight decay and the parameter-group rules from
  the case's pipeline), a constant lr without warm-up, fp32, seed 0;
- threads: run.threads = --threads for Kiln, which makes it call at::set_num_threads and nothing
  else (host/engine/trainer.cpp), and torch.set_num_threads(--threads) alone in the reference:
  the inter-op pool is left at torch's default on both sides. Kiln's loader runs with
  data.workers = 0 (batches assembled on the training thread, inside its data_time), so no
  extra thread competes with the compute threads, as in the reference loop;
- the optimizer kernel: Kiln's sgd plugin steps fp32 parameters with ATen's fused SGD kernel, so
  the reference uses torch.optim.SGD(fused=True) by default (--torch-optim default gives torch's
  own choice, the per-parameter for-loop on the CPU).

Not shared by default: the memory format. Kiln runs its model.memory_format (--memory-format,
default "auto": channels_last for a convolutional model on the CPU, with the convolutions on
small maps with many channels kept NCHW on an AVX-512 CPU); the twins run PyTorch's default,
NCHW (--twin-layout contiguous), as a PyTorch user gets them; --twin-layout channels_last moves
the twin and each batch to NHWC (model.to(memory_format=...)), as a user would ask for. The
table says which layout each side ran ("channels_last (4 NCHW)": four convolutions kept NCHW).

Not shared by default: the C heap. `kiln run` raises glibc's mmap and trim thresholds for itself
(host/io/heap.cpp), so step-sized blocks are not handed back to the kernel and faulted in again
every step; the PyTorch arm runs with glibc's defaults, as a Python user gets them.
--torch-malloc kiln gives it the same settings through MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_, which leaves the host's own cost in the ratio. Nor is Kiln's CPU tensor
allocator (host/io/memory.cpp), which keeps freed blocks of up to 1 MiB per thread for reuse
(host/io/block_cache.hpp) and so spares glibc the consolidation that every free of 64 KiB or
more sets off; torch has no switch for it. The bare loop (--bare) installs both, the heap
settings and the allocator, so Kiln ÷ bare loop is the cost of the plugins and the host alone.

The compiled arm. Only the model is compiled (model.compile(): the same module object, parameter
names and state_dict keys, so the init file, the parameter groups and the twin check apply
unchanged); cross_entropy and the optimizer step stay eager, as in the eager arm: the step is
already one fused ATen kernel per parameter (SGD fused=True, the kernel Kiln's sgd plugin calls),
and compiling it too (torch.compile around opt.step, or a whole-step graph) would make the arm
a different program from Kiln's rather than Kiln's loop with compiled forward and backward, the
part a fused-kernel Kiln would replace. The first step traces and compiles the forward graph and,
inside its backward, the backward graph: that is the compile time, which --warmup keeps out of
steps/s. The bench checks that no graph is compiled after the warm-up (Dynamo's count of
compiled graphs, per step) and stops with RECOMPILE if one is: its compile time would be in the
steps/s; TORCH_LOGS=recompiles names the guard that failed. The table's "compile s" is, per
run, the time of the warm-up steps that compiled a graph (the first) less a steady step (the
median measured step) each: "first run" is the case's first compiled run (the discarded warm-up
run if there is one), with inductor's cache empty -- the bench gives inductor a fresh cache
folder (TORCHINDUCTOR_CACHE_DIR) per invocation, --compile-cache DIR to keep one --, and "later
runs" the median of the measured runs after it, which find the generated kernels in the cache
(Dynamo still traces and AOTAutograd still partitions). The stderr line of each compiled run adds
Dynamo's own compile-time account, the number of graphs and of graph breaks and the warm-up
steps' times next to the steady step's (to see that --warmup covers the slow first steps).
Numerics: inductor also lays the convolutions out channels-last (its layout optimisation), and
oneDNN's channels-last convolutions differ from its NCHW ones by more than reordering: on
resnet18 the first step's gradients are off fp64 by up to ~3e-3 relative (eager NCHW: ~3e-6;
eager with a channels-last model: ~8e-3). The first-step loss (the forward) still agrees to
~1e-7, but the losses drift from the second step on (after four updates: resnet18 at lr 0.01,
4e-3 compiled and 8e-3 eager against Kiln's channels-last; cnn at lr 0.1, 2e-4): the twin
check's verdict is the first step's.

Timing. Kiln: the whole cycle, from one step's start to the next (the `started` field of the
per-step records of `kiln run --metrics F`): zero_grad, the batch, forward, backward, the
gradient check, the optimizer, the loss read back, and the host's bookkeeping after the step
(writing the record, the progress line), all of it. PyTorch, eager and compiled
(train_reference.py): time.perf_counter around the batch gather + normalisation (data time) and
around zero_grad, forward, loss, backward, optimizer.step and loss.item() (step time). The bare
loop: the same span as PyTorch's. Per run, the first --warmup steps are dropped; steps/s =
measured steps / their summed time, samples/s = steps/s x batch, data ms/step = mean data_time.
Every run is a fresh process; per case, one discarded warm-up run per arm (--warmup-runs), then
--repeats runs per arm, their order rotated by one every second repetition and reversed every
other one (two arms: AB, BA, BA, AB, ...; three: all six orders over six repetitions), so that a
drift of the machine's speed favours no arm. Ratios are per pair of runs of the same repetition;
the table gives their median and min–max. The bench waits for the 1-minute load average to fall
below --max-load before it starts: on 2 cores any other busy process stalls 2-thread steps (a
preempted worker holds up the whole op).

Twin check. The first step's loss comes before any update, so with the same weights and batch it
must agree between the arms to about 1e-4 (fp32 reduction order; inductor's fused kernels sum in
their own order too): the table prints it per case and arm (against the first arm) and a
mismatch is flagged loudly, since a twin that is not the same model voids the comparison. The
largest loss gap over the first steps (after updates: checks the optimizer too) is printed next
to it.

Cases (default steps / warm-up steps; --steps and --warmup override them):
  cnn       the quickstart's small ResNet (width 16, blocks [1, 1, 1], batchnorm) on
            Fashion-MNIST, batch 128, its SGD (lr 0.1, Nesterov, weight decay 5e-4)   60 / 10
  tiny      dispatch-bound: mlp with 16 hidden layers of 64, Fashion-MNIST, batch 16,
            SGD lr 0.01, momentum 0.9, weight decay 5e-4                               400 / 50
  resnet18  resnet depth 18 (32-pixel input: conv3x3 stem, no max-pool) on synthetic
            3x32x32 images, batch 32, the quickstart's SGD at lr 0.01 (at its 0.1 the
            loss diverged within 5 steps, so the twins' losses parted)                30 / 5
  vit       configs/vit.toml's model on Fashion-MNIST, batch 128, SGD momentum 0.9 at
            vit.toml's lr (1e-3) and weight decay 0.05 with its group rules          30 / 5
--quick: cnn 12 / 4, tiny 60 / 20, resnet18 5 / 2, vit 5 / 2, one run per arm, no warm-up runs.

--bare adds an arm for cnn and tiny, build/release/bench/bench_bare_loop (a bare C++ loop of the
same ATen ops, no plugins or host; bench/bare_loop.cpp), given the same init file, batch, SGD
settings and unshuffled data (--shuffle 0) and running under Kiln's heap settings (its
default); it takes its turn in the rotation and gets the columns Kiln ÷ bare loop ("—" for the
other cases) and rows in the twin check (its --losses 1 per-step losses).

Profiling the PyTorch arms (--profile DIR, instead of the table): per case, one eager and one
compiled run of the case's steps, the steps after --warmup under torch.profiler (CPU), each
arm's op table sorted by self CPU time in DIR/<case>/<arm>/profile.txt. The compiled run gets an
empty inductor cache and TORCH_COMPILE_DEBUG=1 with TORCH_COMPILE_DEBUG_DIR=DIR/<case>/compiled,
so inductor writes its generated code there (torch_compile_debug/run_*/torchinductor/*/
output_code.py: the forward and the backward graph, their C++ kernels and the calls into ATen);
DIR/<case>/compiled/kernels.txt lists, per graph, the fused kernels (cpp_fused_<ops>_<n>: the
ops inductor fused into one loop nest) and the ATen calls (extern_kernels.convolution, mm, ...)
in call order -- what a fused Kiln kernel would have to cover.

  # the table (kiln, eager, compiled; over 10 minutes on 2 cores: every compiled run compiles):
  ~/.cache/kiln/venv/bin/python bench/train_throughput.py
  # Kiln vs eager only, as before the compiled arm (about 10 minutes; 11 with --bare):
  ~/.cache/kiln/venv/bin/python bench/train_throughput.py --arms kiln,eager
  # with a moving average of the weights in every arm (Kiln's [ema], timm's ModelEmaV3):
  ~/.cache/kiln/venv/bin/python bench/train_throughput.py --arms kiln,eager --ema 0.9998
  # the compiled arm in another mode (max-autotune also benchmarks inductor's C++ GEMM templates):
  ~/.cache/kiln/venv/bin/python bench/train_throughput.py --compile-mode max-autotune
  # smoke run (1 repeat, few steps, no warm-up runs; a few minutes):
  ~/.cache/kiln/venv/bin/python bench/train_throughput.py --quick
  # profile tables and inductor's generated code for cnn (a minute or two):
  ~/.cache/kiln/venv/bin/python bench/train_throughput.py --cases cnn --quick --profile /tmp/prof
"""
import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib

from bench_common import (COMPILE_MODES, compile_time, cpu_name, fmt_spread, run_kiln_pipeline,
                          torch_build, twin_verdict)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FMNIST = "/usr/share/datasets/fashion-mnist"
TRAIN_SAMPLES = {"fashion-mnist": 60000}
LOSS_TOL = 1e-4      # first-step loss, absolute
LOSS_STEPS = 5       # the optimizer check compares the losses of this many first steps
TINY_HIDDEN = [64] * 16
# The glibc heap settings `kiln run` applies to itself (host/io/heap.cpp), for --torch-malloc kiln.
KILN_HEAP = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}


def load_config(name):
    with open(os.path.join(REPO, "configs", name), "rb") as f:
        return tomllib.load(f)


def case_spec(case):
    """Model, optimizer, data, batch and step counts of a case: the parts of the pipeline that
    both arms take."""
    quick = load_config("quickstart.toml")
    sgd = {k: v for k, v in quick["optimizer"].items()}  # lr 0.1, momentum 0.9, nesterov, wd 5e-4
    fmnist = {"dataset": "fashion-mnist", "root": FMNIST}
    if case == "cnn":
        return dict(model=quick["model"], optimizer=sgd, data=fmnist, batch=128, steps=60,
                    warmup=10, quick=(12, 4))
    if case == "tiny":
        return dict(model={"name": "mlp", "hidden": TINY_HIDDEN},
                    optimizer={"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4},
                    data=fmnist, batch=16, steps=400, warmup=50, quick=(60, 20))
    if case == "resnet18":
        # lr 0.01: at the quickstart's 0.1 the loss rose from 2.3 to 4-70 within five steps at
        # batch 32, where a last-bit difference in the first step ends in another loss.
        return dict(model={"name": "resnet", "depth": "18"}, optimizer=dict(sgd, lr=0.01),
                    data={"dataset": "synthetic", "channels": 3, "height": 32, "width": 32,
                          "synthetic_classes": 10, "synthetic_test": 32},
                    batch=32, steps=30, warmup=5, quick=(5, 2))
    if case == "vit":
        vit = load_config("vit.toml")
        opt = {k: v for k, v in vit["optimizer"].items()
               if k not in ("name", "beta1", "beta2", "eps", "amsgrad")}
        opt.update(name="sgd", momentum=0.9)
        return dict(model=vit["model"], optimizer=opt, data=fmnist,
                    batch=vit["data"]["batch_size"], steps=30, warmup=5, quick=(5, 2))
    raise KeyError(case)


CASES = ["cnn", "tiny", "resnet18", "vit"]
BARE_CASES = ("cnn", "tiny")
ARMS = ["kiln", "eager", "compiled", "bare"]


def pipeline(case, steps, args):
    """The case's pipeline; the same dict goes to Kiln (TOML) and to train_reference.py (JSON)."""
    spec = case_spec(case)
    batch = args.batch or spec["batch"]
    data = dict(spec["data"], batch_size=batch, workers=0, shuffle=False, drop_last=False,
                random_crop=0, random_flip=False, mean=0.286, std=0.353)
    if data["dataset"] == "synthetic":
        # Room for every step without an epoch boundary (and its end-of-epoch work).
        data["synthetic_train"] = steps * batch + batch
        samples = data["synthetic_train"]
    else:
        data["root"] = args.data_root or data["root"]
        samples = TRAIN_SAMPLES[data["dataset"]]
    return {
        "run": {"device": "cpu", "seed": 0, "max_steps": steps,
                "epochs": max(1, math.ceil(steps / math.ceil(samples / batch))),
                "log_interval": steps, "threads": args.threads, "eval": False,
                "checkpoints": False, "tensorboard": False},
        "data": data,
        "model": dict(spec["model"], memory_format=args.memory_format),
        "norm": {"name": "batchnorm"},
        "optimizer": dict(spec["optimizer"]),
        "lr_policy": {"name": "constant", "warmup": "none"},
        "precision": {"name": "fp32"},
        **({"ema": {"decay": args.ema, "warmup": True}} if args.ema > 0 else {}),
    }


# ---- one run per arm ----------------------------------------------------------------------------


def summarise(step_times, data_times, losses, warmup, batch):
    st, dt = step_times[warmup:], data_times[warmup:]
    total = sum(st) + sum(dt)
    steps_per_s = len(st) / total
    return {"steps_per_s": steps_per_s, "samples_per_s": steps_per_s * batch,
            "data_ms": 1e3 * sum(dt) / len(dt), "first_loss": losses[0],
            "losses": losses[:LOSS_STEPS], "steps": len(step_times)}


def run_kiln(cfg, init, steps, warmup, args, work):
    records, log = run_kiln_pipeline(args.kiln, cfg, init, steps, work)
    # The whole cycle from one step's start to the next: the host's bookkeeping after a step
    # (its record, the progress line) counts too. The last step has no next start, so the
    # cycles are those of steps warmup+1 .. steps-1.
    starts = [r["started"] for r in records]
    cycles = [b - a for a, b in zip(starts, starts[1:])]
    out = summarise(cycles, [0.0] * len(cycles), [r["loss"] for r in records], warmup,
                    cfg["data"]["batch_size"])
    data = [r["data_time"] for r in records[warmup:]]
    out["data_ms"] = 1e3 * sum(data) / len(data)
    # The layout model.memory_format resolved to (run setup logs a restride to channels_last).
    out["layout"] = ("channels_last" if any("memory format channels_last" in line for line in log)
                     else "contiguous")
    # ... and the convolutions it kept NCHW ("auto" on an AVX-512 CPU: small maps, many channels).
    kept = [re.search(r"memory format: (\d+) convolutions on small maps stay NCHW", line)
            for line in log]
    kept = [int(m.group(1)) for m in kept if m]
    if kept:
        out["layout"] += f" ({kept[0]} NCHW)"
    return out


def reference_cmd(cfg, init, steps, args, work, compile_mode):
    """train_reference.py's command line and environment for one run of the eager arm
    (compile_mode None) or the compiled arm."""
    path = os.path.join(work, "pipeline.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    cmd = [args.python, os.path.join(HERE, "train_reference.py"), "--pipeline", path,
           "--init", init, "--steps", str(steps), "--threads", str(args.threads),
           "--optim-impl", args.torch_optim, "--compile", compile_mode or "none",
           "--layout", args.twin_layout]
    env = dict(os.environ)
    if args.torch_malloc == "kiln":
        env.update(KILN_HEAP)
    if compile_mode:
        env["TORCHINDUCTOR_CACHE_DIR"] = args.compile_cache
    return cmd, env


def run_torch(cfg, init, steps, warmup, args, work, compile_mode=None):
    cmd, env = reference_cmd(cfg, init, steps, args, work, compile_mode)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"train_reference.py exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["threads"] != args.threads:
        raise RuntimeError(f"train_reference.py ran {out['threads']} threads, not {args.threads}")
    res = summarise(out["step_time"], out["data_time"], out["loss"], warmup,
                    cfg["data"]["batch_size"])
    if compile_mode:
        res.update(compile_summary(out, warmup))
    return res


def compile_summary(out, warmup):
    """The compiled arm's compile time: the time above a steady step (the median measured step)
    of every warm-up step in which Dynamo compiled a graph (the first step always does); raises if
    a graph was compiled in a measured step, since its compile time would then be in steps/s."""
    compiles, times = out["compiles"], out["step_time"]
    compile_s, steady, late = compile_time(times, compiles, warmup)
    if late is not None:
        raise RuntimeError(f"RECOMPILE in measured step {late + 1} (after {warmup} warm-up steps; "
                           f"graphs compiled per step: {compiles}): raise --warmup, or find the "
                           f"guard that failed with TORCH_LOGS=recompiles")
    spent = out["compile_time_spent"]
    return {"compile_s": compile_s, "graphs": compiles[-1],
            "warmup_steps_s": times[:warmup], "steady_s": steady,
            "graph_breaks": out["graph_breaks"],
            "dynamo_compile_s": spent.get("total_wall_time", math.nan)}


def run_bare(case, cfg, init, steps, warmup, args, work):
    """bench_bare_loop with the case's batch, SGD settings and unshuffled data; its heap is tuned
    and its CPU allocator is Kiln's, as in `kiln run` (its defaults)."""
    opt, data = cfg["optimizer"], cfg["data"]
    cmd = [args.bare_bin, "--case", case, "--steps", str(steps), "--warmup", str(warmup),
           "--threads", str(args.threads), "--batch", str(data["batch_size"]),
           "--init", init, "--data-root", data["root"], "--shuffle", "0",
           "--lr", repr(opt["lr"]), "--momentum", repr(opt.get("momentum", 0.0)),
           "--dampening", repr(opt.get("dampening", 0.0)),
           "--nesterov", "1" if opt.get("nesterov", False) else "0",
           "--weight-decay", repr(opt.get("weight_decay", 0.0)), "--losses", "1"]
    if case == "tiny":
        cmd += ["--hidden", ",".join(str(h) for h in cfg["model"]["hidden"])]
    else:
        cmd += ["--width", str(cfg["model"]["width"]),
                "--blocks", ",".join(str(b) for b in cfg["model"]["blocks"])]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # --losses 1: "step N loss X" lines on stderr, for the same loss check as the PyTorch arm.
    losses = [float(line.split()[3]) for line in proc.stderr.splitlines()
              if line.startswith("step ") and " loss " in line]
    out["losses"] = losses[:LOSS_STEPS] or [out["first_loss"]]
    return out


def make_init(cfg, args, work):
    """The twin's initial weights, written once per case and loaded by every arm."""
    path = os.path.join(work, "init.safetensors")
    spec = os.path.join(work, "init-pipeline.json")
    with open(spec, "w") as f:
        json.dump(cfg, f)
    proc = subprocess.run([args.python, os.path.join(HERE, "train_reference.py"), "--pipeline",
                           spec, "--save-init", path], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"train_reference.py --save-init exited {proc.returncode}:\n"
                           f"{proc.stderr[-3000:]}")
    return path


# ---- the bench ---------------------------------------------------------------------------------


def wait_for_quiet(args):
    """Measurements on a busy machine say little: wait for the 1-minute load to drop."""
    if args.max_load <= 0:
        return
    waited = 0
    while os.getloadavg()[0] >= args.max_load:
        if waited >= args.wait_load:
            print(f"# WARNING: load {os.getloadavg()[0]:.2f} still >= {args.max_load} after "
                  f"{waited} s; measuring anyway", file=sys.stderr, flush=True)
            return
        if waited == 0:
            print(f"# load {os.getloadavg()[0]:.2f} >= {args.max_load}: waiting (up to "
                  f"{args.wait_load} s)", file=sys.stderr, flush=True)
        time.sleep(15)
        waited += 15


def case_steps(case, args):
    spec = case_spec(case)
    steps, warmup = spec["quick"] if args.quick else (spec["steps"], spec["warmup"])
    return args.steps or steps, args.warmup if args.warmup is not None else warmup


def bench_case(case, args, tmp):
    steps, warmup = case_steps(case, args)
    if warmup >= steps:
        raise SystemExit(f"{case}: --warmup {warmup} must be below the {steps} steps")
    if warmup < 1 and "compiled" in args.arms:
        raise SystemExit(f"{case}: the compiled arm compiles in its first step: --warmup >= 1")
    cfg = pipeline(case, steps, args)
    root = os.path.join(tmp, case)
    os.makedirs(root)
    init = make_init(cfg, args, root)
    arms = [a for a in args.arms if a != "bare" or (args.bare_ok and case in BARE_CASES)]
    runners = {
        "kiln": lambda w: run_kiln(cfg, init, steps, warmup, args, w),
        "eager": lambda w: run_torch(cfg, init, steps, warmup, args, w),
        "compiled": lambda w: run_torch(cfg, init, steps, warmup, args, w, args.compile_mode),
        "bare": lambda w: run_bare(case, cfg, init, steps, warmup, args, w),
    }
    results = {arm: [] for arm in arms}
    first_compile = []  # the compiled arm's first run (cold inductor cache), warm-up run or not
    schedule = [("warm-up", i, arm_order(arms, i)) for i in range(args.warmup_runs)]
    schedule += [("rep", r, arm_order(arms, r)) for r in range(args.repeats)]
    for kind, r, order in schedule:
        for arm in order:
            work = os.path.join(root, f"{kind}{r}-{arm}")
            os.makedirs(work)
            time.sleep(args.settle)
            out = runners[arm](work)
            label = "warm-up (discarded)" if kind == "warm-up" else f"rep {r + 1}/{args.repeats}"
            extra = ""
            if arm == "compiled":
                extra = (f", compile {out['compile_s']:.1f} s (Dynamo's account "
                         f"{out['dynamo_compile_s']:.1f} s), {out['graphs']} graph(s), "
                         f"{out['graph_breaks']} graph break(s); warm-up steps "
                         + " ".join(f"{t:.3f}" for t in out["warmup_steps_s"])
                         + f" s, steady {out['steady_s']:.3f} s")
                if not first_compile:
                    first_compile.append(out["compile_s"])
                elif kind == "rep":
                    out["warm_compile_s"] = out["compile_s"]
            print(f"# {case} {label} {arm}: {out['steps_per_s']:.2f} steps/s, data "
                  f"{out['data_ms']:.2f} ms/step, first loss {out['first_loss']}{extra}",
                  file=sys.stderr, flush=True)
            if kind == "rep":
                results[arm].append(out)
    return dict(results=results, steps=steps, warmup=warmup, batch=cfg["data"]["batch_size"],
                cfg=cfg, cold_compile_s=first_compile[0] if first_compile else None)


def profile_case(case, args, tmp):
    """--profile: one run of the eager and one of the compiled arm, the steps after the warm-up
    under torch.profiler; the compiled one with a fresh inductor cache and TORCH_COMPILE_DEBUG=1,
    so that inductor writes its generated code (output_code.py per graph) into the folder."""
    steps, warmup = case_steps(case, args)
    if not 1 <= warmup < steps:
        raise SystemExit(f"{case}: --profile needs 1 <= --warmup < --steps")
    cfg = pipeline(case, steps, args)
    root = os.path.join(tmp, case)
    os.makedirs(root)
    init = make_init(cfg, args, root)
    out_dir = os.path.join(os.path.abspath(args.profile), case)
    for arm, mode in (("eager", None), ("compiled", args.compile_mode)):
        work = os.path.join(root, arm)
        os.makedirs(work)
        dest = os.path.join(out_dir, arm)
        cmd, env = reference_cmd(cfg, init, steps, args, work, mode)
        cmd += ["--warmup", str(warmup), "--profile", dest]
        if mode:
            env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(work, "inductor-cache"),
                       TORCH_COMPILE_DEBUG="1", TORCH_COMPILE_DEBUG_DIR=dest)
        wait_for_quiet(args)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"train_reference.py exited {proc.returncode}:\n"
                               f"{proc.stderr[-3000:]}")
        print(f"# {case} {arm}: {os.path.join(dest, 'profile.txt')}", file=sys.stderr, flush=True)
        if mode:
            kernels = inductor_kernels(dest)
            with open(os.path.join(dest, "kernels.txt"), "w") as f:
                f.write(kernels)
            print(f"# {case} compiled: {os.path.join(dest, 'kernels.txt')}\n{kernels}",
                  file=sys.stderr, flush=True)


def inductor_kernels(folder):
    """Per generated graph (output_code.py under `folder`): its path, the fused C++ kernels
    inductor wrote and the ops it left to ATen (extern_kernels.*, aten.*), in call order."""
    lines = []
    for dirpath, _, files in sorted(os.walk(folder)):
        if "output_code.py" not in files:
            continue
        path = os.path.join(dirpath, "output_code.py")
        with open(path) as f:
            code = f.read()
        body = code[code.find("def call("):]
        calls = re.findall(r"\b(cpp_fused_\w+|extern_kernels\.\w+|aten\.\w+(?:\.\w+)?)\(", body)
        lines.append(f"{path}: {sum(c.startswith('cpp_fused') for c in calls)} fused kernels, "
                     f"{sum(not c.startswith('cpp_fused') for c in calls)} ATen calls")
        lines += [f"  {c}" for c in calls]
    return "\n".join(lines or [f"no output_code.py under {folder}"]) + "\n"


def arm_order(arms, r):
    """The arms' order in repetition r: rotated by one every second repetition and reversed
    every other one, so that two arms alternate (AB, BA, BA, AB) and three run in all six
    orders over six repetitions; a drift of the machine's speed then favours no arm."""
    k = (r // 2) % len(arms)
    order = arms[k:] + arms[:k]
    return order[::-1] if r % 2 else order


def loss_check(a_runs, b_runs):
    """Largest first-step loss gap and largest gap over the first LOSS_STEPS steps over the
    paired runs; a missing or non-finite loss counts as an infinite gap."""
    def gap(x, y):
        if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
            return math.inf
        return abs(x - y)
    first = max(gap(a["first_loss"], b["first_loss"]) for a, b in zip(a_runs, b_runs))
    gaps = [gap(x, y) for a, b in zip(a_runs, b_runs) for x, y in zip(a["losses"], b["losses"])]
    return first, max(gaps) if gaps else math.nan


def machine(args):
    version, same, linked, python = args.torch_build
    link = ("Kiln links the same libtorch_cpu.so" if same else
            f"WARNING: Kiln links {linked or 'no libtorch_cpu.so'}, not this torch's")
    return (f"{cpu_name()} ({os.cpu_count()} logical CPUs); torch {version} ({link}), "
            f"Python {python}")


LABELS = {"kiln": "Kiln", "eager": "eager", "compiled": "compiled", "bare": "bare loop"}


def report(done, args):
    optim = "fused=True" if args.torch_optim == "fused" else f"({args.torch_optim})"
    heap = "Kiln's heap settings" if args.torch_malloc == "kiln" else "glibc's default heap"
    arms = [a for a in args.arms if any(a in d["results"] for d in done.values())]
    base, others = arms[0], arms[1:]  # Kiln when it runs: ratios and twin checks are against it
    print(f"\nMachine: {machine(args)}. Device cpu, threads {args.threads} (intra-op; inter-op "
          f"left at torch's default on both sides), fp32, {args.repeats} measured run(s) per arm "
          f"after {args.warmup_runs} discarded warm-up run(s). PyTorch arms: torch.optim.SGD "
          f"{optim}, {heap}"
          + (f"; compiled = model.compile(mode={args.compile_mode!r}), loss and optimizer step "
             f"eager" if "compiled" in arms else "")
          + (f"; every arm keeps a moving average of the weights (decay {args.ema}, warm-up: "
             f"Kiln's [ema], timm's ModelEmaV3 in the PyTorch arms)" if args.ema > 0 else "")
          + f". Load average at start {args.load_start:.2f}, at end {os.getloadavg()[0]:.2f}.\n")
    print(f"Reproduce: `{args.command}`\n")
    head = ["case", "batch", "steps (warm-up)", "layout (Kiln, twins)"]
    head += [f"{LABELS[a]} steps/s" for a in arms]
    head += [f"{LABELS[base]} ÷ {LABELS[a]}" for a in others]
    if "compiled" in arms:
        head += ["compile s, first run", "compile s, later runs"]
    head += [f"{LABELS[a]} data ms/step" for a in arms]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    checks = []
    for case, d in done.items():
        res = d["results"]
        col = lambda a, key, spec: (  # noqa: E731
            fmt_spread([r.get(key) for r in res[a]], spec) if a in res else "—")
        kiln_layout = res["kiln"][0].get("layout", "?") if "kiln" in res else "—"
        row = [case, str(d["batch"]), f"{d['steps']} ({d['warmup']})",
               f"{kiln_layout}, {args.twin_layout}"]
        row += [col(a, "steps_per_s", ".2f") for a in arms]
        for a in others:
            if base not in res or a not in res:
                row.append("—")
                continue
            ratios = [x["steps_per_s"] / y["steps_per_s"] for x, y in zip(res[base], res[a])]
            first, gap = loss_check(res[base], res[a])
            void = "" if first <= LOSS_TOL else " VOID: twin mismatch"
            row.append(f"**{fmt_spread(ratios, '.3f')}**{void}")
            checks.append((case, LABELS[a], res[base][0]["first_loss"], res[a][0]["first_loss"],
                           first, gap))
        if "compiled" in arms:
            cold = d["cold_compile_s"]
            row += ["—" if cold is None else f"{cold:.1f}",
                    col("compiled", "warm_compile_s", ".1f")]
        row += [col(a, "data_ms", ".2f") for a in arms]
        print("| " + " | ".join(row) + " |")
    print(f"\n{LABELS[base]} ÷ X: steps/s ratio, median (min–max) over the runs of the same "
          f"repetition; above 1 = {LABELS[base]} faster. Other columns: median (min–max) over "
          f"runs. steps/s = measured steps / their time (Kiln: start to start, bookkeeping "
          f"included; eager, compiled, bare loop: data + step time); samples/s = steps/s × batch.")
    if "compiled" in arms:
        print("compile s: the compiled arm's warm-up steps that compiled a graph (the first), "
              "less a steady step each; no graph is compiled after the warm-up (checked). First "
              "run: inductor's cache empty (a fresh cache per bench invocation unless "
              "--compile-cache); later runs: the measured runs after the first, which find the "
              "compiled kernels in the cache.")
    if args.bare and not args.bare_ok:
        print(f"Bare loop: no executable at {args.bare_bin}; its column is empty.")

    if not checks:
        print("\nTwin check: one arm only, nothing to compare.")
        return 0
    print("\nTwin check (same initial weights and batch, so the first-step losses must agree "
          f"to {LOSS_TOL:g}):\n")
    print(f"| case | arm | {LABELS[base]} first loss | arm first loss | max abs gap, first step "
          f"| max abs gap, first {LOSS_STEPS} steps | verdict |")
    print("|---|---|---:|---:|---:|---:|---|")
    bad = []
    for case, arm, kl, al, first, gap in checks:
        ok = first <= LOSS_TOL
        kl, al = (math.nan if v is None else v for v in (kl, al))
        if not ok:
            bad.append(f"{case} ({arm})")
        print(f"| {case} | {arm} | {kl:.6f} | {al:.6f} | {first:.2e} "
              f"| {'—' if gap is None else f'{gap:.2e}'} "
              f"| {'ok' if ok else '**MISMATCH: comparison void**'} |")
    return twin_verdict(bad, f"{LOSS_TOL:g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated cases (default: {','.join(CASES)})")
    ap.add_argument("--steps", type=int, default=0,
                    help="optimizer steps per run for every case (default: per case)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="first steps of each run left out of the measurement (default: per case)")
    ap.add_argument("--repeats", type=int, default=5, help="measured runs per arm and case")
    ap.add_argument("--warmup-runs", type=int, default=None,
                    help="discarded runs per arm at the start of each case (default 1; 0 "
                         "with --quick)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads in every arm")
    ap.add_argument("--memory-format", default="auto",
                    choices=["auto", "contiguous", "channels_last"],
                    help="Kiln's model.memory_format (the layout it picks is in the table)")
    ap.add_argument("--twin-layout", default="contiguous",
                    choices=["contiguous", "channels_last"],
                    help="the eager and compiled twins' layout: contiguous is PyTorch's default; "
                         "channels_last moves the model and each batch to NHWC")
    ap.add_argument("--batch", type=int, default=0, help="batch size for every case "
                                                          "(default: per case)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 repeat, few steps, no warm-up runs")
    ap.add_argument("--ema", type=float, default=0.0, metavar="DECAY",
                    help="a moving average of the weights in every arm: Kiln's [ema] (decay, "
                         "warmup = true), timm's ModelEmaV3 updated after each optimizer step in "
                         "the PyTorch arms (docs/ema.md); 0 (default): none")
    ap.add_argument("--bare", action="store_true",
                    help="third arm for cnn and tiny: the bare C++ loop (bench_bare_loop)")
    ap.add_argument("--arms", default=",".join(ARMS),
                    help=f"comma-separated arms, the first the others are compared with "
                         f"(default: {','.join(ARMS)})")
    ap.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                    help="torch.compile mode of the compiled arm")
    ap.add_argument("--compile-cache",
                    help="inductor's cache folder for the compiled arm (TORCHINDUCTOR_CACHE_DIR; "
                         "default: a fresh one per bench invocation, so its first run compiles "
                         "from scratch)")
    ap.add_argument("--profile", metavar="DIR",
                    help="instead of the table: one profiled run of the eager and the compiled "
                         "arm per case, their torch.profiler tables, inductor's generated code "
                         "and the names of its fused kernels under DIR (see the docstring)")
    ap.add_argument("--torch-optim", default="fused",
                    choices=["default", "foreach", "fused", "loop"],
                    help="torch.optim.SGD implementation of the PyTorch arm (default: fused, "
                         "the kernel Kiln's sgd plugin calls)")
    ap.add_argument("--torch-malloc", default="default", choices=["default", "kiln"],
                    help="glibc heap of the PyTorch arm: default = glibc's, as a Python user gets "
                         "it; kiln = the mmap/trim thresholds kiln run sets for itself")
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build", "release"),
                    help="build tree holding bin/kiln and bench/bench_bare_loop")
    ap.add_argument("--kiln", help="the kiln binary (default: BUILD_DIR/bin/kiln)")
    ap.add_argument("--bare-bin", help="the bare loop (default: BUILD_DIR/bench/bench_bare_loop)")
    ap.add_argument("--python", default=sys.executable,
                    help="Python with torch for the PyTorch arm (default: this one)")
    ap.add_argument("--data-root", help=f"Fashion-MNIST folder (default: {FMNIST})")
    ap.add_argument("--settle", type=float, default=0.5, help="idle seconds before each run")
    ap.add_argument("--max-load", type=float, default=1.0,
                    help="wait until the 1-minute load average is below this before measuring "
                         "(0: do not wait)")
    ap.add_argument("--wait-load", type=int, default=600,
                    help="seconds to wait for the load to drop before measuring anyway")
    args = ap.parse_args()
    # Run from the repository root.
    args.command = shlex.join([args.python, os.path.relpath(os.path.abspath(__file__), REPO)]
                              + sys.argv[1:])
    args.kiln = os.path.abspath(args.kiln or os.path.join(args.build_dir, "bin", "kiln"))
    args.bare_bin = os.path.abspath(
        args.bare_bin or os.path.join(args.build_dir, "bench", "bench_bare_loop"))
    if not os.access(args.kiln, os.X_OK):
        ap.error(f"no kiln binary at {args.kiln} (build it, or pass --kiln / --build-dir)")
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            ap.error(f"unknown case '{c}' (known: {', '.join(CASES)})")
    args.arms = [a for a in args.arms.split(",") if a]
    for a in args.arms:
        if a not in ARMS:
            ap.error(f"unknown arm '{a}' (known: {', '.join(ARMS)})")
    if not args.arms or len(set(args.arms)) != len(args.arms):
        ap.error("--arms: name each arm once, at least one")
    if args.ema > 0 and (args.bare or "bare" in args.arms):
        ap.error("--ema: the bare loop keeps no moving average")
    if args.bare and "bare" not in args.arms:
        args.arms.append("bare")
    if args.quick:
        args.repeats = 1
    if args.warmup_runs is None:
        args.warmup_runs = 0 if args.quick else 1
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be >= 1")
    args.bare_ok = args.bare and os.access(args.bare_bin, os.X_OK)
    if args.bare and not args.bare_ok:
        print(f"# no bare loop at {args.bare_bin}: its table is skipped", file=sys.stderr)

    if args.profile:
        with tempfile.TemporaryDirectory(prefix="kiln-throughput-") as tmp:
            for case in cases:
                profile_case(case, args, tmp)
        return
    args.torch_build = torch_build(args)
    if not args.torch_build[1]:
        print(f"# WARNING: kiln links {args.torch_build[2]}, not the libtorch of {args.python}: "
              f"the arms do not run the same torch build", file=sys.stderr)
    wait_for_quiet(args)
    args.load_start = os.getloadavg()[0]
    done = {}
    with tempfile.TemporaryDirectory(prefix="kiln-throughput-") as tmp:
        args.compile_cache = args.compile_cache or os.path.join(tmp, "inductor-cache")
        for case in cases:
            done[case] = bench_case(case, args, tmp)
    sys.exit(report(done, args))


if __name__ == "__main__":
    main()
