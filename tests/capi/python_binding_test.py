#!/usr/bin/env python3
"""Tests of the Python binding (bindings/python/kiln) against a built libkiln.

    KILN_LIBRARY=build/release/lib/libkiln.so KILN_SOURCE_DIR=. \
        python3 tests/capi/python_binding_test.py [-v]

Pipelines are configs/quickstart.toml with overrides that train a small ResNet on a small
synthetic set on the CPU, so each test takes about a second.
"""

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path

SOURCE_DIR = Path(os.environ.get("KILN_SOURCE_DIR", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SOURCE_DIR / "bindings" / "python"))

import kiln  # noqa: E402
from kiln import _capi  # noqa: E402

QUICKSTART = (SOURCE_DIR / "configs" / "quickstart.toml").read_text()

# 256 training samples in batches of 64: 4 steps per epoch.
STEPS_PER_EPOCH = 4


def same(a, b):
    """Records equal field by field, NaN equal to NaN (dataclass == says NaN != NaN)."""
    fa, fb = dataclasses.astuple(a), dataclasses.astuple(b)
    return len(fa) == len(fb) and all(
        x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
        for x, y in zip(fa, fb))


def small(tmp, **extra):
    """Overrides (as "key=value" strings) of a seconds-long CPU run writing under `tmp`."""
    o = {
        "run.device": "cpu",
        "run.epochs": 2,
        "run.checkpoints": False,
        "run.tensorboard": False,
        "run.output_dir": str(tmp),
        "data.dataset": "synthetic",
        "data.synthetic_train": 256,
        "data.synthetic_test": 128,
        "data.batch_size": 64,
        "data.workers": 1,
        "lr_policy.warmup_iters": 2,
    }
    o.update(extra)
    return [f"{k}={kiln.toml_literal(v)}" for k, v in o.items()]


class BindingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        lib = os.environ.get("KILN_LIBRARY")
        if not lib:  # a failure, not a skip: a missing library must not pass as green
            raise RuntimeError("set KILN_LIBRARY to build/<preset>/lib/libkiln.so")
        kiln.load(lib)

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="kiln_py_"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.pipeline = self.tmp / "pipe.toml"
        self.pipeline.write_text(QUICKSTART)

    def session(self, text=None, **kwargs):
        path = self.pipeline
        if text is not None:
            path = self.tmp / "edited.toml"
            path.write_text(text)
        overrides = kwargs.pop("overrides", None)
        s = kiln.Session.from_file(path, overrides=small(self.tmp, **(overrides or {})),
                                   log_level=kwargs.pop("log_level", "warn"), **kwargs)
        self.addCleanup(s.close)
        return s

    # ---- library --------------------------------------------------------------------------------

    def test_version_and_abi(self):
        v = kiln.version()
        self.assertIn(f"C API {_capi.CAPI_VERSION}", v)
        major, minor = kiln.plugin_abi()
        self.assertEqual(major, 1)
        self.assertIn(f"plugin ABI {major}.{minor}", v)

    def test_binding_imports_no_torch(self):
        # libkiln carries LibTorch; the binding itself must stay ctypes only.
        self.assertNotIn("torch", sys.modules)
        self.assertFalse(any(m.startswith(("numpy", "torch")) for m in sys.modules))

    def test_table_layout_matches_header(self):
        """Every struct and slot offset the binding uses equals what a C compiler makes of
        kiln.h (a slot declared out of order would call the wrong function)."""
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            self.skipTest("no C compiler")
        import ctypes
        structs = [_capi.kiln_version, _capi.kiln_session_options, _capi.kiln_progress,
                   _capi.kiln_metrics, _capi.kiln_plugin_info, _capi.kiln_status_location,
                   _capi.kiln_api]
        lines = ["#define DLPACK_DLPACK_H_ /* the layouts below need no DLPack */",
                 "#include <stdio.h>", "#include <stddef.h>", '#include "kiln/kiln.h"',
                 "int main(void) {"]
        expected = []
        for s in structs:
            n = s.__name__
            lines.append(f'printf("{n} %zu\\n", sizeof({n}));')
            expected.append(f"{n} {ctypes.sizeof(s)}")
            for f, _ in s._fields_:
                lines.append(f'printf("{n}.{f} %zu %zu\\n", offsetof({n}, {f}), '
                             f"sizeof((({n}*)0)->{f}));")
                d = getattr(s, f)
                expected.append(f"{n}.{f} {d.offset} {d.size}")
        for n, s in [("KILN_API_V1_SIZE", _capi.kiln_api),
                     ("KILN_METRICS_V1_SIZE", _capi.kiln_metrics),
                     ("KILN_PROGRESS_V1_SIZE", _capi.kiln_progress),
                     ("KILN_PLUGIN_INFO_V1_SIZE", _capi.kiln_plugin_info),
                     ("KILN_SESSION_OPTIONS_V1_SIZE", _capi.kiln_session_options)]:
            lines.append(f'printf("{n} %zu\\n", (size_t){n});')
            expected.append(f"{n} {_capi.v1_size(s)}")
        lines.append('printf("KILN_API_V2_SIZE %zu\\n", (size_t)KILN_API_V2_SIZE);')
        expected.append(f"KILN_API_V2_SIZE {_capi.KILN_API_V2_SIZE}")
        lines.append("return 0; }")
        src = self.tmp / "layout.c"
        src.write_text("\n".join(lines))
        exe = self.tmp / "layout"
        subprocess.run([cc, "-I", str(SOURCE_DIR / "sdk" / "include"), str(src), "-o", str(exe)],
                       check=True)
        got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
        self.assertEqual(got.split("\n")[:-1], expected)

    def test_plugins(self):
        found, refused = kiln.plugins()
        by_name = {p.name: p for p in found}
        self.assertIn("sgd", by_name)
        self.assertIn("mlp", by_name)
        self.assertEqual(by_name["sgd"].kind, "optimizer")
        self.assertEqual(by_name["mlp"].kind, "model")
        for p in found:
            self.assertTrue(os.path.isfile(p.library), p)
            self.assertEqual(p.abi[0], kiln.plugin_abi()[0], p)
            self.assertIn(p.kind, {"optimizer", "lr_policy", "norm", "precision", "model", "dataset"})
        self.assertIsInstance(refused, list)

    def test_plugins_refuses_a_bad_library(self):
        bad = self.tmp / "plugins"
        bad.mkdir()
        (bad / "libkiln_broken.so").write_bytes(b"not an ELF file")
        found, refused = kiln.plugins([bad])
        self.assertTrue(any("libkiln_broken.so" in r for r in refused), refused)
        self.assertIn("sgd", {p.name for p in found})

    # ---- configuration errors -------------------------------------------------------------------

    def test_toml_syntax_error_names_file_line_column(self):
        lines = QUICKSTART.split("\n")
        row = next(i for i, l in enumerate(lines) if l.startswith("epochs ="))
        lines[row] = "epochs = = 3"
        with self.assertRaises(kiln.ConfigError) as ctx:
            self.session("\n".join(lines))
        e = ctx.exception
        self.assertEqual(e.code, 16)
        self.assertIsInstance(e, kiln.KilnError)
        m = re.search(re.escape(str(self.tmp / "edited.toml")) + r":(\d+):(\d+):", str(e))
        self.assertIsNotNone(m, str(e))
        self.assertEqual(int(m.group(1)), row + 1, str(e))
        self.assertGreater(int(m.group(2)), 0)

    def test_unknown_key_suggests_the_nearest(self):
        lines = QUICKSTART.split("\n")
        row = next(i for i, l in enumerate(lines) if l.startswith("momentum ="))
        lines[row] = lines[row].replace("momentum", "momentm")
        with self.assertRaises(kiln.ConfigError) as ctx:
            self.session("\n".join(lines))
        msg = str(ctx.exception)
        self.assertIn(f"{self.tmp / 'edited.toml'}:{row + 1}:1:", msg)
        self.assertIn("momentm", msg)
        self.assertIn("'momentum'", msg)

    def test_unknown_override_key_from_string(self):
        with self.assertRaises(kiln.ConfigError) as ctx:
            kiln.Session.from_string(QUICKSTART, name="inline.toml",
                                     overrides={"run.epoch": 2, "data.dataset": "synthetic"})
        self.assertIn("run.epoch", str(ctx.exception))
        self.assertIn("epochs", str(ctx.exception))

    def test_syntax_error_in_string_names_the_given_name(self):
        with self.assertRaises(kiln.ConfigError) as ctx:
            kiln.Session.from_string("[run]\nepochs = = 3\n", name="mine.toml")
        self.assertRegex(str(ctx.exception), r"mine\.toml:2:\d+:")

    def test_bad_override_types_are_caught_before_c(self):
        with self.assertRaises(TypeError):
            kiln.Session.from_string(QUICKSTART, overrides="run.epochs=2")
        with self.assertRaises(TypeError):
            kiln.Session.from_string(QUICKSTART, overrides={"run.epochs": None})
        with self.assertRaises(ValueError):
            kiln.Session.from_string(QUICKSTART, log_level="loud")

    def test_toml_literals(self):
        t = kiln.toml_literal
        self.assertEqual(t(True), "true")
        self.assertEqual(t(3), "3")
        self.assertEqual(t(0.1), "0.1")
        self.assertEqual(t(1e-5), "1e-05")
        self.assertEqual(t(2.0), "2.0")
        self.assertEqual(t(float("nan")), "nan")
        self.assertEqual(t(float("-inf")), "-inf")
        self.assertEqual(t('a "b" \\ c\n\x01'), '"a \\"b\\" \\\\ c\\n\\u0001"')
        self.assertEqual(t([1, "x", [True]]), '[1, "x", [true]]')
        self.assertEqual(t({"lr_mult": 0.5, "a b": 1}), '{lr_mult = 0.5, "a b" = 1}')

    def test_dict_overrides_reach_the_pipeline(self):
        # Quoting matters: a string with a quote and a backslash must arrive intact (it names
        # the output folder, which the checkpoint path then shows).
        out = self.tmp / 'we"ird\\dir'
        with kiln.Session.from_string(QUICKSTART, name="dict", log_level="warn", overrides={
                "run.device": "cpu", "data.dataset": "synthetic", "data.synthetic_train": 128,
                "data.synthetic_test": 64, "data.batch_size": 32, "run.epochs": 3,
                "run.output_dir": str(out), "run.tensorboard": False,
                "lr_policy.steps": [5, 9], "optimizer.nesterov": False}) as s:
            p = s.progress()
            self.assertEqual((p.epochs, p.batches_per_epoch, p.max_steps), (3, 4, 12))
            path = s.save_checkpoint()
            self.assertTrue(path.startswith(str(out)), path)
            self.assertTrue(os.path.isdir(path))

    # ---- stepping -------------------------------------------------------------------------------

    def test_step_by_step_progress(self):
        s = self.session()
        p = s.progress()
        self.assertEqual(p.state, "ready")
        self.assertEqual((p.step, p.epoch, p.epochs), (0, 0, 2))
        self.assertEqual(p.batches_per_epoch, STEPS_PER_EPOCH)
        self.assertEqual(p.max_steps, 2 * STEPS_PER_EPOCH)
        self.assertEqual((p.rank, p.world_size), (0, 1))
        self.assertIsNone(s.last_metrics("step"))
        for i in range(1, p.max_steps + 1):
            m = s.step()
            self.assertEqual((m.kind, m.step), ("step", i))
            self.assertTrue(math.isfinite(m.loss) and m.loss > 0, m)
            self.assertGreater(m.lr, 0)
            self.assertTrue(math.isnan(m.accuracy), m)  # not an eval record
            q = s.progress()
            self.assertEqual(q.step, i)
            self.assertEqual(q.epoch, (i - 1) // STEPS_PER_EPOCH + 1)
            self.assertEqual(q.epoch_ended, i % STEPS_PER_EPOCH == 0, i)
            self.assertEqual(q.batches_in_epoch, (i - 1) % STEPS_PER_EPOCH + 1)
            self.assertEqual(q.state, "finished" if i == p.max_steps else "ready", i)
        self.assertTrue(s.progress().done)
        with self.assertRaises(kiln.KilnError) as ctx:
            s.step()
        self.assertEqual(ctx.exception.code, kiln.KilnError.FAILED_PRECONDITION)
        self.assertEqual(ctx.exception.code, 3)
        self.assertNotIsInstance(ctx.exception, kiln.RunFailedError)
        self.assertEqual(s.progress().state, "finished")  # a refused call changes nothing

    def test_evaluate(self):
        s = self.session()
        s.step()
        s.step()
        ev = s.evaluate()
        self.assertEqual(ev.kind, "eval")
        self.assertEqual(ev.step, 2)
        self.assertTrue(0.0 <= ev.accuracy <= 1.0, ev)
        self.assertTrue(math.isfinite(ev.loss), ev)
        self.assertTrue(math.isnan(ev.lr))  # a step-only field
        self.assertTrue(same(s.last_metrics("eval"), ev))
        self.assertEqual(s.last_metrics("step").step, 2)

    def test_epochs_generator_yields_one_eval_per_epoch(self):
        s = self.session(overrides={"run.epochs": 3})
        evals = list(s.epochs())
        self.assertEqual([e.epoch for e in evals], [1, 2, 3])
        self.assertEqual([e.step for e in evals], [4, 8, 12])
        self.assertEqual(s.progress().state, "finished")

    def test_epochs_generator_evaluates_a_run_cut_by_max_steps(self):
        s = self.session(overrides={"run.epochs": 3, "run.max_steps": 6})
        evals = [(e.epoch, e.step) for e in s.epochs()]
        self.assertEqual(evals, [(1, 4), (2, 6)])
        self.assertEqual(s.progress().state, "finished")

    def test_leaving_the_epochs_loop_early_leaves_the_session_ready(self):
        s = self.session(overrides={"run.epochs": 3})
        for ev in s.epochs():
            break
        p = s.progress()
        self.assertEqual((p.state, p.step, p.epoch_ended), ("ready", 4, True))

    # ---- callback -------------------------------------------------------------------------------

    def test_callback_sees_every_record_in_order_and_metrics_file_matches(self):
        metrics_file = self.tmp / "m.jsonl"
        s = self.session(metrics_path=metrics_file)
        seen = []
        s.on_metrics(lambda m: seen.append(m))
        p = s.run()
        self.assertEqual(p.state, "finished")
        per_epoch = ["step"] * STEPS_PER_EPOCH + ["eval"]
        self.assertEqual([m.kind for m in seen], per_epoch * 2)
        self.assertEqual([m.step for m in seen if m.kind == "step"],
                         list(range(1, 2 * STEPS_PER_EPOCH + 1)))
        self.assertEqual([(m.epoch, m.step) for m in seen if m.kind == "eval"],
                         [(1, STEPS_PER_EPOCH), (2, 2 * STEPS_PER_EPOCH)])
        lines = [json.loads(l) for l in metrics_file.read_text().splitlines() if l.strip()]
        self.assertEqual(len(lines), len(seen))
        self.assertEqual([l["type"] for l in lines], [m.kind for m in seen])
        for l, m in zip(lines, seen):
            self.assertEqual(l["step"], m.step)
            self.assertAlmostEqual(l["loss"], m.loss, places=5)
        self.assertTrue(same(s.last_metrics("eval"), seen[-1]))

    def test_callback_returning_true_cancels(self):
        s = self.session()
        seen = []

        def stop_at_3(m):
            seen.append(m.step)
            return m.step == 3

        s.on_metrics(stop_at_3)
        p = s.run()
        self.assertEqual(p.state, "cancelled")
        self.assertEqual(p.step, 3)
        self.assertEqual(seen, [1, 2, 3])
        with self.assertRaises(kiln.KilnError) as ctx:
            s.step()
        self.assertEqual(ctx.exception.code, 3)

    def test_callback_exception_surfaces_from_run(self):
        s = self.session()

        class Boom(Exception):
            pass

        def explode(m):
            if m.step == 2:
                raise Boom("from the callback")

        s.on_metrics(explode)
        with self.assertRaises(Boom) as ctx:
            s.run()
        self.assertEqual(str(ctx.exception), "from the callback")
        p = s.progress()
        self.assertEqual(p.state, "cancelled")
        self.assertEqual(p.step, 2)

    def test_callback_exception_surfaces_from_step(self):
        s = self.session()
        s.on_metrics(lambda m: 1 / 0)
        with self.assertRaises(ZeroDivisionError):
            s.step()
        # kiln.h: a callback's nonzero return stops the session after *this* step.
        p = s.progress()
        self.assertEqual((p.state, p.step), ("cancelled", 1))
        s.on_metrics(None)
        with self.assertRaises(kiln.KilnError) as ctx:
            s.step()
        self.assertEqual(ctx.exception.code, kiln.KilnError.FAILED_PRECONDITION)

    def test_callback_true_during_step_cancels_after_that_step(self):
        s = self.session(overrides={"run.checkpoints": True})
        s.step()
        s.on_metrics(lambda m: m.step == 2)
        self.assertEqual(s.step().step, 2)
        p = s.progress()
        self.assertEqual((p.state, p.step), ("cancelled", 2))
        self.assertTrue(os.path.isdir(p.last_checkpoint), p)

    def test_session_calls_inside_callback_are_refused(self):
        s = self.session()
        inner = []

        def nested(m):
            inner.append(s.progress().state)  # allowed
            try:
                s.evaluate()
            except kiln.KilnError as e:
                inner.append(e.code)
            return True

        s.on_metrics(nested)
        s.step()
        self.assertEqual(inner, ["ready", kiln.KilnError.FAILED_PRECONDITION])

    # ---- cancel from another thread -------------------------------------------------------------

    def test_cancel_from_another_thread(self):
        s = self.session(overrides={"run.epochs": 100, "run.checkpoints": True})
        watched = []

        def watch_then_cancel():
            watched.append(s.progress())  # must not wait for the step in progress
            s.cancel()

        steps = []
        s.on_metrics(lambda m: steps.append(m.step) if m.kind == "step" else None)
        timer = threading.Timer(1.0, watch_then_cancel)
        t0 = time.monotonic()
        timer.start()
        try:
            p = s.run()
        finally:
            timer.cancel()
        elapsed = time.monotonic() - t0
        self.assertEqual(p.state, "cancelled")
        self.assertGreater(p.step, 0)
        self.assertLess(p.step, p.max_steps)
        self.assertEqual(steps, list(range(1, p.step + 1)))
        self.assertLess(elapsed, 30)
        self.assertEqual(len(watched), 1)
        self.assertEqual(watched[0].state, "ready")
        self.assertTrue(p.last_checkpoint, p)
        self.assertTrue(os.path.isdir(p.last_checkpoint), p.last_checkpoint)
        self.assertTrue(Path(p.last_checkpoint).is_relative_to(self.tmp), p.last_checkpoint)

    def test_sigint_during_run_cancels_then_raises_keyboard_interrupt(self):
        # A process started in the background may inherit SIGINT ignored; this test needs
        # Python's own handler, which the binding swaps for a cancelling one during run().
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.addCleanup(signal.signal, signal.SIGINT, previous)
        s = self.session(overrides={"run.epochs": 100, "run.checkpoints": True})
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        try:
            with self.assertRaises(KeyboardInterrupt):
                s.run()
        finally:
            timer.cancel()
        p = s.progress()
        self.assertEqual(p.state, "cancelled")
        self.assertLess(p.step, p.max_steps)
        self.assertTrue(p.last_checkpoint.endswith(f"{p.step:09d}"), p)  # the step's own
        self.assertTrue(os.path.isdir(p.last_checkpoint), p)
        self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)

    def test_process_settings_reach_the_library(self):
        # By default a session changes nothing process-wide: the CPU's tensor memory is then
        # unknown (NaN) unless an earlier session in this process installed the counter, which
        # this test's own asking session does only afterwards.
        with self.session() as quiet:
            m = quiet.step()
            self.assertTrue(math.isnan(m.tensor_mb), m)
        # Asked, the signal handlers go to one session at a time; unknown bits are refused.
        asking = kiln.PROCESS_SIGNALS | kiln.PROCESS_COUNT_CPU_MEMORY
        with self.session(process_settings=asking) as s:
            with self.assertRaises(kiln.KilnError) as held:
                self.session(process_settings=kiln.PROCESS_SIGNALS)
            self.assertEqual(held.exception.code, kiln.KilnError.FAILED_PRECONDITION)
            self.assertGreater(s.step().tensor_mb, 0.0)
        with self.assertRaises(kiln.KilnError) as bad:
            self.session(process_settings=1 << 20)
        self.assertEqual(bad.exception.code, kiln.KilnError.INVALID_ARGUMENT)

    def test_resume_auto_continues_after_cancel(self):
        with self.session(overrides={"run.checkpoints": True}) as s:
            s.on_metrics(lambda m: m.step == 3)
            self.assertEqual(s.run().step, 3)
            first = Path(s.progress().last_checkpoint)
        self.assertEqual(first.parent.parent, self.tmp / "version_0", first)
        r = self.session(overrides={"run.checkpoints": True}, resume="auto")
        self.assertEqual(r.progress().step, 3)
        self.assertEqual(r.step().step, 4)
        # The resumed session writes into the run folder it resumed; a fresh one into a new one,
        # leaving the first run's checkpoints as they were.
        self.assertEqual(Path(r.save_checkpoint()).parent, first.parent)
        before = (first / "model.safetensors").read_bytes()
        fresh = self.session(overrides={"run.checkpoints": True})
        fresh.step()
        self.assertEqual(Path(fresh.save_checkpoint()).parent.parent, self.tmp / "version_1")
        self.assertEqual((first / "model.safetensors").read_bytes(), before)

    # ---- lifetime -------------------------------------------------------------------------------

    def test_close_is_idempotent_and_closed_sessions_refuse_calls(self):
        s = self.session()
        s.close()
        s.close()
        self.assertTrue(s.closed)
        s.cancel()  # a no-op, never an error
        with self.assertRaises(ValueError):
            s.progress()
        with self.assertRaises(ValueError):
            s.step()

    def test_checkpoint_with_checkpoints_off(self):
        s = self.session()
        s.step()
        path = s.save_checkpoint()
        self.assertTrue(os.path.isdir(path), path)
        self.assertEqual(s.progress().step, 1)


if __name__ == "__main__":
    unittest.main()
