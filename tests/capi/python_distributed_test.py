"""A C API session joins a data-parallel run from the launch environment (distributed=True):
two Python processes as ranks 0 and 1 (torchrun's variables) train a global batch of 64 as
2 x 32 and must end with the same test loss as one process training batches of 64 (DDP's
equivalence; tolerance 1e-5 relative), and report rank and world size.
Usage: KILN_LIBRARY=... python_distributed_test.py"""
import os
import socket
import subprocess
import sys

PIPELINE = """
[run]
epochs = 2
checkpoints = false
tensorboard = false
threads = 1
seed = 5
[data]
dataset = "synthetic"
synthetic_train = 512
synthetic_test = 256
synthetic_classes = 4
height = 8
width = 8
batch_size = 64
workers = 0
shuffle = false
[model]
name = "mlp"
hidden = [32]
[optimizer]
name = "sgd"
lr = 0.02
momentum = 0.9
[lr_policy]
name = "constant"
"""

RANK_SCRIPT = """
import sys, kiln
with kiln.Session.from_string(sys.argv[1], "dist", distributed=sys.argv[2] == "1",
                              log_level="warn", overrides={"run.output_dir": sys.argv[3]}) as s:
    s.run()
    p, m = s.progress(), s.last_metrics("eval")
    print(p.rank, p.world_size, p.step, repr(m.loss), repr(m.accuracy))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"kiln-capi-dist-{os.getpid()}")
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "..",
                                                   "bindings", "python"))
    port = str(free_port())
    ranks = []
    for r in range(2):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        ranks.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, PIPELINE, "1", out],
                                      env=e, stdout=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=240)[0].split() for p in ranks]
    assert all(p.returncode == 0 for p in ranks), [p.returncode for p in ranks]
    single = subprocess.run([sys.executable, "-c", RANK_SCRIPT, PIPELINE, "0", out + "-1"],
                            env=env, stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    print("ranks:", results, "one process:", single)
    assert sorted((int(r[0]), int(r[1])) for r in results) == [(0, 2), (1, 2)], results
    assert int(single[1]) == 1 and all(int(r[2]) == int(single[2]) == 16 for r in results)
    loss1 = float(single[3])
    for r in results:
        assert abs(float(r[3]) - loss1) <= 1e-5 * abs(loss1) + 1e-7, (r, single)
    print(f"2 ranks over the C API equal one process: test loss {loss1:.6f}")


if __name__ == "__main__":
    main()
