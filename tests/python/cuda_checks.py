"""The Python API on a CUDA run (ctest capi_python_cuda; skipped without a GPU): the session's
tensors are CUDA tensors aliasing the training's (DLPack, no copy), load_state_dict takes CPU
tensors into a CUDA model and evaluates as a CPU session with the same weights, weights loaded
into an O2 model reach its float32 master copies, and a Python LR policy drives a CUDA run.

Not named test_*.py: the CPU suite (capi_python_pytest) does not collect it; the device
checklist's cuda phase runs it (scripts/device_check.sh).
"""
import pytest

import kiln
from conftest import base_pipeline
from kiln import components

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


def cuda_pipeline(out_dir, **sections):
    d = base_pipeline(out_dir, **sections)
    d["run"].update(device="cuda", tf32="off", cudnn_benchmark=False)
    return d


def test_tensors_are_cuda_views(tmp_path):
    with kiln.Session.from_dict(cuda_pipeline(tmp_path), log_level="warn") as s:
        sd = s.state_dict()
        assert all(t.device.type == "cuda" for t in sd.values())
        ptrs = {k: t.data_ptr() for k, t in sd.items()}
        before = sd["head.weight"].clone()
        s.step()
        assert {k: t.data_ptr() for k, t in s.state_dict().items()} == ptrs
        assert not torch.equal(sd["head.weight"], before)  # the old view sees the step
        state = s.optimizer_state()
        assert state and all(t.device.type == "cuda" for t in state.values())


def test_cpu_weights_into_a_cuda_model_evaluate_as_on_the_cpu(tmp_path):
    with kiln.Session.from_dict(base_pipeline(tmp_path / "cpu"), log_level="warn") as cpu:
        list(cpu.steps(3))
        weights = {k: v.clone() for k, v in cpu.state_dict().items()}
        want = cpu.evaluate()
    with kiln.Session.from_dict(cuda_pipeline(tmp_path / "cuda"), log_level="warn") as gpu:
        gpu.load_state_dict(weights)
        got = gpu.evaluate()
        for k, v in gpu.state_dict().items():
            assert torch.equal(v.cpu(), weights[k]), k
    # float32 on both devices, TF32 off: only the order of sums differs.
    assert got.loss == pytest.approx(want.loss, rel=1e-4)
    assert got.accuracy == pytest.approx(want.accuracy, abs=2 / 128)


def test_weights_loaded_into_o2_reach_the_fp32_masters(tmp_path):
    pipeline = cuda_pipeline(tmp_path, precision={"name": "o2"}, optimizer={"lr": 1e-6})
    with kiln.Session.from_dict(pipeline, log_level="warn") as s:
        init = {k: v.float().clone() for k, v in s.state_dict().items()}
        given = {k: torch.randn_like(v) * 0.1 for k, v in init.items()}
        s.load_state_dict(given)
        for k, v in s.state_dict().items():
            assert v.dtype in (torch.float16, torch.bfloat16), (k, v.dtype)
            assert torch.equal(v.float(), given[k].to(v.dtype).float()), k
        s.step()  # the masters are what the optimizer steps: a tiny step stays at `given`
        for k, v in s.state_dict().items():
            assert torch.allclose(v.float(), given[k], atol=2e-3), k
            assert not torch.allclose(v.float(), init[k], atol=1e-3), k


def test_a_python_lr_policy_drives_a_cuda_run(tmp_path):
    policy = components.lr_policy("py_halving", lambda it, s: s.base_lr * 0.5 ** (it - 1))
    pipeline = cuda_pipeline(tmp_path, lr_policy={"name": "py_halving"})
    with kiln.Session.from_dict(pipeline, components=[policy], log_level="warn") as s:
        lrs = [m["lr"] for m in s.steps(4)]
    assert lrs == pytest.approx([0.1 * 0.5 ** i for i in range(4)], rel=1e-12)
