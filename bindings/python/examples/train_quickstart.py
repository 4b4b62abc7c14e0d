#!/usr/bin/env python3
"""Trains Kiln's quickstart pipeline from Python through libkiln, one epoch at a time, and stops
early once the test accuracy reaches a target or stops improving.

    KILN_LIBRARY=build/release/lib/libkiln.so \
        python3 bindings/python/examples/train_quickstart.py --target 0.88 --patience 2

    # a small synthetic run that takes seconds:
    ... train_quickstart.py --set data.dataset=synthetic --set run.epochs=4 --target 0.95

Every --set is passed to the library as `kiln run --set` takes it.
"""

import argparse
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]  # bindings/python/examples -> repository root
try:
    import kiln  # installed (the kiln-train wheel: its own libkiln, no KILN_LIBRARY)
except ImportError:
    sys.path.insert(0, str(HERE.parent))  # a checkout: the package beside this folder
    import kiln


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "quickstart.toml"),
                    help="pipeline file (default: configs/quickstart.toml of this repository)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a pipeline key, as `kiln run --set` (repeatable)")
    ap.add_argument("--target", type=float, default=0.85,
                    help="stop once the test accuracy (a fraction) reaches this (default 0.85)")
    ap.add_argument("--patience", type=int, default=2,
                    help="stop after this many epochs without a better accuracy (default 2)")
    ap.add_argument("--metrics", help="also write the metrics as JSON lines to this file")
    ap.add_argument("--save", action="store_true",
                    help="write a checkpoint where training stops and print its folder")
    ap.add_argument("--library", help="path of libkiln (default: $KILN_LIBRARY)")
    ap.add_argument("--log-level", default="warn",
                    choices=["debug", "info", "warn", "error", "off"],
                    help="libkiln's own logging on stderr (default warn)")
    args = ap.parse_args()
    if args.patience < 1:
        ap.error("--patience must be >= 1")
    return args


class Throughput:
    """Samples per second of the steps since the last reset: the total samples over the total
    time, so a slow step weighs as much as it cost (an average of rates would not)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.steps = 0
        self.samples = 0.0
        self.seconds = 0.0

    def __call__(self, m):
        if m.kind == "step":
            t = m.step_seconds + m.data_seconds
            if math.isfinite(t) and math.isfinite(m.samples_per_second):
                self.samples += m.samples_per_second * t
                self.seconds += t
            self.steps += 1
        return False  # never asks the session to stop

    @property
    def rate(self):
        return self.samples / self.seconds if self.seconds > 0 else float("nan")


def train(args):
    if args.library:
        kiln.load(args.library)
    throughput = Throughput()
    with kiln.Session.from_file(args.config, overrides=args.overrides,
                                metrics_path=args.metrics, log_level=args.log_level) as session:
        start = session.progress()
        print(f"{kiln.version()}")
        print(f"training {args.config}: {start.epochs} epochs of {start.batches_per_epoch} steps "
              f"(target accuracy {args.target:g}, patience {args.patience})", flush=True)
        session.on_metrics(throughput)

        best, best_epoch, stale = -1.0, 0, 0
        outcome = None
        for ev in session.epochs():
            p = session.progress()
            print(f"epoch {ev.epoch}/{p.epochs}  test accuracy {ev.accuracy:.4f}  "
                  f"loss {ev.loss:.4f}  {throughput.steps} steps  "
                  f"{throughput.rate:.0f} samples/s", flush=True)
            throughput.reset()
            if ev.accuracy > best:
                best, best_epoch, stale = ev.accuracy, ev.epoch, 0
            else:
                stale += 1
            if ev.accuracy >= args.target and not p.done:
                outcome = (f"stopped early at epoch {ev.epoch}: accuracy {ev.accuracy:.4f} >= "
                           f"target {args.target:g}")
                break
            if stale >= args.patience and not p.done:
                outcome = (f"stopped early at epoch {ev.epoch}: accuracy did not improve for "
                           f"{stale} epochs (best {best:.4f} at epoch {best_epoch})")
                break

        p = session.progress()
        if outcome is None:
            if p.state == kiln.STOPPED:
                print(f"stopped by a guard at step {p.step}: {p.stop_reason}", file=sys.stderr)
                return 1
            if p.state != kiln.FINISHED:
                print(f"training ended in state {p.state} at step {p.step}", file=sys.stderr)
                return 1
            reached = ">=" if best >= args.target else "below"
            outcome = (f"finished: {p.epoch} epochs, {p.step} steps, best accuracy {best:.4f} at "
                       f"epoch {best_epoch} ({reached} target {args.target:g})")
        print(outcome)
        if args.save:
            print(f"checkpoint: {session.save_checkpoint()}")
    return 0


def main():
    args = parse_args()
    try:
        return train(args)
    except kiln.KilnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, kiln.ConfigError) else 1
    except OSError as e:  # libkiln not found or not loadable
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
