"""The bench references' torch.optim twins (bench/torch_optim.py): the fused SGD twin, primed
against torch 2.11's lost first step, trains as torch's per-parameter loop does when GradScaler
skips steps, the first one included."""
import sys

import pytest
import torch

from conftest import SOURCE_DIR

sys.path.insert(0, str(SOURCE_DIR / "bench"))

import torch_optim  # noqa: E402

OVERFLOW_STEPS = (0, 3)  # steps whose scaled gradients overflow, so GradScaler skips them


def train(impl, steps=6):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    group = dict(params=list(model.parameters()), lr_scale=1.0, weight_decay=1e-4)
    opt = torch_optim.make_optimizer([group], dict(name="sgd", lr=0.1, momentum=0.9), impl)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 4, (8,), generator=torch.Generator().manual_seed(2))
    skipped = 0
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if step in OVERFLOW_STEPS:
            loss = loss * 1e30  # times the scale: beyond float32
        before = scaler.get_scale()
        scaler.scale(loss).backward()
        # Freed NaN blocks of the parameters' sizes: what a fresh buffer must not start from.
        poison = [torch.full_like(p, float("nan")) for p in model.parameters()]
        del poison
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < before
    return [p.detach().clone() for p in model.parameters()], skipped


def test_fused_sgd_twin_matches_the_loop_across_skipped_steps():
    loop, loop_skipped = train("loop")
    fused, fused_skipped = train("fused")
    assert loop_skipped == fused_skipped == len(OVERFLOW_STEPS)
    for a, b in zip(loop, fused):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_fused_sgd_twin_starts_from_zeroed_buffers():
    p = torch.nn.Parameter(torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last))
    group = dict(params=[p], lr_scale=1.0, weight_decay=0.0)
    opt = torch_optim.make_optimizer([group], dict(name="sgd", lr=0.1, momentum=0.9), "fused")
    buf = opt.state[p]["momentum_buffer"]
    assert buf.count_nonzero() == 0 and buf.stride() == p.stride()


def test_fused_sgd_twin_with_dampening_is_refused():
    group = dict(params=[torch.nn.Parameter(torch.zeros(3))], lr_scale=1.0, weight_decay=0.0)
    with pytest.raises(SystemExit, match="dampening"):
        torch_optim.make_optimizer([group], dict(name="sgd", lr=0.1, momentum=0.9,
                                                 dampening=0.1), "fused")
