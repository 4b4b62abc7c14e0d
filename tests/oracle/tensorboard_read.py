"""Oracle for kiln::io::TensorBoardWriter: reads the event files in a directory with TensorBoard's
own code and writes back what it found, as tab-separated lines (float32 values as their bits, so
NaN, -0.0 and infinities compare exactly).

The log directory is config.json's "logdir" when there is one, else the scratch directory.

events.tsv: every record of every event file, in file-name then file order, read by TensorBoard's
  record reader, which checks both CRCs of each record:
  file, wall_time, step, file_version or "-", tag or "-", value bits or "-", canonical
  (1 when protobuf re-serializes the parsed Event to exactly the bytes on disk).
scalars.tsv: what TensorBoard's EventAccumulator serves for the directory: tag, step, value bits.
error.txt: instead of both, when a record is corrupt or truncated (DataLossError).
"""
import json
import pathlib
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import errors
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

scratch = pathlib.Path(sys.argv[1])
config_path = scratch / "config.json"
config = json.loads(config_path.read_text()) if config_path.exists() else {}
logdir = pathlib.Path(config.get("logdir", scratch))


def bits(value):
    return str(struct.unpack("<I", struct.pack("<f", value))[0])


def records(path):
    """Every record of `path`; the reader raises DataLossError on a bad CRC or a truncation."""
    reader = PyRecordReader_New(str(path))
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return
        yield reader.record()


lines = []
try:
    for path in sorted(p for p in logdir.iterdir() if "tfevents" in p.name):
        for data in records(path):
            event = event_pb2.Event.FromString(data)
            canonical = "1" if event.SerializeToString(deterministic=True) == data else "0"
            head = [path.name, repr(event.wall_time), str(event.step)]
            if event.HasField("file_version"):
                lines.append(head + [event.file_version, "-", "-", canonical])
            for value in event.summary.value:
                if not value.HasField("simple_value"):
                    raise ValueError(f"{path.name}: value {value.tag!r} is not a simple_value")
                lines.append(head + ["-", value.tag, bits(value.simple_value), canonical])
except errors.DataLossError as e:
    (scratch / "error.txt").write_text(str(e) + "\n")
    sys.exit(0)
(scratch / "events.tsv").write_text("".join("\t".join(line) + "\n" for line in lines))

# size_guidance 0: keep every scalar rather than a reservoir sample.
accumulator = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
accumulator.Reload()
scalars = []
for tag in sorted(accumulator.Tags()["scalars"]):
    for s in accumulator.Scalars(tag):
        scalars.append([tag, str(s.step), bits(s.value)])
(scratch / "scalars.tsv").write_text("".join("\t".join(line) + "\n" for line in scalars))
