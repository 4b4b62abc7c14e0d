"""Training step time, peak memory and accuracy per precision mode: Kiln vs plain PyTorch.

The same model (the small ResNet of configs/quickstart.toml, the ViT of configs/vit.toml) is
trained on Fashion-MNIST for --steps steps by `kiln run` and by bench/precision_reference.py (a
plain PyTorch loop with Python twins of the models from bench/models.py), under each mode:

  mode  Kiln                                    PyTorch (precision_reference.py)
  fp32  precision fp32, run.tf32 = "off"        fp32, TF32 off
  tf32  precision fp32, run.tf32 = "on"         allow_tf32 on for cuBLAS and cuDNN (CUDA only)
  amp   precision amp (O1)                      torch.autocast + GradScaler (fp16)
  o2    precision o2 (fp32 masters)             half model, fp32 norms and masters, hand loop
  o3    precision o3, keep_norm_fp32 = true     model.to(half) with fp32 norms, no scaling

The half dtype is fp16 on CUDA and bf16 on the CPU (--dtype overrides it on both sides). Both
sides take their hyperparameters from the same pipeline: the config's model, optimizer (with its
parameter-group rules) and batch size, a constant lr (no warm-up or schedule), no augmentation,
seed 0, the same --threads (run.threads / torch.set_num_threads), Kiln's loader without worker
threads (data.workers = 0) so it does not compete with the compute threads.

Measured per run: the median step time over the steps after --warmup (Kiln: `step_time` of its
--metrics records, which excludes `data_time`; PyTorch: forward, loss, backward, optimizer and
loss.item() between torch.cuda.synchronize() calls, the batch already gathered on the device);
peak memory (Kiln: `memory_mb` of the last step record when the binary writes it; PyTorch:
torch.cuda.max_memory_allocated minus the preloaded dataset, or the process's peak RSS on the
CPU, where it counts everything the process touched); test accuracy on the 10k test images after
the last step; Kiln's skipped steps (`skipped_total`). Runs alternate Kiln / PyTorch (the order
flips every repetition); every (case, mode) gets --repeats runs per side, each in a fresh process.

  # CPU check (2 cores, a few minutes):
  ~/.cache/kiln/venv/bin/python bench/precision.py --device cpu --threads 2 --steps 30 \
      --warmup 5 --repeats 1 --cases resnet --modes fp32,amp,o2,o3
  ~/.cache/kiln/venv/bin/python bench/precision.py --device cpu --threads 2 --steps 12 \
      --warmup 4 --repeats 1 --cases vit --modes fp32,o3
  # GPU table (one H100/H200):
  ~/.cache/kiln/venv/bin/python bench/precision.py --device cuda
      (defaults: --steps 500 --warmup 50 --repeats 3 --cases resnet,vit
       --modes fp32,tf32,amp,o2,o3 --batch 128)
  # Divergence: O3 without loss scaling vs O1 (amp) at a high lr:
  ~/.cache/kiln/venv/bin/python bench/precision.py --device cuda --diverge
  ~/.cache/kiln/venv/bin/python bench/precision.py --device cpu --threads 2 --diverge \
      --steps 40 --lr 10

Output: a Markdown table on stdout; Kiln ÷ PyTorch is the ratio of median step times (below 1:
Kiln is faster).
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib

from bench_common import cpu_name, to_toml

REPO = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {"resnet": "configs/quickstart.toml", "vit": "configs/vit.toml"}
# The fashion-mnist dataset's own default root (plugins/dataset/formats/idx.cpp), which the
# configs leave implicit; the PyTorch side reads the same files.
FASHION_ROOT = "/usr/share/datasets/fashion-mnist"
MODES = ["fp32", "tf32", "amp", "o2", "o3"]
TRAIN_SAMPLES = 60000


# ---- the pipeline, shared by both sides -----------------------------------------------------------


def pipeline(case, mode, args, lr=None):
    """The case's config with the bench's settings; the same dict goes to Kiln (TOML) and to
    precision_reference.py (JSON)."""
    with open(os.path.join(REPO, CASES[case]), "rb") as f:
        cfg = tomllib.load(f)
    batches = math.ceil(TRAIN_SAMPLES / args.batch)
    cfg["run"] = {
        "device": args.device, "seed": 0, "max_steps": args.steps,
        "epochs": math.ceil(args.steps / batches), "log_interval": max(args.steps, 1),
        "threads": args.threads, "eval": True,
        "tf32": "on" if mode == "tf32" else ("off" if args.device == "cuda" else "default"),
    }
    data = cfg["data"]
    root = args.data_root or data.get("root", FASHION_ROOT)
    cfg["data"] = {"dataset": "fashion-mnist", "root": root,
                   "batch_size": args.batch, "workers": args.kiln_workers, "shuffle": True,
                   "random_flip": False, "random_crop": 0}
    for key in ("mean", "std"):
        if key in data:
            cfg["data"][key] = data[key]
    cfg["lr_policy"] = {"name": "constant", "warmup": "none"}
    if lr is not None:
        cfg["optimizer"]["lr"] = lr
    precision = {"name": "fp32" if mode == "tf32" else mode}
    if mode in ("amp", "o2", "o3") and args.dtype != "auto":
        precision["dtype"] = args.dtype
    if mode == "o3":
        # Batch norm needs it (fp32 running statistics); the ViT's LayerNorm keeps it too, so
        # both sides run the same O3 (PyTorch keeps its norm layers fp32 as well).
        precision["keep_norm_fp32"] = True
    cfg["precision"] = precision
    return cfg


# ---- one run per side ---------------------------------------------------------------------------


def run_kiln(cfg, args, work):
    path = os.path.join(work, "pipeline.toml")
    metrics = os.path.join(work, "kiln.jsonl")
    cfg = dict(cfg, run=dict(cfg["run"], output_dir=os.path.join(work, "out")))
    with open(path, "w") as f:
        f.write(to_toml(cfg))
    start = time.perf_counter()
    proc = subprocess.run([args.kiln, "run", path, "--metrics", metrics], cwd=work,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    steps, evals = [], []
    if os.path.exists(metrics):
        with open(metrics) as f:
            for line in f:
                rec = json.loads(line)
                (steps if rec["type"] == "step" else evals).append(rec)
    log = (proc.stdout + proc.stderr).strip().splitlines()
    if proc.returncode not in (0, 4) or not steps:
        raise RuntimeError(f"kiln exited {proc.returncode}:\n" + "\n".join(log[-15:]))
    memory = [r["memory_mb"] for r in steps if r.get("memory_mb") is not None]
    return {
        "step_time": [r["step_time"] for r in steps],
        "loss": [r["loss"] for r in steps],
        "memory_mb": max(memory) if memory else None,
        "accuracy": evals[-1]["accuracy"] if evals else None,
        "skipped": steps[-1]["skipped_total"],
        "loss_scale": steps[-1]["loss_scale"],
        "nonfinite": sum(1 for r in steps if r["loss"] is None),
        "rc": proc.returncode, "wall": wall,
        "message": next((l for l in log if "diverged" in l or "stopped" in l), ""),
    }


def run_torch(cfg, mode, args, work):
    path = os.path.join(work, "pipeline.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    cmd = [args.python, os.path.join(HERE, "precision_reference.py"), "--pipeline", path,
           "--mode", mode, "--device", args.device, "--dtype", args.dtype,
           "--steps", str(args.steps), "--threads", str(args.threads),
           "--optim-impl", args.torch_optim]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"precision_reference.py exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update(rc=0, wall=wall)
    return out


def measured(run, warmup):
    times = run["step_time"][warmup:] or run["step_time"]
    return statistics.median(times) * 1e3


# ---- output -------------------------------------------------------------------------------------


def machine(args):
    import torch
    cpu = cpu_name()
    text = f"{cpu}, {os.cpu_count()} logical CPUs"
    if args.device == "cuda" and torch.cuda.is_available():
        text = f"{torch.cuda.get_device_name(0)}; {text}"
    return f"{text}; torch {torch.__version__}, Python {platform.python_version()}"


def fmt_ms(values):
    m = statistics.median(values)
    spread = f" ({min(values):.1f}–{max(values):.1f})" if len(values) > 1 else ""
    return f"{m:.1f}{spread}"


def fmt_opt(x, spec, suffix=""):
    return "—" if x is None else f"{x:{spec}}{suffix}"


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(args):
    modes = [m for m in args.modes.split(",") if m]
    if args.device == "cpu" and "tf32" in modes:
        print("# tf32 skipped: TensorFloat-32 exists only on CUDA", file=sys.stderr)
        modes.remove("tf32")
    results = {}
    with tempfile.TemporaryDirectory(prefix="kiln-precision-") as tmp:
        for rep in range(args.repeats):
            for case in args.cases.split(","):
                for mode in modes:
                    cfg = pipeline(case, mode, args)
                    sides = ["kiln", "torch"] if rep % 2 == 0 else ["torch", "kiln"]
                    for side in sides:
                        work = os.path.join(tmp, f"{case}-{mode}-{side}-{rep}")
                        os.makedirs(work)
                        time.sleep(args.settle)
                        run = (run_kiln(cfg, args, work) if side == "kiln"
                               else run_torch(cfg, mode, args, work))
                        results.setdefault((case, mode, side), []).append(run)
                        print(f"# rep {rep + 1}/{args.repeats} {case} {mode} {side}: "
                              f"{measured(run, args.warmup):.1f} ms/step, wall {run['wall']:.0f} s, "
                              f"acc {fmt_opt(run['accuracy'], '.4f')}", file=sys.stderr, flush=True)

    print(f"\nMachine: {machine(args)}. Device {args.device}, batch {args.batch}, {args.steps} "
          f"steps ({args.warmup} warm-up), {args.repeats} run(s) per side, threads "
          f"{args.threads or 'default'}, half dtype "
          f"{args.dtype if args.dtype != 'auto' else ('fp16' if args.device == 'cuda' else 'bf16')}"
          f", torch.optim {args.torch_optim}.\n")
    print("| case | mode | Kiln ms/step | PyTorch ms/step | Kiln ÷ PyTorch (time) "
          "| samples/s Kiln / PyTorch | Kiln MiB | PyTorch MiB | Kiln acc | PyTorch acc "
          "| skipped Kiln / PyTorch |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in args.cases.split(","):
        for mode in modes:
            k, t = results[(case, mode, "kiln")], results[(case, mode, "torch")]
            km = [measured(r, args.warmup) for r in k]
            tm = [measured(r, args.warmup) for r in t]
            ratio = statistics.median(km) / statistics.median(tm)
            kacc, tacc = median_or_none(r["accuracy"] for r in k), median_or_none(
                r["accuracy"] for r in t)
            print(f"| {case} | {mode} | {fmt_ms(km)} | {fmt_ms(tm)} | {ratio:.2f} "
                  f"| {args.batch * 1e3 / statistics.median(km):.0f} / "
                  f"{args.batch * 1e3 / statistics.median(tm):.0f} "
                  f"| {fmt_opt(median_or_none(r['memory_mb'] for r in k), '.0f')} "
                  f"| {fmt_opt(median_or_none(r['memory_mb'] for r in t), '.0f')} "
                  f"| {fmt_opt(None if kacc is None else 100 * kacc, '.2f', '%')} "
                  f"| {fmt_opt(None if tacc is None else 100 * tacc, '.2f', '%')} "
                  f"| {max(r['skipped'] for r in k)} / {max(r['skipped'] for r in t)} |")
    print("\nms/step: median over runs of each run's median step time after warm-up (min–max "
          "over runs in brackets). Kiln ÷ PyTorch < 1 means Kiln is faster. MiB: Kiln's "
          "`memory_mb`, PyTorch's max_memory_allocated (dataset excluded) on CUDA; on the CPU "
          "both are the process's peak RSS (libraries and dataset included); — where the kiln "
          "binary does not report it.")


def diverge(args):
    """O3 without loss scaling vs amp at high lrs: Kiln's O3 should stop (exit 4, 'diverged')
    while amp, whose dynamic scale backs off, keeps training."""
    half = args.dtype if args.dtype != "auto" else ("fp16" if args.device == "cuda" else "bf16")
    print(f"\nDivergence runs: resnet, {args.steps} steps, device {args.device}, half dtype {half}. "
          f"Machine: {machine(args)}\n")
    print("| lr | side | mode | exit | steps run | non-finite losses | skipped | last loss scale "
          "| last finite loss | test acc | what happened |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="kiln-diverge-") as tmp:
        for lr in (float(x) for x in args.lr.split(",")):
            for mode in ("o3", "amp"):
                cfg = pipeline("resnet", mode, args, lr=lr)
                for side in ("kiln", "torch"):
                    work = os.path.join(tmp, f"{lr}-{mode}-{side}")
                    os.makedirs(work)
                    run = (run_kiln(cfg, args, work) if side == "kiln"
                           else run_torch(cfg, mode, args, work))
                    finite = [v for v in run["loss"] if v is not None]
                    if side == "kiln":
                        # "[time] error step N: ...; the run diverged. Lower the lr, ..."
                        msg = run["message"].split("] error ", 1)[-1].split(". ", 1)[0]
                        what = (f"exit 4: {msg or 'stopped'}" if run["rc"] == 4
                                else "trained to the end")
                    else:
                        what = ("kept stepping with non-finite losses (no guard in the loop)"
                                if run["nonfinite"] else "trained to the end")
                    acc = run["accuracy"]
                    print(f"| {lr:g} | {'Kiln' if side == 'kiln' else 'PyTorch'} | {mode} "
                          f"| {run['rc']} | {len(run['loss'])} | {run['nonfinite']} "
                          f"| {run['skipped']} | {fmt_opt(run['loss_scale'], 'g')} "
                          f"| {fmt_opt(finite[-1] if finite else None, '.4f')} "
                          f"| {fmt_opt(None if acc is None else 100 * acc, '.2f', '%')} "
                          f"| {what.replace('|', '/')} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build", "release"),
                    help="build tree holding bin/kiln")
    ap.add_argument("--kiln", help="the kiln binary (default: BUILD_DIR/bin/kiln)")
    ap.add_argument("--python", default=sys.executable,
                    help="Python with torch for the PyTorch side (default: this one)")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--cases", default="resnet,vit")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--dtype", default="auto", choices=["auto", "fp16", "bf16"],
                    help="half dtype of amp/o2/o3; auto = fp16 on CUDA, bf16 on the CPU")
    ap.add_argument("--steps", type=int, default=500, help="optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=50,
                    help="first steps left out of the median step time")
    ap.add_argument("--repeats", type=int, default=3, help="runs per side and (case, mode)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads on both sides; 0 = torch's default")
    ap.add_argument("--kiln-workers", type=int, default=0, help="Kiln's data.workers")
    ap.add_argument("--torch-optim", default="default",
                    choices=["default", "foreach", "fused", "loop"],
                    help="torch.optim implementation on the PyTorch side; default = torch's "
                         "choice (foreach on CUDA, the per-parameter loop on the CPU)")
    ap.add_argument("--data-root",
                    help=f"Fashion-MNIST folder (default: the configs' root, else {FASHION_ROOT})")
    ap.add_argument("--settle", type=float, default=0.5, help="idle seconds before each run")
    ap.add_argument("--diverge", action="store_true",
                    help="instead of the table: resnet at --lr under o3 (no scaling) and amp")
    ap.add_argument("--lr", default="10,30,100",
                    help="comma-separated lrs of the --diverge runs (SGD, the quickstart's)")
    args = ap.parse_args()
    # absolute: the runs start in a scratch folder
    args.kiln = os.path.abspath(args.kiln or os.path.join(args.build_dir, "bin", "kiln"))
    if not os.access(args.kiln, os.X_OK):
        ap.error(f"no kiln binary at {args.kiln} (build it, or pass --kiln / --build-dir)")
    for m in args.modes.split(","):
        if m not in MODES:
            ap.error(f"unknown mode '{m}' (known: {', '.join(MODES)})")
    for c in args.cases.split(","):
        if c not in CASES:
            ap.error(f"unknown case '{c}' (known: {', '.join(CASES)})")
    if args.warmup >= args.steps and not args.diverge:
        ap.error("--warmup must be below --steps")
    if args.diverge:
        diverge(args)
    else:
        table(args)


if __name__ == "__main__":
    main()
