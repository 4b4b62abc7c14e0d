"""KilnError's fields: code, code_name, message, and where a configuration error points."""
import pytest

import kiln


def test_a_misspelt_key_in_a_file(pipeline, tmp_path):
    text = kiln.to_toml(pipeline).replace("epochs = 2", "epochz = 2")
    path = tmp_path / "typo.toml"
    path.write_text(text)
    line = text.splitlines().index("epochz = 2") + 1
    with pytest.raises(kiln.ConfigError) as info:
        kiln.Session(path, log_level="off")
    e = info.value
    assert e.code == kiln.KilnError.CONFIG and e.code_name == "CONFIG"
    assert (e.file, e.line, e.column, e.key) == (str(path), line, 1, "run.epochz")
    assert e.suggestion == "epochs"
    assert str(e).startswith(f"{path}:{line}:1: run.epochz")
    assert e.message == str(e)


def test_a_misspelt_key_in_a_dict_points_into_its_toml(pipeline):
    pipeline["optimizer"]["momentun"] = 0.9
    with pytest.raises(kiln.ConfigError) as info:
        kiln.Session.from_dict(pipeline, name="mine.toml", log_level="off")
    e = info.value
    text = kiln.to_toml(pipeline)
    assert e.file == "mine.toml" and e.key == "optimizer.momentun"
    assert text.splitlines()[e.line - 1].startswith("momentun")
    assert e.suggestion == "momentum"


def test_a_bad_override_points_at_the_override(pipeline):
    with pytest.raises(kiln.ConfigError) as info:
        kiln.Session(pipeline, run={"epochz": 1}, log_level="off")
    e = info.value
    assert (e.file, e.line, e.key) == ("--set", 0, "run.epochz")
    assert e.suggestion == "epochs"


def test_a_toml_syntax_error_has_a_place_and_no_key():
    with pytest.raises(kiln.ConfigError) as info:
        kiln.Session.from_string("[run\nepochs = 1\n", name="bad.toml", log_level="off")
    e = info.value
    assert e.file == "bad.toml" and e.line == 1 and e.column > 0 and e.key == ""


def test_other_errors_have_no_location(session):
    session.run()
    with pytest.raises(kiln.KilnError) as info:
        session.step()
    e = info.value
    assert e.code == kiln.KilnError.FAILED_PRECONDITION
    assert e.code_name == "FAILED_PRECONDITION"
    assert (e.file, e.line, e.column, e.key) == (None, None, None, None)
