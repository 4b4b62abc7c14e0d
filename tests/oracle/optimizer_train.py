"""Oracle for the optimizers of ABI 1.14 in training: a PyTorch loop with the reference
optimizer over the same data and initial weights as a `kiln run`, compared step by step.

Phase "prepare" writes a small IDX dataset (Fashion-MNIST's file names, 10 classes) and the
initial weights of the kiln mlp plugin's twin (mlp.safetensors, Kiln's names).
Phase "equal" compares two runs of one pipeline, one of them resumed, tensor for tensor.
Phase "compare" trains the twin for config["epochs"] epochs (batches in order, the last one
short) with config["optimizer"]'s reference, evaluates it at each epoch's end, and writes to
report.json the largest relative difference of the step losses and of the evaluations from
the metrics file config["metrics"], and the largest absolute difference of the final weights
from the run's last checkpoint (model.safetensors; the `eval/` weights of trainer.safetensors
where the optimizer evaluates other weights than it trains, and of `kiln export`'s file
config["export"] when given).

References (config["optimizer"]["kind"]):
- sam, asam: pytorch_optimizer.SAM(base_optimizer=torch.optim.SGD, rho, adaptive) stepped
  with a closure over the same batch;
- lookahead_sgd: pytorch_optimizer.Lookahead(torch.optim.SGD(weight_decay)) (Kiln's inner is
  the plain-C "c_sgd" of tests/plugins/good_c_optimizer.c, the same update);
- lookahead_adamw: pytorch_optimizer.Lookahead(torch.optim.AdamW(foreach=False));
- sgd_schedulefree, adamw_schedulefree: schedulefree's SGDScheduleFree / AdamWScheduleFree.
  Kiln evaluates at x and keeps training from the exact y; the package's train() after eval()
  would recompute y from x (not bit-exact), so the twin keeps a copy of y instead, as Kiln does;
- muon_adamw: torch.optim.Muon on the hidden layers' weights (lr x muon_lr_mult) and
  torch.optim.AdamW(foreach=False) on the rest;
- lbfgs: torch.optim.LBFGS(model.parameters(), max_iter, max_eval (0: None), tolerance_grad,
  tolerance_change, history_size, line_search_fn ("none": None)) stepped once per batch with a
  closure over that batch (zero_grad, forward, backward). The step's loss is the closure's first
  value (Kiln's pass before the step); each step's func_evals less that first evaluation are the
  re-evaluations Kiln counts (report: "expected_reevaluations" in all, "reevaluation_gap" the
  largest difference of one step's).
"""
import json
import os
import pathlib
import sys

import safetensors.torch
import torch
import torch.nn.functional as F

from common import Mlp, Scratch, load_split, read_metrics, save_state, write_pattern_set

# This folder's scripts would shadow packages the references import.
HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
import pytorch_optimizer  # noqa: E402
import schedulefree  # noqa: E402

CLASSES = 10


def prepare(s, cfg):
    write_pattern_set(s.dir, cfg, noise=90, classes=CLASSES)
    torch.manual_seed(cfg["seed"])
    save_state(Mlp(cfg["size"] * cfg["size"], cfg["hidden"], CLASSES),
               os.path.join(s.dir, "mlp.safetensors"))


def reference(model, o, lr, wd):
    kind = o["kind"]
    params = list(model.parameters())
    if kind in ("sam", "asam"):
        return pytorch_optimizer.SAM(params, base_optimizer=torch.optim.SGD, rho=o["rho"],
                                     adaptive=kind == "asam", lr=lr, momentum=o["momentum"],
                                     weight_decay=wd)
    if kind == "lookahead_sgd":
        return pytorch_optimizer.Lookahead(torch.optim.SGD(params, lr=lr, weight_decay=wd),
                                           k=o["k"], alpha=o["alpha"])
    if kind == "lookahead_adamw":
        inner = torch.optim.AdamW(params, lr=lr, weight_decay=wd, foreach=False)
        return pytorch_optimizer.Lookahead(inner, k=o["k"], alpha=o["alpha"])
    if kind == "lbfgs":
        return torch.optim.LBFGS(
            params, lr=lr, max_iter=o["max_iter"], max_eval=o.get("max_eval") or None,
            tolerance_grad=o.get("tolerance_grad", 1e-7),
            tolerance_change=o.get("tolerance_change", 1e-9),
            history_size=o.get("history_size", 100),
            line_search_fn=None if o.get("line_search_fn", "none") == "none"
            else o["line_search_fn"])
    if kind == "sgd_schedulefree":
        opt = schedulefree.SGDScheduleFree(params, lr=lr, momentum=o["momentum"],
                                           weight_decay=wd, warmup_steps=o["warmup_steps"])
    elif kind == "adamw_schedulefree":
        opt = schedulefree.AdamWScheduleFree(params, lr=lr, weight_decay=wd,
                                             warmup_steps=o["warmup_steps"])
    else:
        raise ValueError(kind)
    opt.train()
    return opt


class MuonAdamW:
    """torch.optim.Muon on the hidden layers' weights, AdamW on the rest."""

    def __init__(self, model, o, lr, wd):
        hidden = [p for n, p in model.named_parameters() if n.startswith("layers.") and p.dim() == 2]
        rest = [p for n, p in model.named_parameters()
                if not (n.startswith("layers.") and p.dim() == 2)]
        self.opts = [torch.optim.Muon(hidden, lr=lr * o["muon_lr_mult"], weight_decay=wd,
                                      momentum=o["momentum"]),
                     torch.optim.AdamW(rest, lr=lr, weight_decay=wd, foreach=False)]

    def zero_grad(self):
        for opt in self.opts:
            opt.zero_grad()

    def step(self):
        for opt in self.opts:
            opt.step()


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def max_abs(weights, expected):
    return max((weights[k].double() - v.double()).abs().max().item() for k, v in expected.items())


def compare(s, cfg):
    torch.set_num_threads(1)
    size, o = cfg["size"], cfg["optimizer"]
    model = Mlp(size * size, cfg["hidden"], CLASSES)
    model.load_state_dict(safetensors.torch.load_file(os.path.join(s.dir, "mlp.safetensors")))
    lr, wd, kind = cfg["lr"], cfg["weight_decay"], o["kind"]
    opt = MuonAdamW(model, o, lr, wd) if kind == "muon_adamw" else reference(model, o, lr, wd)
    x_all, y_all = load_split(s.dir, "train", cfg["mean"], cfg["std"])
    x_test, y_test = load_split(s.dir, "t10k", cfg["mean"], cfg["std"])
    batch = cfg["batch"]
    losses, evals, evaluated, reevaluations = [], [], None, []

    def loss_of(x, y):
        # Kiln's "bf16" precision: forward and loss under CPU autocast, weights and state fp32.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.get("autocast", False)):
            return F.cross_entropy(model(x), y)

    for _ in range(cfg["epochs"]):
        for start in range(0, x_all.shape[0], batch):
            x, y = x_all[start:start + batch], y_all[start:start + batch]
            if kind == "lbfgs":
                values = []

                def closure():
                    opt.zero_grad()
                    again = loss_of(x, y)
                    again.backward()
                    values.append(again.item())
                    return again
                state = opt.state[opt.param_groups[0]["params"][0]]
                before = state.get("func_evals", 0)
                opt.step(closure)
                losses.append(values[0])
                reevaluations.append(state["func_evals"] - before - 1)
                continue
            opt.zero_grad()
            loss = loss_of(x, y)
            loss.backward()
            losses.append(loss.item())
            if kind in ("sam", "asam"):
                def closure():
                    again = loss_of(x, y)
                    again.backward()
                    return again
                opt.step(closure)
            else:
                opt.step()
        trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if "schedulefree" in kind:
            opt.eval()  # x in the model
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16,
                                             enabled=cfg.get("autocast", False)):
            logits = model(x_test)
            evals.append({"loss": F.cross_entropy(logits, y_test).item(),
                          "accuracy": logits.argmax(1).eq(y_test).float().mean().item()})
        evaluated = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if "schedulefree" in kind:
            model.load_state_dict(trained)  # y back exactly
            for group in opt.param_groups:
                group["train_mode"] = True
    steps, got_evals = read_metrics(cfg["metrics"])
    last = sorted(os.listdir(cfg["checkpoints"]))[-1]
    folder = os.path.join(cfg["checkpoints"], last)
    weights = safetensors.torch.load_file(os.path.join(folder, "model.safetensors"))
    extra = safetensors.torch.load_file(os.path.join(folder, "trainer.safetensors"))
    report = {
        "steps": len(steps), "expected_steps": len(losses), "evals": len(got_evals),
        "step_loss": max((relative(r["loss"], e) for r, e in zip(steps, losses)), default=1e9),
        "eval_loss": max((relative(g["loss"], e["loss"]) for g, e in zip(got_evals, evals)),
                         default=1e9),
        "accuracy": max((abs(g["accuracy"] - e["accuracy"]) for g, e in zip(got_evals, evals)),
                        default=1e9),
        "weights": max_abs(weights, trained),
        "reevaluations": sum(r.get("reevaluations", 0) for r in steps),
        "eval_tensors": sum(1 for k in extra if k.startswith("eval/")),
    }
    if reevaluations:
        report["expected_reevaluations"] = sum(reevaluations)
        report["reevaluation_gap"] = max(
            (abs(r.get("reevaluations", 0) - e) for r, e in zip(steps, reevaluations)),
            default=1e9)
    if report["eval_tensors"]:
        report["eval_weights"] = max_abs(
            {k[len("eval/"):]: v for k, v in extra.items() if k.startswith("eval/")}, evaluated)
        # x differs from y: the check above could not pass by comparing y with itself.
        report["x_minus_y"] = max_abs(trained, evaluated)
    if cfg.get("export"):
        report["export"] = max_abs(safetensors.torch.load_file(cfg["export"]), evaluated)
    (s.dir / "report.json").write_text(json.dumps(report))


def equal(s, cfg):
    """Two runs of one pipeline (one resumed): step losses and every tensor of their final
    checkpoints, the optimizer's state (its inner optimizer's too) and eval/ weights included."""
    runs = cfg["runs"]
    losses = [[r["loss"] for r in read_metrics(run["metrics"])[0]] for run in runs]
    report = {"steps": [len(x) for x in losses],
              "loss_gap": max((abs(a - b) for a, b in zip(*losses)), default=1e9)}
    for part in ("model.safetensors", "trainer.safetensors"):
        a, b = (safetensors.torch.load_file(
            os.path.join(run["checkpoints"], sorted(os.listdir(run["checkpoints"]))[-1], part))
            for run in runs)
        # What a run and its resumption must agree on: not their random number generators.
        keys = sorted(k for k in set(a) | set(b) if not k.startswith("rng/"))
        missing = [k for k in keys if k not in a or k not in b]
        report[part] = {"tensors": len(keys), "missing": missing,
                        "gap": max(((a[k].double() - b[k].double()).abs().max().item()
                                    for k in keys if k not in missing), default=0.0),
                        "optim": sum(1 for k in keys if k.startswith("optim/")),
                        "inner": sum(1 for k in keys if "/inner." in k)}
    (s.dir / "report.json").write_text(json.dumps(report))


def main():
    s = Scratch()
    cfg = s.config
    {"prepare": prepare, "compare": compare, "equal": equal}[cfg["phase"]](s, cfg)


if __name__ == "__main__":
    main()
