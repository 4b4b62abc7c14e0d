"""Python binding of Kiln's C API (sdk/include/kiln/kiln.h, version 1), on ctypes alone.

    import kiln
    with kiln.Session.from_file("configs/quickstart.toml", overrides={"run.epochs": 5}) as s:
        for ev in s.epochs():
            print(ev.epoch, ev.accuracy)
            if ev.accuracy >= 0.9:
                break

The library is found through kiln.load(path), else the environment variable KILN_LIBRARY, else
ctypes.util.find_library("kiln"). Failed calls raise KilnError (or its subclasses) with the
library's message unchanged: configuration errors name file:line:column.
"""

import ctypes
import math
import numbers
import os
import signal
import threading
import weakref
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Tuple

from . import _capi
from . import components as _components
from ._capi import load  # noqa: F401  (public: kiln.load(path=None))

__all__ = [
    "load", "version", "plugin_abi", "plugins", "toml_literal",
    "KilnError", "ConfigError", "PluginRefusedError", "RunFailedError",
    "Session", "Metrics", "Progress", "PluginInfo", "PluginScan",
    "READY", "FINISHED", "CANCELLED", "STOPPED", "FAILED",
    "PROCESS_COUNT_CPU_MEMORY", "PROCESS_TORCH_SETTINGS", "PROCESS_TUNE_HEAP", "PROCESS_SIGNALS",
    "PROCESS_ALL",
]

# What a session may change in the whole process (Session.from_file/from_string's
# process_settings, bits to combine with |): nothing unless asked; PROCESS_ALL as `kiln run`.
from ._capi import (PROCESS_ALL, PROCESS_COUNT_CPU_MEMORY, PROCESS_SIGNALS,  # noqa: E402
                    PROCESS_TORCH_SETTINGS, PROCESS_TUNE_HEAP)

# ---- errors ------------------------------------------------------------------------------------

_CODE_NAMES = {
    _capi.ERR_INVALID_ARGUMENT: "INVALID_ARGUMENT",
    _capi.ERR_UNSUPPORTED: "UNSUPPORTED",
    _capi.ERR_FAILED_PRECONDITION: "FAILED_PRECONDITION",
    _capi.ERR_OUT_OF_MEMORY: "OUT_OF_MEMORY",
    _capi.ERR_INTERNAL: "INTERNAL",
    _capi.ERR_CANCELLED: "CANCELLED",
    _capi.ERR_CONFIG: "CONFIG",
    _capi.ERR_PLUGIN_REFUSED: "PLUGIN_REFUSED",
    _capi.ERR_RUN_FAILED: "RUN_FAILED",
}


class KilnError(Exception):
    """A status returned by libkiln: `code` is its KILN_ERR_* value, `message` its text."""

    # Codes as attributes, so callers can write `e.code == kiln.KilnError.FAILED_PRECONDITION`.
    INVALID_ARGUMENT = _capi.ERR_INVALID_ARGUMENT
    UNSUPPORTED = _capi.ERR_UNSUPPORTED
    FAILED_PRECONDITION = _capi.ERR_FAILED_PRECONDITION
    OUT_OF_MEMORY = _capi.ERR_OUT_OF_MEMORY
    INTERNAL = _capi.ERR_INTERNAL
    CANCELLED = _capi.ERR_CANCELLED
    CONFIG = _capi.ERR_CONFIG
    PLUGIN_REFUSED = _capi.ERR_PLUGIN_REFUSED
    RUN_FAILED = _capi.ERR_RUN_FAILED

    def __init__(self, code, message):
        super().__init__(code, message)
        self.code = code
        self.message = message

    @property
    def code_name(self):
        return _CODE_NAMES.get(self.code, f"code {self.code}")

    def __str__(self):
        # The library's message as it wrote it (file:line:column first for pipeline errors).
        return self.message or self.code_name


class ConfigError(KilnError):
    """KILN_ERR_CONFIG: the pipeline is invalid (the message has file:line:column and the key)."""


class PluginRefusedError(KilnError):
    """KILN_ERR_PLUGIN_REFUSED: a plugin library was refused (the message has its path)."""


class RunFailedError(KilnError):
    """KILN_ERR_RUN_FAILED: training failed; the session is "failed" and can only be closed."""


_ERROR_CLASSES = {
    _capi.ERR_CONFIG: ConfigError,
    _capi.ERR_PLUGIN_REFUSED: PluginRefusedError,
    _capi.ERR_RUN_FAILED: RunFailedError,
}


def _text(b):
    return b.decode("utf-8", "replace") if b else ""


def _path_text(b):
    return os.fsdecode(b) if b else ""


def _check(lib, status):
    """Raises the KilnError of a non-NULL status, releasing the status first."""
    if not status:
        return
    try:
        code = lib.status_code(status)
        message = _text(lib.status_message(status))
    finally:
        lib.status_release(status)
    raise _ERROR_CLASSES.get(code, KilnError)(code, message)


# ---- records -----------------------------------------------------------------------------------

READY, FINISHED, CANCELLED, STOPPED, FAILED = "ready", "finished", "cancelled", "stopped", "failed"
_STATES = {
    _capi.SESSION_READY: READY,
    _capi.SESSION_FINISHED: FINISHED,
    _capi.SESSION_CANCELLED: CANCELLED,
    _capi.SESSION_STOPPED: STOPPED,
    _capi.SESSION_FAILED: FAILED,
}
_KINDS = {_capi.METRICS_STEP: "step", _capi.METRICS_EVAL: "eval"}
_KIND_CODES = {"step": _capi.METRICS_STEP, "eval": _capi.METRICS_EVAL}


@dataclass(frozen=True)
class Metrics:
    """One metrics record (kiln_metrics). Fields that do not apply to the kind are NaN (floats)
    or 0; `kind` is "step" or "eval"."""

    kind: str
    skipped: bool
    step: int
    epoch: int
    loss: float
    accuracy: float
    lr: float
    grad_norm: float
    loss_scale: float
    step_seconds: float
    data_seconds: float
    samples_per_second: float
    tensor_mb: float
    tensor_peak_mb: float
    activation_mb: float
    accuracy_top5: float = float("nan")

    @classmethod
    def _from_c(cls, m):
        return cls(
            kind=_KINDS.get(m.kind, str(m.kind)), skipped=bool(m.skipped), step=m.step,
            epoch=m.epoch, loss=m.loss, accuracy=m.accuracy, lr=m.lr, grad_norm=m.grad_norm,
            loss_scale=m.loss_scale, step_seconds=m.step_seconds, data_seconds=m.data_seconds,
            samples_per_second=m.samples_per_second, tensor_mb=m.tensor_mb,
            tensor_peak_mb=m.tensor_peak_mb, activation_mb=m.activation_mb,
            accuracy_top5=m.accuracy_top5)


@dataclass(frozen=True)
class Progress:
    """Where a session stands (kiln_progress). `state` is one of "ready", "finished",
    "cancelled", "stopped", "failed" (kiln.READY ... kiln.FAILED)."""

    state: str
    epoch_ended: bool
    step: int
    max_steps: int
    epoch: int
    epochs: int
    batches_in_epoch: int
    batches_per_epoch: int
    rank: int
    world_size: int
    stop_reason: str
    last_checkpoint: str

    @property
    def done(self):
        """True once the session takes no more steps."""
        return self.state != READY


@dataclass(frozen=True)
class PluginInfo:
    """One component of a loaded plugin library (kiln_plugin_info)."""

    name: str
    kind: str  # "optimizer", "lr_policy", "norm", "precision", "model" or "dataset"
    summary: str
    library: str
    version: Tuple[int, int, int]
    abi: Tuple[int, int]


class PluginScan(NamedTuple):
    plugins: List[PluginInfo]
    refused: List[str]  # "<path>: <reason>" per refused library


# ---- library-wide calls ------------------------------------------------------------------------

def version():
    """E.g. "kiln 0.1.0, C API 1, plugin ABI 1.2, LibTorch 2.11.0"."""
    return _text(_capi.library().version_string())


def plugin_abi():
    """(major, minor) of the plugin ABI the library loads."""
    major, minor = ctypes.c_uint32(), ctypes.c_uint32()
    _capi.library().plugin_abi(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _c_strings(items, what):
    if items is None:
        return None, 0
    if isinstance(items, (str, bytes, os.PathLike)):
        raise TypeError(f"{what} must be a list, not a single {type(items).__name__}")
    encoded = [os.fsencode(i) if not isinstance(i, str) else i.encode("utf-8") for i in items]
    if not encoded:
        return None, 0
    return (ctypes.c_char_p * len(encoded))(*encoded), len(encoded)


def _c_paths(items, what):
    if items is None:
        return None, 0
    if isinstance(items, (str, bytes, os.PathLike)):
        raise TypeError(f"{what} must be a list of paths, not a single path")
    return _c_strings([os.fsencode(p) for p in items], what)  # os.PathLike included


def plugins(extra_dirs=()):
    """Loads the plugin libraries in the built-in folder, KILN_PLUGIN_PATH and `extra_dirs`.
    Returns PluginScan(plugins, refused)."""
    lib = _capi.library()
    arr, n = _c_paths(extra_dirs, "extra_dirs")
    handle = ctypes.c_void_p()
    _check(lib, lib.plugins_list(arr, n, ctypes.byref(handle)))
    try:
        found = []
        for i in range(lib.plugins_count(handle)):
            info = _capi.kiln_plugin_info()
            info.struct_size = ctypes.sizeof(info)
            _check(lib, lib.plugins_get(handle, i, ctypes.byref(info)))
            found.append(PluginInfo(
                name=_text(info.name), kind=_text(info.kind), summary=_text(info.summary),
                library=_path_text(info.library),
                version=(info.version.major, info.version.minor, info.version.patch),
                abi=(info.abi_major, info.abi_minor)))
        refused = [_text(lib.plugins_refused(handle, i))
                   for i in range(lib.plugins_refused_count(handle))]
    finally:
        lib.plugins_release(handle)
    return PluginScan(found, refused)


# ---- overrides ---------------------------------------------------------------------------------

def _toml_string(s):
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_key(k):
    if not isinstance(k, str) or not k:
        raise TypeError(f"TOML table keys must be non-empty strings, not {k!r}")
    bare = all(c.isascii() and (c.isalnum() or c in "-_") for c in k)
    return k if bare else _toml_string(k)


def toml_literal(value):
    """The TOML literal of a Python value: str (quoted), bool, int, float (nan/inf included),
    list/tuple (array) or dict (inline table)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        v = float(value)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)  # always has a '.' or an exponent, so TOML reads a float back
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, os.PathLike):
        return _toml_string(os.fspath(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_literal(v)}"
                               for k, v in value.items()) + "}"
    raise TypeError(f"no TOML literal for {type(value).__name__} value {value!r}")


def _override_strings(overrides):
    if overrides is None:
        return []
    if isinstance(overrides, dict):
        out = []
        for key, value in overrides.items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"override keys must be dotted key strings, not {key!r}")
            out.append(f"{key}={toml_literal(value)}")
        return out
    if isinstance(overrides, (str, bytes)):
        raise TypeError('overrides must be a dict or a list of "key=value" strings, '
                        "not a single string")
    out = list(overrides)
    for o in out:
        if not isinstance(o, str) or "=" not in o:
            raise TypeError(f'override {o!r} is not a "dotted.key=value" string')
    return out


_LOG_LEVELS = {
    None: _capi.LOG_DEFAULT, "default": _capi.LOG_DEFAULT, "debug": _capi.LOG_DEBUG,
    "info": _capi.LOG_INFO, "warn": _capi.LOG_WARN, "warning": _capi.LOG_WARN,
    "error": _capi.LOG_ERROR, "off": _capi.LOG_OFF,
}


def _log_level(level):
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    key = level.lower() if isinstance(level, str) else level
    if key not in _LOG_LEVELS:
        raise ValueError(f"log_level {level!r}: expected one of debug, info, warn, error, off "
                         "(or None to leave it)")
    return _LOG_LEVELS[key]


def _options(overrides, plugin_paths, metrics_path, resume, log_level, distributed,
             process_settings, components=None):
    """kiln_session_options plus the ctypes objects it points into (kept alive by the caller
    for the length of the create call)."""
    opts = _capi.kiln_session_options()
    opts.struct_size = ctypes.sizeof(opts)
    ovs, n_ovs = _c_strings(_override_strings(overrides), "overrides")
    paths, n_paths = _c_paths(plugin_paths, "plugin_paths")
    if ovs is not None:
        opts.overrides = ctypes.cast(ovs, ctypes.POINTER(ctypes.c_char_p))
        opts.override_count = n_ovs
    if paths is not None:
        opts.plugin_paths = ctypes.cast(paths, ctypes.POINTER(ctypes.c_char_p))
        opts.plugin_path_count = n_paths
    keep = [ovs, paths]
    if metrics_path is not None:
        mp = os.fsencode(metrics_path)
        keep.append(mp)
        opts.metrics_path = mp
    if resume is not None:
        rs = os.fsencode(resume)
        keep.append(rs)
        opts.resume = rs
    opts.log_level = _log_level(log_level)
    opts.distributed = 1 if distributed else 0
    opts.process_settings = process_settings
    keep.append(_components._attach(opts, components))  # kiln.components (in-process)
    return opts, keep


# ---- sessions ----------------------------------------------------------------------------------

def _dispatch(session_ref, metrics_ptr):
    """The C metrics callback of every session: hands the record to the Python callback and keeps
    any exception on the Python side (it must not unwind through C)."""
    session = session_ref()
    if session is None:
        return 0
    callback = session._callback
    if callback is None:
        return 0
    try:
        return 1 if callback(Metrics._from_c(metrics_ptr.contents)) else 0
    except BaseException as e:  # noqa: B902 (KeyboardInterrupt included: re-raised later)
        if session._pending is None:
            session._pending = e
        return 1  # stops the session after this step, as session_cancel


class Session:
    """A training session: one resolved pipeline with its plugins, model, optimizer and data.

    Made by Session.from_file / Session.from_string; a context manager (close() frees it).
    Training calls (run, step, evaluate, save_checkpoint) may come from any thread, one at a time
    per session; cancel() and progress() may be called from any thread while another trains.
    """

    def __init__(self, handle, lib):
        # Private: use from_file / from_string.
        self._lib = lib
        self._handle = handle
        self._callback = None
        self._pending = None
        self._interrupted = False
        self._depth = 0  # training calls in progress (1 at most; see _train_call)
        # The C callback is installed once for the session's life and looks up the Python one
        # each time, so on_metrics only swaps a Python reference. It holds the session weakly
        # (no reference cycle: close() still runs when the last reference goes) and must stay
        # referenced as long as the library can call it.
        ref = weakref.ref(self)
        self._c_callback = _capi.metrics_callback(lambda _user, m: _dispatch(ref, m))
        try:
            _check(lib, lib.session_set_metrics_callback(handle, self._c_callback, None))
        except BaseException:
            self.close()
            raise

    # -- creation --

    @classmethod
    def from_file(cls, path, overrides=None, plugin_paths=None, metrics_path=None, resume=None,
                  log_level=None, distributed=False, process_settings=0, components=None):
        """Reads the pipeline file `path`, applies `overrides` (a dict of key -> Python value,
        or a list of "dotted.key=value" strings as `kiln run --set`), loads plugins and builds
        everything. `process_settings` (kiln.PROCESS_* bits) says what the session may change
        in the whole process (the CPU allocator, torch's threads and flags, malloc's tuning,
        SIGINT/SIGTERM handlers); 0 leaves the process as it is. Raises ConfigError /
        PluginRefusedError / KilnError."""
        lib = _capi.library()
        opts, keep = _options(overrides, plugin_paths, metrics_path, resume, log_level,
                              distributed, process_settings, components)
        handle = ctypes.c_void_p()
        status = lib.session_create_from_file(os.fsencode(path), ctypes.byref(opts),
                                              ctypes.byref(handle))
        del keep
        _check(lib, status)
        return cls(handle.value, lib)._hold(components)

    @classmethod
    def from_string(cls, toml, name="inline", overrides=None, plugin_paths=None,
                    metrics_path=None, resume=None, log_level=None, distributed=False,
                    process_settings=0, components=None):
        """As from_file, from TOML text; `name` stands for the file in messages and in the
        default output folder runs/<name>."""
        lib = _capi.library()
        opts, keep = _options(overrides, plugin_paths, metrics_path, resume, log_level,
                              distributed, process_settings, components)
        handle = ctypes.c_void_p()
        status = lib.session_create_from_string(toml.encode("utf-8"), name.encode("utf-8"),
                                                ctypes.byref(opts), ctypes.byref(handle))
        del keep
        _check(lib, status)
        return cls(handle.value, lib)._hold(components)

    def _hold(self, components):
        # In-process components (kiln.components) are borrowed by the library until close().
        self._components = list(components or ())
        return self

    # -- lifetime --

    def close(self):
        """Frees the session (writes nothing: call save_checkpoint first to keep the state).
        Idempotent."""
        handle, self._handle = self._handle, None
        if handle:
            self._lib.session_destroy(handle)
        # Only now: the library may have called the callback up to the destroy.
        self._c_callback = None
        self._callback = None

    @property
    def closed(self):
        return not self._handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown may have torn down ctypes already
            pass

    def __repr__(self):
        if self.closed:
            return "<kiln.Session closed>"
        p = self.progress()
        return f"<kiln.Session {p.state} step {p.step}/{p.max_steps} epoch {p.epoch}/{p.epochs}>"

    def _h(self):
        h = self._handle
        if not h:
            raise ValueError("the kiln session is closed")
        return h

    # -- training --

    def _train_call(self, fn, *args):
        """Runs a training call of the table. Re-raises an exception the Python callback raised
        during it, and turns SIGINT into a cancel (see _sigint)."""
        handle = self._h()
        if self._depth:
            # Called from inside the callback: the library refuses it (FAILED_PRECONDITION); the
            # outer call keeps its pending exception and SIGINT handling.
            _check(self._lib, fn(handle, *args))
            return
        self._pending = None
        self._interrupted = False
        self._depth += 1
        try:
            with _sigint_cancels(self):
                status = fn(handle, *args)
        finally:
            self._depth -= 1
        pending, self._pending = self._pending, None
        try:
            _check(self._lib, status)
        except KilnError as err:
            if pending is not None:
                raise pending from err
            raise
        if pending is not None:
            raise pending
        if self._interrupted:
            raise KeyboardInterrupt

    def run(self):
        """Trains until the session leaves "ready" (evaluating, checkpointing and logging as
        `kiln run` does) and returns the final Progress. Ctrl-C in the main thread cancels after
        the current step (with its checkpoint when run.checkpoints) and raises
        KeyboardInterrupt."""
        self._train_call(self._lib.session_run)
        return self.progress()

    def step(self):
        """One optimizer step. Returns its Metrics (kind "step"), or None when no step was taken
        (the session was cancelled before it began). Raises KilnError with code
        FAILED_PRECONDITION when the session is not "ready"."""
        before = self.progress().step
        self._train_call(self._lib.session_step)
        m = self.last_metrics("step")
        return m if m is not None and m.step > before else None

    def evaluate(self):
        """Evaluates on the test split now; returns the Metrics (kind "eval")."""
        out = _capi.kiln_metrics()
        out.struct_size = ctypes.sizeof(out)
        self._train_call(self._lib.session_evaluate, ctypes.byref(out))
        return Metrics._from_c(out)

    def save_checkpoint(self):
        """Writes a checkpoint of the current state (even with run.checkpoints off); returns its
        folder ("" on ranks other than 0)."""
        path = ctypes.c_char_p()
        self._train_call(self._lib.session_save_checkpoint, ctypes.byref(path))
        return _path_text(path.value)

    def epochs(self):
        """Steps through the run, yielding the test Metrics after each epoch (and once more when
        run.max_steps ends the run inside an epoch). Stop early by leaving the loop; a session
        cancelled or stopped by a guard ends the loop without an evaluation."""
        while self.progress().state == READY:
            self.step()
            p = self.progress()
            if p.state == FINISHED or (p.state == READY and p.epoch_ended):
                yield self.evaluate()

    def cancel(self):
        """Asks the session to stop after the step in progress (or before the next one). Any
        thread; never blocks; a no-op on a closed session."""
        h = self._handle
        if h:
            self._lib.session_cancel(h)

    # -- observing --

    def progress(self):
        """Where training stands (any thread, without waiting for a step in progress)."""
        out = _capi.kiln_progress()
        out.struct_size = ctypes.sizeof(out)
        _check(self._lib, self._lib.session_progress(self._h(), ctypes.byref(out)))
        return Progress(
            state=_STATES.get(out.state, str(out.state)), epoch_ended=bool(out.epoch_ended),
            step=out.step, max_steps=out.max_steps, epoch=out.epoch, epochs=out.epochs,
            batches_in_epoch=out.batches_in_epoch, batches_per_epoch=out.batches_per_epoch,
            rank=out.rank, world_size=out.world_size, stop_reason=_text(out.stop_reason),
            last_checkpoint=_path_text(out.last_checkpoint))

    def last_metrics(self, kind="step"):
        """The latest record of `kind` ("step" or "eval"), or None when there is none yet."""
        code = _KIND_CODES.get(kind, kind)
        if not isinstance(code, int):
            raise ValueError(f'kind {kind!r}: expected "step" or "eval"')
        out = _capi.kiln_metrics()
        out.struct_size = ctypes.sizeof(out)
        _check(self._lib, self._lib.session_last_metrics(self._h(), code, ctypes.byref(out)))
        return Metrics._from_c(out) if out.kind != 0 else None

    def on_metrics(self, callback):
        """Calls `callback(metrics)` after every step and evaluation, on the training thread;
        a true return stops the session after this step (as cancel). An exception it raises
        stops the session too and is re-raised by the run/step/evaluate call. Inside it, only
        progress, last_metrics and cancel may be called on this session. None clears it.
        Returns `callback`, so it also works as a decorator."""
        if callback is not None and not callable(callback):
            raise TypeError("on_metrics needs a callable or None")
        self._h()
        self._callback = callback
        return callback


class _sigint_cancels:
    """While a training call runs on the main thread with Python's default SIGINT handler, Ctrl-C
    cancels the session (the step in progress ends, its checkpoint is written) and the call
    raises KeyboardInterrupt afterwards, as `kiln run` stops on SIGINT. The handler runs at the
    next step's metrics callback (Python handles signals between bytecodes, never while C code
    holds the main thread). A program with its own SIGINT handler keeps it untouched."""

    def __init__(self, session):
        self.session = session
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
                return self
        except (ValueError, AttributeError):
            return self
        session = self.session

        def handler(signum, frame):
            session._interrupted = True
            session.cancel()

        self.previous = signal.signal(signal.SIGINT, handler)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
