"""Reference LAMB for the lamb plugin's oracle (torch has no torch.optim.Lamb).

LAMB (You et al. 2019) with decoupled weight decay, as apex FusedLAMB computes it in adam_w_mode
with the trust ratio applied to every parameter (use_nvlamb=True). Per step, over the group:
    clip = max_grad_norm / max(||(g_1, ..., g_n)||, max_grad_norm)   (1 when max_grad_norm = 0)
    g    = g * clip
    m    = beta1 * m + (1 - beta1) * g          (exp_avg)
    v    = beta2 * v + (1 - beta2) * g * g      (exp_avg_sq)
    u    = (m / bc1) / (sqrt(v / bc2) + eps) + weight_decay * p,
           bc1 = 1 - beta1**step, bc2 = 1 - beta2**step (both 1 without bias_correction)
    r    = ||p|| / ||u||, or 1 when either norm is 0
    p    = p - lr * r * u
"""
import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                 max_grad_norm=0.0, bias_correction=True):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, bias_correction=bias_correction)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            beta1, beta2 = group["betas"]
            grads = [p.grad for p in params]
            if group["max_grad_norm"] > 0:
                total = torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(g) for g in grads]))
                clip = total.clamp(min=group["max_grad_norm"]).reciprocal() * group["max_grad_norm"]
                grads = [g * clip for g in grads]
            for p, g in zip(params, grads):
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float64)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                step = state["step"].item()
                bc1 = 1 - beta1 ** step if group["bias_correction"] else 1.0
                bc2 = 1 - beta2 ** step if group["bias_correction"] else 1.0
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                update = (m / bc1).div_((v / bc2).sqrt_().add_(group["eps"]))
                if group["weight_decay"] != 0:
                    update.add_(p, alpha=group["weight_decay"])
                pn = torch.linalg.vector_norm(p)
                un = torch.linalg.vector_norm(update)
                ratio = torch.where((pn > 0) & (un > 0), pn / un, torch.ones_like(pn))
                p.add_(update * ratio, alpha=-group["lr"])
