#!/usr/bin/env python3
"""In-process components from Python (bindings/python/kiln/components.py) against a built libkiln.

    KILN_LIBRARY=build/release/lib/libkiln.so KILN_SOURCE_DIR=. \
        KILN_TEST_PLUGIN_DIR=build/release/tests/plugins/good KILN_BIN=build/release/bin/kiln \
        python3 tests/capi/python_components_test.py [-v]

The check of "done": a Python function as the LR policy gives the same per-step lr as the same
formula in a plain-C plugin (tests/plugins/good_c_macros.c, "c_linear"), to 1e-12 relative, in
the same short pipeline (and as `kiln lr-schedule` prints for the C plugin).
"""

import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SOURCE_DIR = Path(os.environ.get("KILN_SOURCE_DIR", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SOURCE_DIR / "bindings" / "python"))

import kiln  # noqa: E402
from kiln import components  # noqa: E402

# 512 samples in batches of 64: 8 optimizer steps in one epoch, 2 of them host warm-up.
STEPS = 8
PIPELINE = """
[run]
device = "cpu"
epochs = 1
seed = 5
threads = 1
checkpoints = false
tensorboard = false
output_dir = "{out}"
[data]
dataset = "synthetic"
synthetic_train = 512
synthetic_test = 64
synthetic_classes = 4
channels = 1
height = 8
width = 8
batch_size = 64
workers = 1
[model]
name = "mlp"
hidden = [16]
[optimizer]
name = "sgd"
lr = 0.2
momentum = 0.9
[lr_policy]
name = "{policy}"
warmup = "linear"
warmup_iters = 2
end_factor = 0.1
hold_iters = 3
"""


def c_linear(iteration, schedule):
    """good_c_macros.c's c_linear: linear decay to end_factor after hold_iters."""
    end_factor = schedule.options["end_factor"]
    hold = schedule.options["hold_iters"]
    span = schedule.max_iters - hold
    t = (iteration - 1 - hold) / span if span > 0 else 1.0
    t = min(1.0, max(0.0, t))
    return schedule.base_lr * (1.0 - (1.0 - end_factor) * t)


def linear_policy(name="py_linear", fn=c_linear):
    return components.lr_policy(name, fn, options={
        "end_factor": components.Option(0.0, min=0.0, max=1.0, doc="lr factor at the end"),
        "hold_iters": components.Option(0, min=0, doc="iterations at base_lr first"),
    })


class ComponentsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        lib = os.environ.get("KILN_LIBRARY")
        if not lib:  # a failure, not a skip: a missing library must not pass as green
            raise RuntimeError("set KILN_LIBRARY to build/<preset>/lib/libkiln.so")
        kiln.load(lib)
        cls.plugin_dir = os.environ.get("KILN_TEST_PLUGIN_DIR")
        if not cls.plugin_dir:
            raise RuntimeError("set KILN_TEST_PLUGIN_DIR to build/<preset>/tests/plugins/good")

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="kiln_components_"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def text(self, policy):
        return PIPELINE.format(out=self.tmp / "out", policy=policy)

    def lrs(self, session):
        out = []
        with session:
            while session.progress().state == kiln.READY:
                session.step()
                out.append(session.last_metrics("step").lr)
        return out

    def assert_close(self, got, want):
        self.assertEqual(len(got), len(want))
        for i, (g, w) in enumerate(zip(got, want)):
            self.assertTrue(math.isfinite(g), f"step {i + 1}: lr {g}")
            self.assertLessEqual(abs(g - w), 1e-12 * abs(w), f"step {i + 1}: {g} != {w}")

    def test_same_schedule_as_the_c_plugin(self):
        from_c = self.lrs(kiln.Session.from_string(
            self.text("c_linear"), "c.toml", plugin_paths=[self.plugin_dir], log_level="warn"))
        seen = []

        def recording(iteration, schedule):
            seen.append((iteration, schedule))
            return c_linear(iteration, schedule)

        policy = linear_policy(fn=recording)
        from_py = self.lrs(kiln.Session.from_string(
            self.text("py_linear"), "py.toml", components=[policy], log_level="warn"))
        self.assertEqual(len(from_c), STEPS)
        self.assert_close(from_py, from_c)
        # The host's linear warm-up (2 steps), then the policy: rising, then falling after the
        # hold, down to end_factor at the end.
        self.assertLess(from_c[0], from_c[1])
        self.assertGreater(from_c[4], from_c[-1])
        self.assertIsNone(policy.error)
        # lr_at was asked for the steps after warm-up only, with the schedule's frame and the
        # pipeline's options.
        iterations = sorted({i for i, _ in seen})
        self.assertEqual(iterations, list(range(3, STEPS + 1)))
        frame = seen[0][1]
        self.assertEqual((frame.max_iters, frame.warmup_iters, frame.iters_per_epoch),
                         (STEPS, 2, STEPS))
        self.assertGreater(frame.base_lr, 0.0)
        self.assertEqual(frame.options, {"end_factor": 0.1, "hold_iters": 3})

        # `kiln lr-schedule` of the C plugin's pipeline prints the same rates.
        kiln_bin = os.environ.get("KILN_BIN")
        if kiln_bin:
            pipe = self.tmp / "c.toml"
            pipe.write_text(self.text("c_linear"))
            env = dict(os.environ, KILN_PLUGIN_PATH=self.plugin_dir)
            done = subprocess.run([kiln_bin, "lr-schedule", "--csv", str(pipe)], env=env,
                                  capture_output=True, text=True, check=False)
            self.assertEqual(done.returncode, 0, done.stderr)
            rows = list(csv.reader(io.StringIO(done.stdout)))
            table = [float(r[1]) for r in rows[1:] if r]
            self.assert_close(table[:STEPS], from_py)

    def test_one_policy_serves_two_sessions(self):
        policy = linear_policy()
        first = self.lrs(kiln.Session.from_string(self.text("py_linear"), "a.toml",
                                                  components=[policy], log_level="warn"))
        second = self.lrs(kiln.Session.from_string(self.text("py_linear"), "b.toml",
                                                   components=[policy], log_level="warn"))
        self.assertEqual(first, second)

    def test_exception_fails_the_step_with_its_message(self):
        def failing(iteration, schedule):
            if iteration == 4:
                raise ValueError("no rate for step four")
            return schedule.base_lr

        policy = components.LRPolicy("py_failing", lr_at=failing)
        text = self.text("py_failing").replace("end_factor = 0.1\nhold_iters = 3\n", "")
        with kiln.Session.from_string(text, "f.toml", components=[policy],
                                      log_level="error") as s:
            for _ in range(3):
                s.step()
            with self.assertRaises(kiln.RunFailedError) as caught:
                s.step()
            self.assertIn("ValueError: no rate for step four", str(caught.exception))
            self.assertIn("py_failing", str(caught.exception))
            self.assertIsInstance(policy.error, ValueError)
            self.assertEqual(s.progress().state, kiln.FAILED)
            with self.assertRaises(kiln.KilnError):
                s.step()

    def test_a_non_number_fails_the_step(self):
        policy = components.lr_policy("py_text", lambda i, s: "fast")
        text = self.text("py_text").replace("end_factor = 0.1\nhold_iters = 3\n", "")
        with kiln.Session.from_string(text, "t.toml", components=[policy],
                                      log_level="error") as s:
            s.step()
            s.step()
            with self.assertRaises(kiln.RunFailedError) as caught:
                s.step()
            self.assertIn("py_text", str(caught.exception))

    def test_options_are_checked_against_the_schema(self):
        policy = linear_policy()
        with self.assertRaises(kiln.ConfigError) as caught:
            kiln.Session.from_string(self.text("py_linear").replace("end_factor", "end_facter"),
                                     "typo.toml", components=[policy], log_level="error")
        self.assertIn("typo.toml:", str(caught.exception))
        self.assertIn("end_facter", str(caught.exception))
        with self.assertRaises(kiln.ConfigError) as caught:
            kiln.Session.from_string(self.text("py_linear").replace("0.1", "1.5"), "range.toml",
                                     components=[policy], log_level="error")
        self.assertIn("end_factor", str(caught.exception))

    def test_a_built_in_name_is_refused(self):
        policy = components.lr_policy("constant", c_linear)
        with self.assertRaises(kiln.PluginRefusedError) as caught:
            kiln.Session.from_string(self.text("constant"), "dup.toml", components=[policy],
                                     log_level="error")
        self.assertIn("<python>: component 'constant' (lr_policy) is already provided by",
                      str(caught.exception))

    def test_layout_is_the_headers(self):
        # LP64 sizes and offsets of kiln/plugin.h, lr_policy.h, abi.h and kiln.h (as the C
        # compiler gives them; tests/sdk/capi_v1_layout.c pins kiln.h's the same way).
        import ctypes
        from kiln import _capi
        c = components
        pinned = [
            (ctypes.sizeof(c.kiln_option_spec), 72), (c.kiln_option_spec.min.offset, 32),
            (c.kiln_option_spec.doc.offset, 64), (ctypes.sizeof(c.kiln_option_value), 80),
            (c.kiln_option_value.float_value.offset, 32),
            (c.kiln_option_value.string_list.offset, 72), (ctypes.sizeof(c.kiln_options), 24),
            (ctypes.sizeof(c.kiln_capabilities), 32), (ctypes.sizeof(c.kiln_lr_schedule), 40),
            (ctypes.sizeof(c.kiln_lr_policy_vtable), 56),
            (c.kiln_lr_policy_vtable.observe.offset, 32),
            (c.kiln_lr_policy_vtable.set_state.offset, 48),
            (ctypes.sizeof(c.kiln_lr_observation), 48),
            (c.kiln_lr_observation.values.offset, 40),
            (ctypes.sizeof(c.kiln_component_descriptor), 80),
            (c.kiln_component_descriptor.summary.offset, 40),
            (c.kiln_component_descriptor.vtable.offset, 72),
            (ctypes.sizeof(c.kiln_plugin_descriptor), 80),
            (c.kiln_plugin_descriptor.init.offset, 56),
            (c.kiln_plugin_descriptor.reserved.offset, 76),
            (c.kiln_host_api.make_status.offset, 16),
            (ctypes.sizeof(_capi.kiln_session_options), 96),
            (_capi.kiln_session_options.components.offset, 72),
            (_capi.kiln_session_options.component_origin.offset, 88),
        ]
        for i, (got, want) in enumerate(pinned):
            self.assertEqual(got, want, f"entry {i}")

    def test_a_policy_that_reacts_to_evaluations_and_resumes(self):
        # Halves the rate after every evaluation but the first, keeping the rate and the count
        # of evaluations in schedule.state (both must survive a resume).
        seen = []

        def rate(iteration, schedule):
            return schedule.state.get("lr", schedule.base_lr)

        def observe(metrics, iteration, epoch, schedule):
            seen.append((dict(metrics), iteration, epoch))
            st = schedule.state
            st["count"] = st.get("count", 0.0) + 1.0
            if st["count"] >= 2.0:
                st["lr"] = st.get("lr", schedule.base_lr) * 0.5

        policy = components.LRPolicy("py_halving", rate, observe=observe, state=("lr", "count"))
        text = self.text("py_halving").replace("epochs = 1", "epochs = 4").replace(
            "checkpoints = false", "checkpoints = true").replace(
            "end_factor = 0.1\nhold_iters = 3\n", "")

        def run(name, **kw):
            m = self.tmp / f"{name}.jsonl"
            with kiln.Session.from_string(text.replace(str(self.tmp / "out"),
                                                       str(self.tmp / name)),
                                          f"{name}.toml", components=[policy], metrics_path=m,
                                          log_level="warn", **kw) as session:
                session.run()
            rows = [json.loads(line) for line in m.read_text().splitlines()]
            return {r["step"]: r["lr"][0] for r in rows if r["type"] == "step"}

        straight = run("straight")
        self.assertIsNone(policy.error)
        self.assertEqual(len(straight), 4 * STEPS)
        self.assertEqual([(sorted(m), i, e) for m, i, e in seen],
                         [(["loss", "top1", "top5"], STEPS * k, k) for k in range(1, 5)])
        # Epoch 1 at the base rate after the warm-up; the rate falls only right after an
        # evaluation, and at least twice.
        for step in range(3, STEPS + 1):
            self.assertEqual(straight[step], 0.2, f"step {step}")
        for step in range(STEPS + 1, 4 * STEPS + 1):
            halvings = max(0, (step - 1) // STEPS - 1)
            self.assertEqual(straight[step], 0.2 * 0.5 ** halvings, f"step {step}")
        # Stopped after 12 steps (evaluated once), then resumed: the same rates to the end.
        seen.clear()
        run("resumed", overrides={"run.max_steps": 12})
        resumed = run("resumed", resume="auto")
        self.assertTrue(resumed)
        for s, lr in resumed.items():
            self.assertEqual(lr, straight[s], f"step {s}")

    def test_state_without_observe_is_refused(self):
        with self.assertRaises(ValueError):
            components.LRPolicy("py_x", c_linear, state=("lr",))

    def test_only_policies(self):
        with self.assertRaises(TypeError):
            kiln.Session.from_string(self.text("constant"), "x.toml", components=[c_linear])


if __name__ == "__main__":
    unittest.main()
