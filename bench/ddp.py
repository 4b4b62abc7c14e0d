"""Data-parallel step time on the CPU (Gloo, 2 local ranks): Kiln DDP vs torch DDP.

One run of this script measures, with the arms alternating:

  (a) Kiln's DDP (`kiln launch --nproc 2`, [dist] backend "gloo") against PyTorch's
      torch.nn.parallel.DistributedDataParallel (Gloo, 2 ranks: this script started twice as a
      worker with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set, as torchrun would);
  (b) gradient accumulation over --accumulation micro-batches per optimizer step: Kiln with
      dist.sync_every_micro_step = false (one all-reduce per optimizer step, like DDP's no_sync)
      against true (an all-reduce after every micro-batch), and the same pair in PyTorch
      (model.no_sync() on all micro-batches but the last, against none) as a reference;
  and, unless --no-baseline, one process without DDP at a rank's batch (batch / 2) on each
  side: the compute of a rank, so that what DDP adds to it shows.

Both sides train the same MLP (bench's --hidden widths; Linear + ReLU, flattened 1x28x28 input,
10 classes: Kiln's `mlp` plugin and a Python twin with the same parameter names, shapes and
order, hence the same gradient buckets) with SGD momentum 0.9 on in-memory synthetic data, the
same global batch (each rank gets batch / 2 per micro-batch), the same bucket_cap_mb, one
intra-op thread per rank (run.threads = 1 / torch.set_num_threads(1), OMP_NUM_THREADS=1) and
GLOO_SOCKET_IFNAME=lo on both sides.

Measured per run, on rank 0, per optimizer step: Kiln: step_time + data_time of its --metrics
records (the whole window: batches from the in-memory dataset without loader threads, forward,
backward, all-reduces, optimizer, loss.item()); PyTorch: time.perf_counter() around the same
span (indexing the pre-made tensors, forward, backward, all-reduces, optimizer, loss.item()).
Kiln's step also holds the engine's guards, which the PyTorch loop does not run: the
non-finite check and the gradient norm over every gradient (a few ms per step for 10M values on
one thread).
A run's time is the median over the steps after --warmup; every run is a fresh set of
processes; the table gives the median over --repeats runs with the min–max in brackets.

  # defaults: --hidden 2048,2048,2048 --batch 256 --steps 30 --warmup 5 --repeats 3
  #           --accumulation 4 --bucket-cap-mb 25 --threads 1 (about 5 minutes on 2 cores)
  ~/.cache/kiln/venv/bin/python bench/ddp.py
  ~/.cache/kiln/venv/bin/python bench/ddp.py --quick        # smoke run, under a minute

Targets: Kiln ÷ PyTorch <= 1.0 in (a); skip ÷ every <= 0.82 for Kiln in (b).
"""
import argparse
import collections
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import cpu_name, toml_value

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORLD = 2
SHAPE = (1, 28, 28)
CLASSES = 10
LR, MOMENTUM = 0.01, 0.9


def parse_ints(text):
    return [int(x) for x in text.replace("[", "").replace("]", "").split(",") if x.strip()]


def parameter_count(hidden):
    n, last = 0, SHAPE[0] * SHAPE[1] * SHAPE[2]
    for width in hidden + [CLASSES]:
        n += last * width + width
        last = width
    return n


def train_samples(args, accumulation):
    # Whole accumulation windows in every epoch, so no short window (Kiln averages a short one
    # over its own length) and no epoch boundary inside the measured span of a window.
    return args.batch * accumulation * args.windows_per_epoch


# ---- Kiln ---------------------------------------------------------------------------------------


def kiln_pipeline(args, arm, work):
    accumulation, batch = arm.accumulation, arm.ranks * args.batch // WORLD
    samples = train_samples(args, accumulation)
    windows = samples // (batch * accumulation)
    cfg = {
        "run": {"device": "cpu", "seed": 0, "max_steps": args.steps,
                "epochs": args.steps // windows + 2, "log_interval": max(args.steps, 1),
                "threads": args.threads, "eval": False, "checkpoints": False,
                "tensorboard": False, "accumulation_steps": accumulation,
                "output_dir": os.path.join(work, "out")},
        "data": {"dataset": "synthetic", "synthetic_train": samples, "synthetic_test": 16,
                 "synthetic_classes": CLASSES, "channels": SHAPE[0], "height": SHAPE[1],
                 "width": SHAPE[2], "batch_size": batch, "workers": 0, "shuffle": True},
        "model": {"name": "mlp", "hidden": args.hidden},
        "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM},
        "lr_policy": {"name": "constant", "warmup": "none"},
        "dist": {"backend": "gloo", "bucket_cap_mb": args.bucket_cap_mb,
                 "gradient_as_bucket_view": args.bucket_view,
                 "sync_every_micro_step": arm.sync_every},
    }
    out = []
    for section, body in cfg.items():
        out.append(f"[{section}]")
        out += [f"{k} = {toml_value(v)}" for k, v in body.items()]
        out.append("")
    return "\n".join(out)


LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS")


def run_env(args):
    # No launch variables from the caller: a one-process arm must not join a group.
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    if args.ifname:
        env["GLOO_SOCKET_IFNAME"] = args.ifname
    return env


def tail(text, lines=40):
    return "\n".join(text.strip().splitlines()[-lines:])


def per_step_allreduces(steps):
    """The median of the metrics' `allreduces` (gradient all-reduces in the step); None when the
    binary does not write it."""
    values = [r["allreduces"] for r in steps if r.get("allreduces") is not None]
    return statistics.median(values) if values else None


def run_kiln(args, arm, work):
    path = os.path.join(work, "pipeline.toml")
    metrics = os.path.join(work, "kiln.jsonl")
    with open(path, "w") as f:
        f.write(kiln_pipeline(args, arm, work))
    if arm.ranks > 1:
        cmd = [args.kiln, "launch", "--nproc", str(arm.ranks), path, "--metrics", metrics]
    else:
        cmd = [args.kiln, "run", path, "--metrics", metrics]
    start = time.perf_counter()
    # Its own session, so that a timeout ends the launcher and the ranks it started.
    proc = subprocess.Popen(cmd, cwd=work, env=run_env(args), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise RuntimeError(f"{shlex.join(cmd)} ran past --timeout {args.timeout:g} s; its "
                           f"output ended:\n{tail(output)}")
    wall = time.perf_counter() - start
    steps = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            steps = [r for r in map(json.loads, f) if r["type"] == "step"]
    if proc.returncode != 0 or len(steps) < args.steps:
        raise RuntimeError(
            f"{shlex.join(cmd)} exited {proc.returncode} with {len(steps)} of {args.steps} step "
            f"records in its metrics file; its output ended:\n{tail(output)}")
    return {"times": [r["step_time"] + r["data_time"] for r in steps],
            "allreduces": per_step_allreduces(steps[args.warmup:]), "wall": wall}


# ---- PyTorch ------------------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(args, arm, work):
    """Starts this script as a worker once per rank (as torchrun would)."""
    result = os.path.join(work, "torch.json")
    spec = {"hidden": args.hidden, "batch": arm.ranks * args.batch // WORLD,
            "accumulation": arm.accumulation, "sync_every": arm.sync_every, "steps": args.steps,
            "threads": args.threads, "samples": train_samples(args, arm.accumulation),
            "bucket_cap_mb": args.bucket_cap_mb,
            "bucket_view": args.bucket_view, "optim": args.torch_optim, "result": result,
            "timeout": args.timeout}
    port = free_port()
    procs, logs = [], []
    start = time.perf_counter()
    for rank in range(arm.ranks):
        env = dict(run_env(args), RANK=str(rank), WORLD_SIZE=str(arm.ranks),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(arm.ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        log = open(os.path.join(work, f"torch-rank{rank}.log"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [args.python, os.path.abspath(__file__), "--torch-worker", json.dumps(spec)],
            env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + args.timeout
    failed = None
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                failed = f"ran past --timeout {args.timeout} s"
                break
            if any(p.poll() not in (None, 0) for p in procs):
                break  # one rank failed: the other would wait for it until the c10d timeout
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    wall = time.perf_counter() - start
    codes = [p.returncode for p in procs]
    if failed or any(codes) or not os.path.exists(result):
        text = []
        for rank, log in enumerate(logs):
            log.seek(0)
            text.append(f"--- rank {rank} (exit {codes[rank]}):\n{tail(log.read())}")
        raise RuntimeError(f"the PyTorch workers {failed or 'failed'}:\n" + "\n".join(text))
    for log in logs:
        log.close()
    with open(result) as f:
        out = json.load(f)
    out["wall"] = wall
    return out


def torch_worker(spec):
    """One rank of the PyTorch side; rank 0 writes its per-step times to spec['result']."""
    import datetime

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch_optim import make_optimizer

    class Linear(nn.Linear):
        pass

    class HiddenLayer(nn.Module):
        # The `mlp` plugin's layout: layers.<i>.linear.{weight,bias}, then head.{weight,bias}.
        def __init__(self, inp, out):
            super().__init__()
            self.linear = Linear(inp, out)

        def forward(self, x):
            return F.relu(self.linear(x))

    class Mlp(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            last, layers = SHAPE[0] * SHAPE[1] * SHAPE[2], []
            for width in hidden:
                layers.append(HiddenLayer(last, width))
                last = width
            self.layers = nn.Sequential(*layers)
            self.head = Linear(last, CLASSES)

        def forward(self, x):
            return self.head(self.layers(x.flatten(1)))

    torch.set_num_threads(spec["threads"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    model = Mlp(spec["hidden"])
    assert sum(p.numel() for p in model.parameters()) == parameter_count(spec["hidden"])
    ddp = model  # one rank: the plain model, the compute the DDP arms share
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=spec["timeout"]))
        ddp = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=spec["bucket_cap_mb"],
            gradient_as_bucket_view=spec["bucket_view"])
    group = dict(params=list(ddp.parameters()), lr_scale=1.0, weight_decay=0.0)
    opt = make_optimizer([group], dict(name="sgd", lr=LR, momentum=MOMENTUM), spec["optim"])

    # In-memory data, normalised floats like Kiln's batches; each rank reads its own share.
    gen = torch.Generator().manual_seed(1)
    images = torch.randn((spec["samples"],) + SHAPE, generator=gen)
    labels = torch.randint(0, CLASSES, (spec["samples"],), generator=gen)
    micro = spec["batch"] // world
    k = spec["accumulation"]
    order, cursor, epoch = None, 0, 0

    def next_batch():
        nonlocal order, cursor, epoch
        if order is None or cursor + micro > len(order):
            perm = torch.randperm(spec["samples"], generator=torch.Generator().manual_seed(epoch))
            order, cursor, epoch = perm[rank::world], 0, epoch + 1
        idx = order[cursor:cursor + micro]
        cursor += micro
        return images[idx], labels[idx]

    times = []
    for _ in range(spec["steps"]):
        opt.zero_grad(set_to_none=True)
        start = time.perf_counter()
        total = 0.0
        for m in range(k):
            x, y = next_batch()
            if m < k - 1 and not spec["sync_every"] and world > 1:
                with ddp.no_sync():
                    loss = F.cross_entropy(ddp(x), y)
                    (loss / k).backward()
            else:
                loss = F.cross_entropy(ddp(x), y)
                (loss / k).backward()
            total = total + loss.detach()
        opt.step()
        (total / k).item()
        times.append(time.perf_counter() - start)
    buckets = None
    try:  # the buckets as rebuilt after the first step, in gradient-ready order
        if world == 1:
            raise AttributeError("no DDP")
        buckets = [b.buffer().numel() * b.buffer().element_size()
                   for b in ddp.reducer._get_zeros_like_grad_buckets()]
    except (AttributeError, RuntimeError):
        pass  # a private API; the bucket line is only informative
    if rank == 0:
        with open(spec["result"], "w") as f:
            json.dump({"times": times, "buckets": buckets}, f)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


# ---- output -------------------------------------------------------------------------------------


def measured(run, warmup):
    times = run["times"][warmup:] or run["times"]
    return statistics.median(times) * 1e3


def fmt_ms(values):
    m = statistics.median(values)
    spread = f" ({min(values):.1f}–{max(values):.1f})" if len(values) > 1 else ""
    return f"{m:.1f}{spread}"


def machine():
    import torch
    cpu = cpu_name()
    return (f"{cpu}, {os.cpu_count()} logical CPUs; torch {torch.__version__}, Python "
            f"{platform.python_version()}")


def redo_command(argv):
    python = sys.executable.replace(os.path.expanduser("~"), "~", 1)
    script = os.path.relpath(os.path.abspath(__file__), REPO)
    return f"{python} {script} {shlex.join(argv)}".rstrip()


Arm = collections.namedtuple("Arm", "side case ranks accumulation sync_every label")


def make_arms(args):
    k = args.accumulation
    arms = {
        "kiln": Arm("kiln", "a", WORLD, 1, False, "Kiln DDP"),
        "torch": Arm("torch", "a", WORLD, 1, False, "PyTorch DDP"),
    }
    if args.baseline:
        arms["kiln-1"] = Arm("kiln", "0", 1, 1, False, "Kiln, `kiln run`")
        arms["torch-1"] = Arm("torch", "0", 1, 1, False, "PyTorch, no DDP")
    if k > 1:
        arms["kiln-skip"] = Arm("kiln", "b", WORLD, k, False, "Kiln, sync_every_micro_step = false")
        arms["kiln-every"] = Arm("kiln", "b", WORLD, k, True, "Kiln, sync_every_micro_step = true")
        if not args.no_torch_accumulation:
            arms["torch-skip"] = Arm("torch", "b", WORLD, k, False,
                                     "PyTorch, no_sync() on micro-steps")
            arms["torch-every"] = Arm("torch", "b", WORLD, k, True,
                                      "PyTorch, all-reduce every micro-step")
    return arms


def bench(args):
    arms = make_arms(args)
    names = list(arms)
    results = {a: [] for a in names}
    bucket_sizes = None
    print(f"# {parameter_count(args.hidden):,} parameters (hidden {args.hidden}), global batch "
          f"{args.batch}, {WORLD} ranks x {args.threads} thread(s), {args.steps} steps "
          f"({args.warmup} warm-up), {args.repeats} run(s) per arm", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-ddp-") as tmp:
        for rep in range(args.repeats):
            for name in names if rep % 2 == 0 else list(reversed(names)):
                arm = arms[name]
                work = os.path.join(tmp, f"{name}-{rep}")
                os.makedirs(work)
                time.sleep(args.settle)
                run = (run_kiln if arm.side == "kiln" else run_torch)(args, arm, work)
                if name == "torch":
                    bucket_sizes = run.get("buckets") or bucket_sizes
                results[name].append(run)
                print(f"# rep {rep + 1}/{args.repeats} {name}: {measured(run, args.warmup):.1f} "
                      f"ms/step, wall {run['wall']:.1f} s", file=sys.stderr, flush=True)

    ms = {a: [measured(r, args.warmup) for r in runs] for a, runs in results.items()}
    med = {a: statistics.median(v) for a, v in ms.items()}
    print(f"\nMachine: {machine()}. Gloo on the CPU, {WORLD} local ranks, "
          f"{args.threads} intra-op thread(s) per rank; MLP hidden {args.hidden} on "
          f"{'x'.join(map(str, SHAPE))} input, {CLASSES} classes "
          f"({parameter_count(args.hidden):,} parameters, "
          f"{parameter_count(args.hidden) * 4 / 2**20:.1f} MiB of fp32 gradients); global batch "
          f"{args.batch} ({args.batch // WORLD} per rank per micro-batch); bucket_cap_mb "
          f"{args.bucket_cap_mb:g}; gradient_as_bucket_view {str(args.bucket_view).lower()}; "
          f"SGD momentum {MOMENTUM} (torch.optim: {args.torch_optim}); {args.steps} steps, "
          f"first {args.warmup} left out; {args.repeats} run(s) per arm, alternating.\n")
    cases = {"a": "(a) DDP, no accumulation",
             "0": f"no DDP: 1 process, batch {args.batch // WORLD}",
             "b": f"(b) DDP, accumulation {args.accumulation}"}
    print("| case | arm | ms per optimizer step | samples/s | all-reduces/step (Kiln metrics) |")
    print("|---|---|---:|---:|---:|")
    for name in names:
        arm = arms[name]
        samples = arm.ranks * args.batch // WORLD * arm.accumulation
        counts = [r["allreduces"] for r in results[name] if r.get("allreduces") is not None]
        count = f"{statistics.median(counts):g}" if counts else "—"
        print(f"| {cases[arm.case]} | {arm.label} | {fmt_ms(ms[name])} "
              f"| {samples * 1e3 / med[name]:.0f} | {count} |")

    def ratio(a, b):
        per_run = [x / y for x, y in zip(ms[a], ms[b])]
        spread = (f" (per repetition {min(per_run):.2f}–{max(per_run):.2f})"
                  if len(per_run) > 1 else "")
        return med[a] / med[b], spread

    print()
    r, s = ratio("kiln", "torch")
    print(f"- (a) Kiln ÷ PyTorch: {r:.3f}{s}; target <= 1.00: "
          f"{'met' if r <= 1.0 else 'NOT met'}")
    if args.baseline:
        r, s = ratio("kiln-1", "torch-1")
        print(f"- one process, no DDP: Kiln ÷ PyTorch {r:.3f}{s}; what DDP adds to it: Kiln "
              f"{med['kiln'] - med['kiln-1']:+.1f} ms, PyTorch "
              f"{med['torch'] - med['torch-1']:+.1f} ms per step")
    if "kiln-skip" in ms:
        r, s = ratio("kiln-skip", "kiln-every")
        print(f"- (b) Kiln skip ÷ every: {r:.3f}{s}; target <= 0.82: "
              f"{'met' if r <= 0.82 else 'NOT met'}")
    if "torch-skip" in ms:
        r, s = ratio("torch-skip", "torch-every")
        print(f"- (b) PyTorch no_sync ÷ every (reference): {r:.3f}{s}")
        r, s = ratio("kiln-skip", "torch-skip")
        print(f"- (b) Kiln skip ÷ PyTorch no_sync: {r:.3f}{s}")
    if bucket_sizes:
        print(f"- PyTorch DDP buckets (MiB, in all-reduce order): "
              f"{', '.join(f'{b / 2**20:.2f}' for b in bucket_sizes)}")
    print("\nms per optimizer step: median over runs of each run's median after warm-up (min–max "
          "over runs in brackets); rank 0's clock. Ratios are of those medians; below 1 the "
          "first is faster.")
    print(f"\nCommand: {redo_command(sys.argv[1:])}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-worker":
        torch_worker(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=os.path.join(REPO, "build", "release", "bin", "kiln"),
                    help="the kiln binary (default: build/release/bin/kiln)")
    ap.add_argument("--python", default=sys.executable,
                    help="Python with torch for the PyTorch workers (default: this one)")
    ap.add_argument("--hidden", default="2048,2048,2048",
                    help="MLP hidden widths, comma-separated (default 2048,2048,2048)")
    ap.add_argument("--batch", type=int, default=256, help="global batch (per micro-batch)")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="first steps left out of the median")
    ap.add_argument("--repeats", type=int, default=3, help="runs per arm, alternating")
    ap.add_argument("--accumulation", type=int, default=4,
                    help="micro-batches per optimizer step in (b); 1 skips (b)")
    ap.add_argument("--no-torch-accumulation", action="store_true",
                    help="leave out PyTorch's reference rows of (b)")
    ap.add_argument("--no-baseline", dest="baseline", action="store_false",
                    help="leave out the one-process rows (no DDP, batch / 2: the compute of a "
                         "rank, so that what DDP adds shows)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--bucket-view", action="store_true",
                    help="gradient_as_bucket_view on both sides (default: false on both, "
                         "DDP's default; Kiln's own default is true)")
    ap.add_argument("--torch-optim", default="fused",
                    choices=["default", "foreach", "fused", "loop"],
                    help="torch.optim.SGD implementation (default fused: Kiln's sgd plugin calls "
                         "the same fused kernel)")
    ap.add_argument("--ifname", default="lo",
                    help="GLOO_SOCKET_IFNAME for both sides ('' = leave the environment's)")
    ap.add_argument("--windows-per-epoch", type=int, default=8,
                    help="synthetic training set = batch x accumulation x this")
    ap.add_argument("--settle", type=float, default=0.5, help="idle seconds before each run")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed per run")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: hidden 256,256, batch 32, 6 steps (2 warm-up), 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.hidden, args.batch, args.steps, args.warmup, args.repeats = "256,256", 32, 6, 2, 1
        args.settle = 0.0
        args.timeout = min(args.timeout, 60)
    args.hidden = parse_ints(args.hidden)
    if not os.access(args.kiln, os.X_OK):
        ap.error(f"no kiln binary at {args.kiln} (build it, or pass --kiln)")
    if args.batch % WORLD:
        ap.error(f"--batch must be a multiple of the {WORLD} ranks")
    if not 0 <= args.warmup < args.steps:
        ap.error("--warmup must be below --steps")
    if args.accumulation < 1:
        ap.error("--accumulation must be >= 1")
    try:
        bench(args)
    except RuntimeError as e:
        sys.exit(f"bench/ddp.py: {e}")


if __name__ == "__main__":
    main()
