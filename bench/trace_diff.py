"""Two Chrome traces of the same training step side by side: where one spends more time.

Reads traces written by Kiln's run.profile_steps and by torch.profiler (bench/gpu_throughput.py
--profile writes both, as .json.gz), each holding ProfilerStep#N spans. Per traced step it
prints the span's length, the device's busy time (CUDA kernels, copies and memsets) and the
number of kernels and host ops, then the kernels (or, in a trace without a device, the host's
ATen ops, by inclusive time) that differ most between A and B, in ms per step.

    python3 bench/trace_diff.py kiln.json.gz torch.json.gz [--top 25]
"""
import argparse
import collections
import gzip
import json
import statistics

DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def summary(events):
    # On a GPU the profiler writes each step twice, as the host's span and as the device's
    # (gpu_user_annotation): count the host's.
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
             and e.get("cat") != "gpu_user_annotation"]
    if not steps:
        raise SystemExit("no ProfilerStep#N span in the trace")
    n = len(steps)
    device = [e for e in events if e.get("cat") in DEVICE]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    # Without a device, the host's ops by inclusive time (they nest, so only per name).
    per_name = collections.defaultdict(lambda: [0.0, 0])
    for e in device or ops:
        entry = per_name[e["name"]]
        entry[0] += e.get("dur", 0.0) / 1e3 / n
        entry[1] += 1
    return {"steps": n,
            "span_ms": statistics.median(e["dur"] / 1e3 for e in steps),
            "device_ms": sum(e.get("dur", 0.0) for e in device) / 1e3 / n,
            "kernels": sum(1 for e in device if e.get("cat") == "kernel") / n,
            "host_ops": len(ops) / n,
            "what": "device kernels and copies" if device else "host ops (inclusive)",
            "by_name": {k: (ms, count / n) for k, (ms, count) in per_name.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", help="trace A (e.g. Kiln's)")
    ap.add_argument("b", help="trace B (e.g. PyTorch's)")
    ap.add_argument("--labels", default="A,B", help="names of A and B in the tables")
    ap.add_argument("--top", type=int, default=25, help="rows of the difference table")
    args = ap.parse_args()
    la, lb = args.labels.split(",")
    a, b = summary(load(args.a)), summary(load(args.b))
    print(f"| per traced step | {la} | {lb} |\n|---|---:|---:|")
    for key, fmt in [("steps", "{:d}"), ("span_ms", "{:.2f}"), ("device_ms", "{:.2f}"),
                     ("kernels", "{:.0f}"), ("host_ops", "{:.0f}")]:
        print(f"| {key} | {fmt.format(a[key])} | {fmt.format(b[key])} |")
    print(f"\n{a['what']}, ms per step, largest |{la} - {lb}| first:\n")
    print(f"| name | {la} ms | {lb} ms | {la} - {lb} | {la} / {lb} calls |")
    print("|---|---:|---:|---:|---:|")
    names = set(a["by_name"]) | set(b["by_name"])
    rows = []
    for name in names:
        ma, ca = a["by_name"].get(name, (0.0, 0.0))
        mb, cb = b["by_name"].get(name, (0.0, 0.0))
        rows.append((abs(ma - mb), name, ma, mb, ca, cb))
    for _, name, ma, mb, ca, cb in sorted(rows, reverse=True)[:args.top]:
        short = name if len(name) <= 90 else name[:87] + "..."
        short = short.replace("|", "/")
        print(f"| `{short}` | {ma:.3f} | {mb:.3f} | {ma - mb:+.3f} | {ca:.1f} / {cb:.1f} |")


if __name__ == "__main__":
    main()
