"""Python binding of Kiln's C API (sdk/include/kiln/kiln.h, version 2), on ctypes alone.

    import kiln
    with kiln.Session("configs/quickstart.toml", run={"epochs": 5}) as s:
        for ev in s.epochs():
            print(ev.epoch, ev.accuracy)
            if ev.accuracy >= 0.9:
                break
        weights = s.state_dict()            # {name: torch.Tensor}, the live tensors (DLPack)

A session comes from a pipeline file, TOML text or a nested dict (Session.from_file,
from_string, from_dict, or Session(config) for any of them); overrides are a dict of dotted keys
and/or keyword sections (run={"epochs": 5}). The library is found through kiln.load(path), else
the environment variable KILN_LIBRARY, else ctypes.util.find_library("kiln"). Failed calls raise
KilnError (or its subclasses) with the library's message unchanged; configuration errors also
carry .file, .line, .column and .key. torch is imported only by the tensor calls.
"""

import ctypes
import dataclasses
import os
import re
import signal
import threading
import weakref
from dataclasses import dataclass
from typing import (Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence,
                    Tuple, Union)

from . import _capi, _dlpack
from . import components as _components
from ._capi import load  # noqa: F401  (public: kiln.load(path=None))
from .config import Overrides, override_strings, to_toml, toml_literal

__all__ = [
    "load", "version", "plugin_abi", "plugins", "toml_literal", "to_toml",
    "KilnError", "ConfigError", "PluginRefusedError", "RunFailedError",
    "Session", "Metrics", "Progress", "PluginInfo", "PluginScan", "IncompatibleKeys",
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
    """A status returned by libkiln: `code` is its KILN_ERR_* value, `code_name` its name
    ("CONFIG", "INVALID_ARGUMENT", ...), `message` its text. Configuration errors also say
    where they point: `file` (the pipeline file, the name given to from_string/from_dict, or
    "--set" for an override), `line` and `column` (1-based; 0 when not at a place in the file)
    and `key` ("run.epochz"; "" for a TOML syntax error); all None when the status carries no
    location."""

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

    code: int
    message: str
    file: Optional[str]
    line: Optional[int]
    column: Optional[int]
    key: Optional[str]

    def __init__(self, code: int, message: str, location: Optional[Tuple[str, int, int, str]] = None):
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.file, self.line, self.column, self.key = location or (None, None, None, None)

    @property
    def code_name(self) -> str:
        return _CODE_NAMES.get(self.code, f"code {self.code}")

    @property
    def suggestion(self) -> Optional[str]:
        """The key the message suggests for a misspelt one ("did you mean 'epochs'?"), or
        None."""
        m = re.search(r"did you mean '([^']+)'", self.message)
        return m.group(1) if m else None

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


def _location(lib, status):
    """(file, line, column, key) of a status that carries a location, else None."""
    if lib.status_location is None:  # a version-1 library
        return None
    loc = _capi.kiln_status_location()
    loc.struct_size = ctypes.sizeof(loc)
    if not lib.status_location(status, ctypes.byref(loc)):
        return None
    return _path_text(loc.file), loc.line, loc.column, _text(loc.key)


def _check(lib, status):
    """Raises the KilnError of a non-NULL status, releasing the status first."""
    if not status:
        return
    try:
        code = lib.status_code(status)
        message = _text(lib.status_message(status))
        location = _location(lib, status)
    finally:
        lib.status_release(status)
    raise _ERROR_CLASSES.get(code, KilnError)(code, message, location)


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
    map: float = float("nan")  # evaluations of multi-label data: mean average precision
    averaged: bool = False  # evaluations: of [ema]'s moving average, not the trained weights

    @classmethod
    def _from_c(cls, m):
        return cls(
            kind=_KINDS.get(m.kind, str(m.kind)), skipped=bool(m.skipped), step=m.step,
            epoch=m.epoch, loss=m.loss, accuracy=m.accuracy, lr=m.lr, grad_norm=m.grad_norm,
            loss_scale=m.loss_scale, step_seconds=m.step_seconds, data_seconds=m.data_seconds,
            samples_per_second=m.samples_per_second, tensor_mb=m.tensor_mb,
            tensor_peak_mb=m.tensor_peak_mb, activation_mb=m.activation_mb,
            accuracy_top5=m.accuracy_top5, map=m.map,
            averaged=m.weights == _capi.WEIGHTS_AVERAGE)

    def as_dict(self, drop_nan: bool = False) -> Dict[str, Any]:
        """The record as a plain dict (field name -> value), e.g. for a logger or a DataFrame
        row. With drop_nan, fields that do not apply to the kind (NaN) are left out."""
        d = dataclasses.asdict(self)
        if drop_nan:
            d = {k: v for k, v in d.items() if not (isinstance(v, float) and v != v)}
        return d


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
    def done(self) -> bool:
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

def version() -> str:
    """E.g. "kiln 0.1.0, C API 1, plugin ABI 1.2, LibTorch 2.11.0"."""
    return _text(_capi.library().version_string())


def plugin_abi() -> Tuple[int, int]:
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


def plugins(extra_dirs: Sequence[Union[str, "os.PathLike[str]"]] = ()) -> "PluginScan":
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
# (kiln.config: toml_literal, to_toml, override_strings)

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
    ovs, n_ovs = _c_strings(overrides, "overrides")
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
        record = Metrics._from_c(metrics_ptr.contents)
        return 1 if callback(record.as_dict() if session._as_dict else record) else 0
    except BaseException as e:  # noqa: B902 (KeyboardInterrupt included: re-raised later)
        if session._pending is None:
            session._pending = e
        return 1  # stops the session after this step, as session_cancel


class IncompatibleKeys(NamedTuple):
    """What Session.load_state_dict(strict=False) left alone, as torch's load_state_dict says."""

    missing_keys: List[str]     # model tensors not given (they kept their values)
    unexpected_keys: List[str]  # names given that the model does not have (skipped)


def _lend_path(config) -> bool:
    """Session(config): a str with a newline is TOML text; another str or a PathLike a path."""
    return isinstance(config, os.PathLike) or (isinstance(config, str) and "\n" not in config)


class Session:
    """A training session: one resolved pipeline with its plugins, model, optimizer and data.

    Made from a pipeline file, TOML text or a nested dict:

        kiln.Session("pipe.toml")                      # a path (str without a newline, PathLike)
        kiln.Session(toml_text)                        # a str with a newline: TOML text
        kiln.Session({"run": {"epochs": 1}, ...})      # a dict: Session.from_dict
        kiln.Session.from_file("pipe.toml", overrides={"run.epochs": 2}, run={"max_steps": 5})

    A context manager (close() frees it). Training calls (run, step, evaluate, save_checkpoint,
    the tensor calls) may come from any thread, one at a time per session; cancel() and
    progress() may be called from any thread while another trains.
    """

    def __init__(self, config: Union[str, "os.PathLike[str]", Mapping[str, Any], int] = None,
                 _lib: Any = None, *, name: Optional[str] = None, overrides: Overrides = None,
                 plugin_paths: Optional[List[Union[str, "os.PathLike[str]"]]] = None,
                 metrics_path: Optional[Union[str, "os.PathLike[str]"]] = None,
                 resume: Optional[Union[str, "os.PathLike[str]"]] = None,
                 log_level: Union[str, int, None] = None, distributed: bool = False,
                 process_settings: int = 0, components: Optional[Sequence[Any]] = None,
                 **sections: Mapping[str, Any]):
        """Session(config, **options_and_sections): from_dict for a mapping, from_string for a
        str that contains a newline, from_file for any other str or os.PathLike. The keyword
        arguments are those of from_file (`name` only for text and dicts)."""
        if isinstance(_lib, _capi.Library):
            # The binding's own path: wrap a new session handle (from_file, from_string).
            self._wrap(config, _lib)
            return
        if config is None:
            raise TypeError("Session needs a pipeline: a path, TOML text or a dict")
        options = dict(overrides=overrides, plugin_paths=plugin_paths, metrics_path=metrics_path,
                       resume=resume, log_level=log_level, distributed=distributed,
                       process_settings=process_settings, components=components)
        if isinstance(config, Mapping):
            handle, lib = Session._create("dict", config, name or "inline", options, sections)
        elif _lend_path(config):
            if name is not None:
                raise TypeError("name is for TOML text and dicts; a file is named by its path")
            handle, lib = Session._create("file", config, None, options, sections)
        elif isinstance(config, str):
            handle, lib = Session._create("string", config, name or "inline", options, sections)
        else:
            raise TypeError(f"Session needs a path, TOML text or a dict, not "
                            f"{type(config).__name__}")
        self._wrap(handle, lib)
        self._hold(components)

    def _wrap(self, handle, lib):
        self._lib = lib
        self._handle = handle
        self._callback = None
        self._as_dict = False
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

    @staticmethod
    def _create(kind, source, name, options, sections):
        """A new session handle from a file path, TOML text or a dict, with `options` (the
        keyword arguments of from_file) and keyword override `sections`."""
        lib = _capi.library()
        strings = override_strings(options.pop("overrides"), **sections)
        opts, keep = _options(strings, **options)
        handle = ctypes.c_void_p()
        if kind == "file":
            status = lib.session_create_from_file(os.fsencode(source), ctypes.byref(opts),
                                                  ctypes.byref(handle))
        else:
            text = to_toml(source) if kind == "dict" else source
            status = lib.session_create_from_string(text.encode("utf-8"), name.encode("utf-8"),
                                                    ctypes.byref(opts), ctypes.byref(handle))
        del keep
        _check(lib, status)
        return handle.value, lib

    @classmethod
    def from_file(cls, path: Union[str, "os.PathLike[str]"], overrides: Overrides = None,
                  plugin_paths=None, metrics_path=None, resume=None, log_level=None,
                  distributed: bool = False, process_settings: int = 0,
                  components: Optional[Sequence[Any]] = None,
                  **sections: Mapping[str, Any]) -> "Session":
        """Reads the pipeline file `path`, applies the overrides, loads plugins and builds
        everything.

        Overrides: `overrides` is a dict of dotted keys to Python values ({"run.epochs": 2};
        a key without a dot whose value is a dict is a section: {"run": {"epochs": 2}}) or a
        list of "dotted.key=value" strings as `kiln run --set` takes; keyword arguments named
        after a section add more (run={"max_steps": 5} is "run.max_steps=5"), after `overrides`,
        so they win. A dict inside a section's dict is an inline-table value, not a deeper
        section. `process_settings` (kiln.PROCESS_* bits) says what the session may change in
        the whole process (the CPU allocator, torch's threads and flags, malloc's tuning,
        SIGINT/SIGTERM handlers); 0 leaves the process as it is. Raises ConfigError (with
        .file/.line/.column/.key), PluginRefusedError, KilnError, and TypeError for a value
        with no TOML form. `components` are in-process components (kiln.components, e.g. an LR
        policy that is a Python function) the pipeline may name; the session holds them until
        close()."""
        options = dict(overrides=overrides, plugin_paths=plugin_paths, metrics_path=metrics_path,
                       resume=resume, log_level=log_level, distributed=distributed,
                       process_settings=process_settings, components=components)
        handle, lib = cls._create("file", path, None, options, sections)
        return cls(handle, lib)._hold(components)

    @classmethod
    def from_string(cls, toml: str, name: str = "inline", overrides: Overrides = None,
                    plugin_paths=None, metrics_path=None, resume=None, log_level=None,
                    distributed: bool = False, process_settings: int = 0,
                    components: Optional[Sequence[Any]] = None,
                    **sections: Mapping[str, Any]) -> "Session":
        """As from_file, from TOML text; `name` stands for the file in messages (and in
        KilnError.file) and in the default output folder runs/<name>. Relative data paths are
        taken from the current directory."""
        options = dict(overrides=overrides, plugin_paths=plugin_paths, metrics_path=metrics_path,
                       resume=resume, log_level=log_level, distributed=distributed,
                       process_settings=process_settings, components=components)
        handle, lib = cls._create("string", toml, name, options, sections)
        return cls(handle, lib)._hold(components)

    @classmethod
    def from_dict(cls, config: Mapping[str, Any], name: str = "inline",
                  overrides: Overrides = None, plugin_paths=None, metrics_path=None, resume=None,
                  log_level=None, distributed: bool = False, process_settings: int = 0,
                  components: Optional[Sequence[Any]] = None,
                  **sections: Mapping[str, Any]) -> "Session":
        """As from_string, from a nested dict written as the pipeline's TOML (kiln.to_toml):
        {"run": {"epochs": 2}, "model": {"name": "mlp", "hidden": [32]}}. Top-level dicts are
        [sections], dicts within them [section.sub] tables, lists of dicts arrays of tables;
        a value with no TOML form (None, an object) raises TypeError naming its dotted key.
        Configuration errors point into that TOML (KilnError.line counts its lines; `name`
        is its file name)."""
        options = dict(overrides=overrides, plugin_paths=plugin_paths, metrics_path=metrics_path,
                       resume=resume, log_level=log_level, distributed=distributed,
                       process_settings=process_settings, components=components)
        handle, lib = cls._create("dict", config, name, options, sections)
        return cls(handle, lib)._hold(components)

    def _hold(self, components):
        # In-process components (kiln.components) are borrowed by the library until close().
        self._components = list(components or ())
        return self

    # -- lifetime --

    def close(self) -> None:
        """Frees the session (writes nothing: call save_checkpoint first to keep the state).
        Idempotent."""
        handle, self._handle = self._handle, None
        if handle:
            self._lib.session_destroy(handle)
        # Only now: the library may have called the callback up to the destroy.
        self._c_callback = None
        self._callback = None

    @property
    def closed(self) -> bool:
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

    def run(self) -> "Progress":
        """Trains until the session leaves "ready" (evaluating, checkpointing and logging as
        `kiln run` does) and returns the final Progress. Ctrl-C in the main thread cancels after
        the current step (with its checkpoint when run.checkpoints) and raises
        KeyboardInterrupt."""
        self._train_call(self._lib.session_run)
        return self.progress()

    def step(self) -> Optional["Metrics"]:
        """One optimizer step. Returns its Metrics (kind "step"), or None when no step was taken
        (the session was cancelled before it began). Raises KilnError with code
        FAILED_PRECONDITION when the session is not "ready"."""
        before = self.progress().step
        self._train_call(self._lib.session_step)
        m = self.last_metrics("step")
        return m if m is not None and m.step > before else None

    def evaluate(self) -> "Metrics":
        """Evaluates on the test split now; returns the Metrics (kind "eval")."""
        out = _capi.kiln_metrics()
        out.struct_size = ctypes.sizeof(out)
        self._train_call(self._lib.session_evaluate, ctypes.byref(out))
        return Metrics._from_c(out)

    def save_checkpoint(self) -> str:
        """Writes a checkpoint of the current state (even with run.checkpoints off); returns its
        folder ("" on ranks other than 0)."""
        path = ctypes.c_char_p()
        self._train_call(self._lib.session_save_checkpoint, ctypes.byref(path))
        return _path_text(path.value)

    def epochs(self) -> Iterator["Metrics"]:
        """Steps through the run, yielding the test Metrics after each epoch (and once more when
        run.max_steps ends the run inside an epoch). Stop early by leaving the loop; a session
        cancelled or stopped by a guard ends the loop without an evaluation."""
        while self.progress().state == READY:
            self.step()
            p = self.progress()
            if p.state == FINISHED or (p.state == READY and p.epoch_ended):
                yield self.evaluate()

    def cancel(self) -> None:
        """Asks the session to stop after the step in progress (or before the next one). Any
        thread; never blocks; a no-op on a closed session."""
        h = self._handle
        if h:
            self._lib.session_cancel(h)

    # -- observing --

    def progress(self) -> "Progress":
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

    def last_metrics(self, kind: Union[str, int] = "step") -> Optional["Metrics"]:
        """The latest record of `kind` ("step" or "eval"), or None when there is none yet."""
        code = _KIND_CODES.get(kind, kind)
        if not isinstance(code, int):
            raise ValueError(f'kind {kind!r}: expected "step" or "eval"')
        out = _capi.kiln_metrics()
        out.struct_size = ctypes.sizeof(out)
        _check(self._lib, self._lib.session_last_metrics(self._h(), code, ctypes.byref(out)))
        return Metrics._from_c(out) if out.kind != 0 else None

    def on_metrics(self, callback: Optional[Callable[[Any], Any]] = None, *,
                   as_dict: bool = False):
        """Calls `callback(metrics)` after every step and evaluation, on the training thread,
        with a Metrics record, or with a plain dict (Metrics.as_dict(): "kind", "step", "loss",
        ...) when `as_dict`; a true return stops the session after this step (as cancel). An
        exception it raises stops the session too and is re-raised by the run/step/evaluate
        call. Inside it, only progress, last_metrics and cancel may be called on this session.
        None clears it. Returns `callback`, so it also works as a decorator
        (@s.on_metrics, or @s.on_metrics(as_dict=True))."""
        if callback is None and as_dict:
            return lambda cb: self.on_metrics(cb, as_dict=True)  # the decorator form
        if callback is not None and not callable(callback):
            raise TypeError("on_metrics needs a callable or None")
        self._h()
        self._callback = callback
        self._as_dict = bool(as_dict)
        return callback

    def steps(self, limit: Optional[int] = None, as_dict: bool = True) -> Iterator[Any]:
        """Takes steps while the session is "ready" (at most `limit` of them), yielding each
        step's record: a dict (Metrics.as_dict()) by default, a Metrics with as_dict=False.
        It does not evaluate (see epochs()); leaving the loop leaves the session where it is.

            for m in session.steps(100):
                print(m["step"], m["loss"])
        """
        taken = 0
        while (limit is None or taken < limit) and self.progress().state == READY:
            m = self.step()
            if m is None:
                return
            taken += 1
            yield m.as_dict() if as_dict else m

    # -- tensors (C API version 2; DLPack, torch imported here only) --

    def _tensors(self, kinds: int) -> Dict[str, Any]:
        # Inside a metrics callback the library refuses it (FAILED_PRECONDITION).
        return _dlpack.tensors(self._lib, self._h(), kinds, _check)

    def state_dict(self) -> Dict[str, Any]:
        """The model's parameters and buffers as {name: torch.Tensor}, named as the model's
        state_dict and a checkpoint's model.safetensors name them ("fc1.weight").

        No copy: each tensor aliases the live training tensor (through DLPack), so it shows every
        later step, and writing into it (tensor.copy_(...), in place, under torch.no_grad())
        changes the training. It keeps the storage alive after the session closes. Clone it for
        a snapshot. Needs torch; not inside a metrics callback."""
        return self._tensors(_capi.TENSORS_MODEL)

    def parameters(self) -> Dict[str, Any]:
        """The model's parameters only, as state_dict() (live, no copies)."""
        return self._tensors(_capi.TENSORS_PARAMETERS)

    def buffers(self) -> Dict[str, Any]:
        """The model's buffers only (batch norm's running statistics, ...), live as
        state_dict()."""
        return self._tensors(_capi.TENSORS_BUFFERS)

    def optimizer_state(self) -> Dict[str, Any]:
        """The optimizer's state tensors as {"<parameter>.<slot>": torch.Tensor}
        ("fc1.weight.momentum_buffer", "fc1.weight.exp_avg"), live as state_dict(); empty before
        the first step for optimizers that create their state then."""
        return self._tensors(_capi.TENSORS_OPTIMIZER)

    def average(self) -> Dict[str, Any]:
        """[ema]'s moving average of the parameters and buffers as {"ema/<name>": torch.Tensor}
        (named as a checkpoint's trainer.safetensors; floating ones at least float32), live as
        state_dict(): every step moves it. Raises KilnError (FAILED_PRECONDITION) when the
        pipeline keeps no average. load_state_dict takes these names back."""
        return self._tensors(_capi.TENSORS_AVERAGE)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True
                        ) -> IncompatibleKeys:
        """Copies `state_dict` ({name: tensor}: torch tensors, or anything with __dlpack__,
        e.g. numpy arrays) into the model's parameters and buffers of the same names, as
        torch's Module.load_state_dict does; the optimizer's state is left as it is. With
        [ema], "ema/<name>" tensors (average()'s) load the average; they are optional.

        strict (the default): every model tensor must be given and every name must be the
        model's. Shapes must match; floating-point dtypes are cast to the model's, others must
        match. A refusal raises KilnError (code INVALID_ARGUMENT) naming the key and changes
        nothing. strict=False keeps model tensors not given and skips unknown names; the
        return value lists both (IncompatibleKeys). Not inside a metrics callback."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict needs a mapping of name -> tensor, not "
                            f"{type(state_dict).__name__}")
        flags = 0 if strict else _capi.LOAD_ALLOW_MISSING | _capi.LOAD_ALLOW_UNEXPECTED
        _dlpack.load(self._lib, self._h(), state_dict, flags, _check)
        if strict:
            return IncompatibleKeys([], [])
        model = _dlpack.names(self._lib, self._h(), _capi.TENSORS_MODEL, _check)
        known = set(model)
        if any(name.startswith("ema/") for name in state_dict):
            try:  # the average's names were loaded, not skipped
                known.update(_dlpack.names(self._lib, self._h(), _capi.TENSORS_AVERAGE, _check))
            except KilnError:
                pass  # no [ema]: they were skipped as unexpected
        return IncompatibleKeys([n for n in model if n not in state_dict],
                                [n for n in state_dict if n not in known])


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
