"""Metrics as dicts: the steps() iterator, on_metrics(as_dict=True), Metrics.as_dict; the
record-based API keeps working."""
import math

import pytest

import kiln
from conftest import STEPS_PER_EPOCH


def test_steps_yields_a_dict_per_step_until_the_run_ends(session):
    seen = list(session.steps())
    assert [m["step"] for m in seen] == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert all(m["kind"] == "step" and math.isfinite(m["loss"]) for m in seen)
    assert {"lr", "grad_norm", "samples_per_second", "epoch"} <= set(seen[0])
    assert session.progress().state == kiln.FINISHED
    assert list(session.steps()) == []


def test_steps_with_a_limit_and_records(session):
    first = list(session.steps(limit=3, as_dict=False))
    assert [m.step for m in first] == [1, 2, 3]
    assert isinstance(first[0], kiln.Metrics)
    # Leaving the loop leaves the session where it is.
    for m in session.steps():
        break
    assert session.progress().step == 4


def test_on_metrics_hands_dicts(session):
    got = []

    @session.on_metrics(as_dict=True)
    def record(m):
        got.append(m)

    session.step()
    ev = session.evaluate()
    assert [m["kind"] for m in got] == ["step", "eval"]
    assert isinstance(got[0], dict) and got[0]["step"] == 1
    assert got[1]["accuracy"] == ev.accuracy
    # A true return still stops the session.
    session.on_metrics(lambda m: m["step"] >= 3, as_dict=True)
    session.run()
    assert session.progress().state == kiln.CANCELLED and session.progress().step == 3


def test_metrics_as_dict(session):
    m = session.step()
    d = m.as_dict()
    assert d["step"] == m.step and d["loss"] == m.loss and d["kind"] == "step"
    assert math.isnan(d["accuracy"])
    lean = m.as_dict(drop_nan=True)
    assert "accuracy" not in lean and "accuracy_top5" not in lean and lean["loss"] == m.loss


def test_records_still_work(session):
    records = []
    session.on_metrics(records.append)
    evals = list(session.epochs())
    assert [e.epoch for e in evals] == [1, 2]
    assert all(isinstance(r, kiln.Metrics) for r in records)
    assert session.last_metrics("eval").accuracy == evals[-1].accuracy


def test_an_exception_in_the_dict_callback_reaches_the_caller(session):
    def boom(m):
        raise ValueError(f"at {m['step']}")

    session.on_metrics(boom, as_dict=True)
    with pytest.raises(ValueError, match="at 1"):
        session.run()
    assert session.progress().state == kiln.CANCELLED


def test_a_multi_label_evaluation_reports_map_and_no_accuracy(tmp_path):
    """A tensors file whose labels are target rows: evaluate() fills map (the C API's V3 field)
    and leaves the accuracies NaN; as_dict(drop_nan=True) keeps map alone."""
    import numpy as np
    from safetensors.numpy import save_file

    from conftest import base_pipeline
    rng = np.random.default_rng(2)
    for split, n in (("train", 64), ("val", 32)):
        rows = (rng.random((n, 3)) < 0.5).astype(np.uint8)
        images = (rows @ np.array([[40], [80], [120]]) + rng.integers(0, 40, (n, 1))).astype(
            np.uint8).reshape(n, 1, 1).repeat(8, 1).repeat(8, 2)
        save_file({"images": images, "labels": rows}, str(tmp_path / f"{split}.safetensors"))
    d = base_pipeline(tmp_path / "runs", loss={"name": "bce_with_logits"})
    d["data"] = {"dataset": "tensors", "train": str(tmp_path / "train.safetensors"),
                 "val": str(tmp_path / "val.safetensors"), "batch_size": 16, "workers": 1}
    with kiln.Session.from_dict(d, name="multi_label", log_level="warn") as s:
        s.step()
        ev = s.evaluate()
    assert 0.0 < ev.map <= 1.0
    assert math.isnan(ev.accuracy) and math.isnan(ev.accuracy_top5)
    assert set(ev.as_dict(drop_nan=True)) >= {"map", "loss"}
    assert "accuracy" not in ev.as_dict(drop_nan=True)
