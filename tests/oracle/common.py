"""Shared helpers of the oracle scripts: a scratch directory of raw float arrays + config.json."""
import json
import pathlib
import sys

import numpy as np
import torch


class Scratch:
    def __init__(self):
        self.dir = pathlib.Path(sys.argv[1])
        self.config = json.loads((self.dir / "config.json").read_text())

    def load(self, name, shape, dtype=np.float32):
        array = np.fromfile(self.dir / name, dtype=dtype).reshape(shape)
        return torch.from_numpy(array.copy())

    def save(self, name, tensor, dtype=np.float32):
        tensor.detach().cpu().contiguous().numpy().astype(dtype).tofile(self.dir / name)
