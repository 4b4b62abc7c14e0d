"""The session's tensors through DLPack: live views without copies (state_dict, parameters,
buffers, optimizer_state, average), and load_state_dict checked against torch: a twin model's
weights give the twin's test loss, a checkpoint's weights give the saved session's."""
import math
import subprocess
import sys

import pytest

import kiln
from conftest import CLASSES, SIZE, SOURCE_DIR, idx_pipeline

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


class Twin(nn.Module):
    """Kiln's mlp plugin in torch, with its parameter names: flatten, (linear, relu)*, head."""

    def __init__(self, hidden):
        super().__init__()
        self.layers = nn.ModuleList()
        inputs = SIZE * SIZE
        for width in hidden:
            layer = nn.Module()
            layer.linear = nn.Linear(inputs, width)
            self.layers.append(layer)
            inputs = width
        self.head = nn.Linear(inputs, CLASSES)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers:
            x = F.relu(layer.linear(x))
        return self.head(x)


def test_state_dict_names_and_shapes_are_the_models(session):
    sd = session.state_dict()
    assert list(sd) == list(Twin([16]).state_dict())
    assert sd["layers.0.linear.weight"].shape == (16, SIZE * SIZE)
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in sd.values())
    assert list(session.parameters()) == list(sd) and session.buffers() == {}


def test_no_copies_same_memory_across_calls_and_steps(session):
    a = session.state_dict()
    b = session.state_dict()
    assert all(a[k].data_ptr() == b[k].data_ptr() for k in a)
    before = a["head.weight"].clone()
    session.step()
    # The old view sees the step: it is the training's tensor.
    assert not torch.equal(a["head.weight"], before)
    assert a["head.weight"].data_ptr() == session.parameters()["head.weight"].data_ptr()


def test_a_write_through_a_view_changes_training(session):
    with torch.no_grad():
        for t in session.parameters().values():
            t.zero_()
    assert all(torch.count_nonzero(t) == 0 for t in session.state_dict().values())
    # Every weight zero: uniform outputs, a test loss of ln(classes).
    assert session.evaluate().loss == pytest.approx(math.log(CLASSES), rel=1e-6)


def test_optimizer_state_is_live_and_named_by_parameter(session):
    assert session.optimizer_state() == {}
    session.step()
    state = session.optimizer_state()
    names = [f"{p}.momentum_buffer" for p in session.parameters()]
    assert list(state) == names
    buf = state["head.weight.momentum_buffer"]
    ptr, old = buf.data_ptr(), buf.clone()
    session.step()
    assert session.optimizer_state()["head.weight.momentum_buffer"].data_ptr() == ptr
    assert not torch.equal(buf, old)


def test_views_outlive_the_session(pipeline):
    s = kiln.Session.from_dict(pipeline, log_level="warn")
    w = s.state_dict()["head.weight"]
    expected = w.clone()
    s.close()
    assert torch.equal(w, expected)


def test_load_a_twins_weights_and_evaluate_as_torch(tmp_path, idx_data):
    root, (x, y) = idx_data
    torch.manual_seed(0)
    twin = Twin([16])
    with kiln.Session.from_dict(idx_pipeline(tmp_path / "runs", root), log_level="warn") as s:
        assert s.load_state_dict(twin.state_dict()) == kiln.IncompatibleKeys([], [])
        for name, t in s.state_dict().items():
            assert torch.equal(t, twin.state_dict()[name]), name
        ev = s.evaluate()
        with torch.no_grad():
            logits = twin(x)
        assert ev.loss == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
        assert ev.accuracy == pytest.approx((logits.argmax(1) == y).float().mean().item())


def test_load_takes_any_dlpack_tensor_and_casts_floats(session):
    np = pytest.importorskip("numpy")
    sd = {k: np.zeros(tuple(v.shape), dtype=np.float64) for k, v in session.state_dict().items()}
    session.load_state_dict(sd)
    assert session.evaluate().loss == pytest.approx(math.log(CLASSES), rel=1e-6)
    # A parameter that requires grad is lent detached.
    grad = {k: nn.Parameter(torch.ones_like(v)) for k, v in session.state_dict().items()}
    session.load_state_dict(grad)
    assert torch.equal(session.state_dict()["head.bias"], torch.ones(CLASSES))


def test_load_refusals_name_the_key_and_change_nothing(session):
    sd = {k: v.clone() for k, v in session.state_dict().items()}
    before = {k: v.clone() for k, v in sd.items()}
    zeros = {k: torch.zeros_like(v) for k, v in sd.items()}

    def refused(state, pattern, **kw):
        with pytest.raises(kiln.KilnError, match=pattern) as info:
            session.load_state_dict(state, **kw)
        assert info.value.code == kiln.KilnError.INVALID_ARGUMENT
        for k, v in session.state_dict().items():
            assert torch.equal(v, before[k]), k

    refused({**zeros, "head.wieght": torch.zeros(3)}, r"no tensor 'head\.wieght'")
    refused({k: v for k, v in zeros.items() if k != "head.bias"}, r"not given: 'head\.bias'")
    refused({**zeros, "head.bias": torch.zeros(CLASSES + 1)}, r"'head\.bias' has shape \[5\]")
    refused({**zeros, "head.bias": torch.zeros(CLASSES, dtype=torch.int64)},
            r"'head\.bias' has dtype Long, the model's is Float")
    with pytest.raises(TypeError, match="'head.bias': str is not a tensor"):
        session.load_state_dict({**zeros, "head.bias": "zeros"})


def test_non_strict_load_reports_missing_and_unexpected(session):
    result = session.load_state_dict({"head.bias": torch.full((CLASSES,), 2.0),
                                      "extra.weight": torch.zeros(2)}, strict=False)
    assert result.unexpected_keys == ["extra.weight"]
    assert result.missing_keys == [k for k in session.state_dict() if k != "head.bias"]
    assert torch.equal(session.state_dict()["head.bias"], torch.full((CLASSES,), 2.0))


def test_a_checkpoints_weights_load_into_a_new_session(pipeline):
    safetensors = pytest.importorskip("safetensors.torch")
    with kiln.Session.from_dict(pipeline, log_level="warn") as trained:
        list(trained.steps(5))
        folder = trained.save_checkpoint()
        want = trained.evaluate().loss
    saved = safetensors.load_file(f"{folder}/model.safetensors")
    with kiln.Session.from_dict(pipeline, log_level="warn") as fresh:
        # Untrained: the initial weights (the same seed draws the same data and weights).
        assert fresh.evaluate().loss != pytest.approx(want, rel=1e-3)
        fresh.load_state_dict(saved)
        assert fresh.evaluate().loss == pytest.approx(want, rel=1e-6)


def test_without_ema_there_is_no_average_and_evaluations_measure_the_weights(session):
    with pytest.raises(kiln.KilnError, match=r"\[ema\]") as info:
        session.average()
    assert info.value.code == kiln.KilnError.FAILED_PRECONDITION
    assert not session.evaluate().averaged


def test_the_average_is_the_checkpoints_and_evaluates_as_torch(tmp_path, idx_data):
    """[ema]'s average through the C API: the same tensors a checkpoint keeps (which
    tests/engine/ema_run_test.cpp checks against timm), what evaluations measure (a torch twin
    holding it), and loadable back by its "ema/" names."""
    safetensors = pytest.importorskip("safetensors.torch")
    root, (x, y) = idx_data
    d = idx_pipeline(tmp_path / "runs", root, ema={"decay": 0.9})
    with kiln.Session.from_dict(d, log_level="warn") as s:
        list(s.steps(6))
        average = s.average()
        assert list(average) == [f"ema/{k}" for k in s.state_dict()]
        saved = safetensors.load_file(f"{s.save_checkpoint()}/trainer.safetensors")
        for name, t in average.items():
            assert torch.equal(t, saved[name]), name
        assert not torch.equal(average["ema/head.weight"], s.state_dict()["head.weight"])
        ev = s.evaluate()
        assert ev.averaged
        twin = Twin([16])
        twin.load_state_dict({k[len("ema/"):]: v for k, v in average.items()})
        with torch.no_grad():
            logits = twin(x)
        assert ev.loss == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
        snapshot = {k: v.clone() for k, v in average.items()}
    # Into another session: the average by its names, leaving its trained weights alone.
    with kiln.Session.from_dict(d, log_level="warn") as other:
        weights = {k: v.clone() for k, v in other.state_dict().items()}
        assert other.load_state_dict(snapshot, strict=False).unexpected_keys == []
        for name, t in other.average().items():
            assert torch.equal(t, snapshot[name]), name
        for name, t in other.state_dict().items():
            assert torch.equal(t, weights[name]), name
        assert other.evaluate().loss == pytest.approx(ev.loss, rel=1e-6)


def test_optimizer_state_keeps_its_parameters_layout_and_resumes_in_it(tmp_path):
    """Under channels_last the momentum buffers lie as their weights (torch's preserve_format),
    which the fused SGD kernel needs; a resumed run lays the checkpoint's contiguous state out
    the same way, and goes on as the uninterrupted run."""
    from conftest import base_pipeline
    pipe = base_pipeline(tmp_path / "runs")
    pipe["model"] = {"name": "resnet", "blocks": [1, 1, 1], "memory_format": "channels_last"}

    def check_layout(s):
        state, params = s.optimizer_state(), s.parameters()
        convs = [n for n, p in params.items() if p.dim() == 4]
        assert convs and all(params[n].is_contiguous(memory_format=torch.channels_last)
                             for n in convs)
        for n in convs:
            assert state[f"{n}.momentum_buffer"].stride() == params[n].stride(), n

    with kiln.Session.from_dict(pipe, log_level="warn") as whole:
        list(whole.steps(2))
        check_layout(whole)
        folder = whole.save_checkpoint()
        whole.step()
        want = whole.state_dict()
    with kiln.Session.from_dict(pipe, resume=folder, log_level="warn") as resumed:
        resumed.step()
        check_layout(resumed)
        got = resumed.state_dict()
    for name, t in want.items():
        assert torch.allclose(got[name], t, rtol=1e-5, atol=1e-6), name


def test_not_inside_a_metrics_callback(session):
    codes = []

    def peek(m):
        for call in (session.state_dict, lambda: session.load_state_dict({}, strict=False)):
            try:
                call()
            except kiln.KilnError as e:
                codes.append(e.code)

    session.on_metrics(peek)
    session.step()
    assert codes == [kiln.KilnError.FAILED_PRECONDITION] * 2


def test_without_torch_a_clear_error(session, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="install PyTorch"):
        session.state_dict()


def test_import_kiln_imports_no_torch():
    code = ("import sys; sys.path.insert(0, %r); import kiln; "
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules" %
            str(SOURCE_DIR / "bindings" / "python"))
    subprocess.run([sys.executable, "-c", code], check=True)
