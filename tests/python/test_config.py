"""Sessions from a TOML file, TOML text or a dict, and overrides as a dict or keyword sections."""
import tomllib

import pytest

import kiln
from conftest import STEPS_PER_EPOCH


def test_to_toml_round_trips_through_a_toml_reader():
    d = {
        "run": {"epochs": 2, "output_dir": 'quote " and \\ back', "tf32": True, "lr": 1e-3},
        "optimizer": {"name": "sgd", "custom_keys": {r"fc\..*": {"lr_mult": 2.0}}},
        "data": {"mean": [0.5, 0.25], "extensions": [".jpg", ".png"]},
        "items": [{"a": 1}, {"b": [1, 2]}],
        "empty": {},
    }
    assert tomllib.loads(kiln.to_toml(d)) == d


def test_to_toml_refuses_values_without_a_toml_form_naming_the_key():
    with pytest.raises(TypeError, match=r"run\.output_dir: None has no TOML value"):
        kiln.to_toml({"run": {"output_dir": None}})
    with pytest.raises(TypeError, match=r"data\.mean\[1\]: no TOML value for object"):
        kiln.to_toml({"data": {"mean": [0.5, object()]}})
    with pytest.raises(TypeError, match="nested dicts"):
        kiln.to_toml({"run.epochs": 2})


def test_a_session_from_a_dict_a_string_and_a_file_are_the_same_run(pipeline, tmp_path):
    text = kiln.to_toml(pipeline)
    path = tmp_path / "pipe.toml"
    path.write_text(text)
    losses = []
    for make in (lambda: kiln.Session.from_dict(pipeline, log_level="warn"),
                 lambda: kiln.Session.from_string(text, log_level="warn"),
                 lambda: kiln.Session.from_file(path, log_level="warn"),
                 lambda: kiln.Session(pipeline, log_level="warn"),
                 lambda: kiln.Session(text, log_level="warn"),
                 lambda: kiln.Session(str(path), log_level="warn"),
                 lambda: kiln.Session(path, log_level="warn")):
        with make() as s:
            losses.append([m["loss"] for m in s.steps(3)])
    assert all(run == losses[0] for run in losses), losses
    assert len(losses[0]) == 3


def test_overrides_as_dict_and_keyword_sections(pipeline):
    with kiln.Session.from_dict(pipeline, overrides={"run.epochs": 1, "optimizer": {"lr": 0.05}},
                                run={"max_steps": 3}, log_level="warn") as s:
        p = s.progress()
        assert p.epochs == 1 and p.max_steps == 3
        assert s.step().lr == pytest.approx(0.05)
    # Keyword sections come after `overrides`, so they win; strings work as `kiln run --set`.
    with kiln.Session(pipeline, overrides=["run.max_steps=2"], run={"max_steps": 5},
                      log_level="warn") as s:
        assert s.progress().max_steps == 5


def test_keyword_sections_must_be_dicts_and_values_serialisable(pipeline):
    with pytest.raises(TypeError, match=r"epochs=2: a section needs a dict"):
        kiln.Session(pipeline, epochs=2)
    with pytest.raises(TypeError, match=r"run\.output_dir: no TOML value for object"):
        kiln.Session(pipeline, run={"output_dir": object()})
    with pytest.raises(TypeError, match="name is for TOML text and dicts"):
        kiln.Session("pipe.toml", name="x")


def test_the_dict_becomes_the_runs_pipeline(pipeline):
    pipeline["model"]["hidden"] = [8, 8]
    with kiln.Session.from_dict(pipeline, log_level="warn") as s:
        assert s.progress().batches_per_epoch == STEPS_PER_EPOCH
        assert s.parameters()["layers.1.linear.weight"].shape == (8, 8)
