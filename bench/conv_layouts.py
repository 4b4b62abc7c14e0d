#!/usr/bin/env python3
"""oneDNN's convolutions on the CPU, NCHW against NHWC (channels_last), forward and backward.

A training step of one 3x3 convolution (stride 1, padding 1, no bias): aten::convolution, then
aten::convolution_backward for the input and the weight gradients, with input, weight and
gradient all in one layout. NCHW runs oneDNN's blocked kernels (it reorders to nChw16c inside),
NHWC its channels-last ones. Per shape: the best of --repeats timings of --steps steps in each
layout, alternating, and NHWC ÷ NCHW (above 1: NCHW faster). The last column is what Kiln's
model.memory_format = "auto" does with such a convolution in a float32 channels-last model
(host/engine/conv_layouts.cpp): NCHW for a kernel larger than 1x1 with at least 256 input
channels and at most 16 output pixels, on a CPU where oneDNN runs its AVX-512 kernels.

  ~/.cache/kiln/venv/bin/python bench/conv_layouts.py                 # about 4 minutes on 2 cores
  ~/.cache/kiln/venv/bin/python bench/conv_layouts.py --onednn-isa AVX2   # oneDNN capped at AVX2
"""
import argparse
import os
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--batches", default="32,128", help="batch sizes (comma-separated)")
    ap.add_argument("--channels", default="64,128,256,512", help="input = output channels")
    ap.add_argument("--pixels", default="2,4,7,8,14", help="square map sizes (height = width)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads")
    ap.add_argument("--repeats", type=int, default=3, help="timings per layout and shape")
    ap.add_argument("--onednn-isa", default="",
                    help="ONEDNN_MAX_CPU_ISA for this run (e.g. AVX2: what a CPU without AVX-512 "
                         "runs); empty: oneDNN's own choice")
    return ap.parse_args()


def main():
    args = parse_args()
    if args.onednn_isa:
        os.environ["ONEDNN_MAX_CPU_ISA"] = args.onednn_isa  # read by oneDNN at its first use
    import torch  # after the environment: oneDNN reads its ISA cap once

    torch.set_num_threads(args.threads)
    # As host/engine/conv_layouts.cpp decides: oneDNN's AVX-512 baseline, and no cap below it.
    caps = torch.cpu.get_capabilities()
    isa = args.onednn_isa.upper()
    avx512 = (all(caps.get(f, False) for f in ("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"))
              and (isa in ("", "ALL") or isa.startswith(("AVX512", "AVX10"))))

    def step(x, w, g):
        torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0],
                                            1, [True, True, False])

    def best_ms(x, w, g, steps):
        for _ in range(2):
            step(x, w, g)
        t = time.perf_counter()
        for _ in range(steps):
            step(x, w, g)
        return (time.perf_counter() - t) / steps * 1e3

    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, oneDNN ISA cap "
          f"{args.onednn_isa or 'none'}, {args.threads} threads, torch {torch.__version__}")
    print()
    print("| batch | channels | pixels | NCHW ms | NHWC ms | NHWC ÷ NCHW | Kiln's auto |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for n in map(int, args.batches.split(",")):
        for c in map(int, args.channels.split(",")):
            for hw in map(int, args.pixels.split(",")):
                flops = 6 * n * c * c * 9 * hw * hw  # forward + both gradients, multiply-adds x2
                steps = max(2, min(30, int(2e10 / flops)))
                tensors = {}
                for name, fmt in (("nchw", torch.contiguous_format),
                                  ("nhwc", torch.channels_last)):
                    x = torch.randn(n, c, hw, hw).to(memory_format=fmt)
                    w = torch.randn(c, c, 3, 3).to(memory_format=fmt)
                    g = torch.randn(n, c, hw, hw).to(memory_format=fmt)
                    tensors[name] = (x, w, g)
                times = {"nchw": [], "nhwc": []}
                for r in range(args.repeats):
                    for name in (("nchw", "nhwc") if r % 2 == 0 else ("nhwc", "nchw")):
                        times[name].append(best_ms(*tensors[name], steps))
                a, b = min(times["nchw"]), min(times["nhwc"])
                kiln = "NCHW" if avx512 and c >= 256 and hw * hw <= 16 else "NHWC"
                print(f"| {n} | {c} | {hw}x{hw} | {a:.2f} | {b:.2f} | {b / a:.2f} | {kiln} |",
                      flush=True)


if __name__ == "__main__":
    sys.exit(main())
