"""NCCL at world size 1 against no DDP: what Kiln's data-parallel machinery costs on one GPU.

The same ResNet-50 AMP pipeline as bench/gpu_throughput.py (synthetic 224 x 224 data, SGD,
channels_last, fp16 with dynamic loss scaling) runs as `kiln run` (no process group, no DDP) and
as `kiln launch --nproc 1` (one rank: an NCCL group, DDP's gradient buckets and all-reduce, the
heartbeat). Target (issue 9): launch ÷ run images/s >= 0.98.

Timing: Kiln's per-step metrics; images/s = batch x measured steps / sum of (step_time +
data_time) after --warmup steps. The arms alternate, --repeats runs each; the table gives the
median with the min-max.

    python3 bench/nccl_world1.py --kiln build/device/bin/kiln --batch 64
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import to_toml  # noqa: E402
from gpu_throughput import pipeline, prepare, run_torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def run_arm(kiln, cfg, launch, steps, warmup, work):
    path = os.path.join(work, "pipeline.toml")
    metrics = os.path.join(work, "kiln.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cfg = dict(cfg, run=dict(cfg["run"], output_dir=os.path.join(work, "out")))
    with open(path, "w") as f:
        f.write(to_toml(cfg))
    cmd = [kiln, "launch", "--nproc", "1", path] if launch else [kiln, "run", path]
    proc = subprocess.run(cmd + ["--metrics", metrics], cwd=work, capture_output=True, text=True)
    # c10's stack frames would push the error itself out of the tail shown on failure.
    log = [line for line in (proc.stdout + proc.stderr).strip().splitlines()
           if "frame #" not in line]
    records = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            records = [r for r in map(json.loads, f) if r.get("type") == "step"]
    if proc.returncode != 0 or len(records) != steps:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode} after {len(records)} "
                           f"steps:\n" + "\n".join(log[-30:]))
    ddp = any("data parallel over" in line for line in log)
    if launch and not ddp:
        raise RuntimeError("kiln launch --nproc 1 did not train data-parallel:\n" +
                           "\n".join(log[-10:]))
    rs = records[warmup:]
    batch = cfg["data"]["batch_size"]
    return batch * len(rs) / sum(r["step_time"] + r["data_time"] for r in rs)


ARMS = ["kiln run (no DDP)", "kiln launch --nproc 1 (DDP)", "PyTorch (no DDP)",
        "torchrun --nproc_per_node 1 (DDP)"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(REPO, "build", "release", "bin", "kiln"))
    ap.add_argument("--python", default=sys.executable, help="a python with torch, for the "
                    "PyTorch arms")
    ap.add_argument("--no-torch", action="store_true", help="Kiln's arms only")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    args.kiln = os.path.abspath(args.kiln)  # the runs start in a scratch folder
    # What gpu_throughput's prepare and run_torch read: PyTorch's arm as there, untraced.
    args.batches, args.torch_optim, args.profile = [args.batch], "fused", ""
    cfg = pipeline(args.batch, "amp", args)
    arms = ARMS[:2] if args.no_torch else ARMS
    results = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as work:
        init = data = None
        if not args.no_torch:
            init, data = prepare(args, work)
        for i in range(args.repeats):
            order = arms if i % 2 == 0 else arms[::-1]
            for arm in order:
                folder = os.path.join(work, f"r{i}-{ARMS.index(arm)}")
                os.makedirs(folder)
                if arm.startswith("kiln"):
                    value = run_arm(args.kiln, cfg, "launch" in arm, args.steps, args.warmup,
                                    folder)
                else:
                    value = run_torch(cfg, "amp", init, data, args, folder,
                                      ddp="DDP" in arm)["images_per_s"]
                results[arm].append(value)
                print(f"# {arm}: {value:.1f} images/s", flush=True)
    backend = "NCCL" if args.device == "cuda" else "Gloo"
    print(f"\nResNet-50 AMP, batch {args.batch}, {args.steps} steps ({args.warmup} warm-up), "
          f"{args.repeats} runs per arm, {backend}\n")
    print("| arm | images/s (median, min-max) |\n|---|---:|")
    for k, v in results.items():
        print(f"| {k} | {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}) |")

    def ratio(ddp, alone):
        return statistics.median(results[ddp]) / statistics.median(results[alone])

    kiln = ratio(ARMS[1], ARMS[0])
    print(f"\nKiln: world size 1 ÷ no DDP: **{kiln:.3f}** (target >= 0.98: "
          f"{'met' if kiln >= 0.98 else 'not met'})")
    if not args.no_torch:
        print(f"PyTorch: world size 1 ÷ no DDP: **{ratio(ARMS[3], ARMS[2]):.3f}**; Kiln DDP ÷ "
              f"PyTorch DDP: {ratio(ARMS[1], ARMS[3]):.3f}")


if __name__ == "__main__":
    main()
