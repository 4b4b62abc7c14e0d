"""Oracle for norm.running_stats_update: a layer's running statistics over windows of
micro-batches, by hand with PyTorch's own batch-norm update (torch.nn.functional.batch_norm in
training mode: r = (1 - m) r + m s, s the batch mean and unbiased variance), in float64.

- micro_batch: every micro-batch at the momentum m (what PyTorch does under accumulation);
- adjusted_momentum: every micro-batch of a window of k at 1 - (1 - m) ** (1 / k);
- pooled_window: once per window, at m, over one batch of all the window's samples (the
  micro-batches concatenated), i.e. the update of an unaccumulated step over the same samples.

Config: momentum, windows (micro-batches per window), shapes (one per micro-batch, x<j>.bin in
order). Writes rm_<mode>_<w>.bin and rv_<mode>_<w>.bin after each window w.
"""
import torch
import torch.nn.functional as F

from common import Scratch

s = Scratch()
cfg = s.config
m = cfg["momentum"]
xs = [s.load(f"x{j}.bin", shape).double() for j, shape in enumerate(cfg["shapes"])]
channels = cfg["shapes"][0][1]

for mode in ("micro_batch", "adjusted_momentum", "pooled_window"):
    rm = torch.zeros(channels, dtype=torch.float64)
    rv = torch.ones(channels, dtype=torch.float64)
    first = 0
    for w, k in enumerate(cfg["windows"]):
        window = xs[first:first + k]
        first += k
        if mode == "pooled_window":
            F.batch_norm(torch.cat(window), rm, rv, training=True, momentum=m)
        else:
            momentum = m if mode == "micro_batch" else 1 - (1 - m) ** (1 / k)
            for x in window:
                F.batch_norm(x, rm, rv, training=True, momentum=momentum)
        s.save(f"rm_{mode}_{w}.bin", rm)
        s.save(f"rv_{mode}_{w}.bin", rv)
