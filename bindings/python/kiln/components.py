"""In-process components: a Python function as a session's learning-rate policy, no plugin
library to build.

    import kiln
    from kiln import components

    def halve_every(iteration, schedule):
        every = schedule.options["every"]
        return schedule.base_lr * 0.5 ** ((iteration - 1) // every)

    policy = components.lr_policy("halve_every", halve_every, options={"every": 100})
    with kiln.Session.from_file("pipeline.toml", components=[policy]) as s:  # [lr_policy]
        s.run()                                                 # name = "halve_every"

The policy is the C function table a plugin library exports (sdk/include/kiln/plugin.h and
lr_policy.h), built with ctypes and handed to the session in kiln_session_options.components:
the host validates it as a library's, the pipeline names it like any plugin's component, and its
options are checked against the schema given here (a misspelt key is a ConfigError).

fn(iteration, schedule) -> float is called on the thread that trains (the one calling
Session.step/run), for the 1-based optimizer step about to run, after any warm-up the host
applies itself; it must be pure (the same iteration gives the same rate). `schedule` is a
Schedule: base_lr (after linear batch scaling), max_iters, warmup_iters, iters_per_epoch and
options (a dict of the component's validated options, defaults filled). An exception raised in
fn becomes a failing status: the training call raises kiln.RunFailedError with the exception's
type and message (the session is then failed and can only be closed), and the exception itself
is kept in `policy.error`.

A policy may also react to evaluations, as torch's ReduceLROnPlateau does (ABI 1.15): give
`observe(metrics, iteration, epoch, schedule)`, called after each evaluation with the metrics by
name ("loss", and "top1" and "top5" or "map"; all-reduced under DDP), and keep what it learns in
`schedule.state`, a dict of this instance's own; lr_at reads it (pure between two evaluations).
`state=("lr", "best", ...)` names the float entries of schedule.state that checkpoints keep and
a resumed run restores:

    def plateau_lr(iteration, schedule):
        return schedule.state.get("lr", schedule.base_lr)

    def plateau_observe(metrics, iteration, epoch, schedule):
        st = schedule.state
        st.setdefault("lr", schedule.base_lr)
        if metrics["loss"] < st.get("best", math.inf):
            st["best"] = metrics["loss"]
        else:
            st["lr"] *= 0.5

    policy = components.LRPolicy("py_plateau", plateau_lr, observe=plateau_observe,
                                 state=("lr", "best"))

Only LR policies come from Python: an optimizer's vtable works on tensors (DLPack, per parameter
group), which the C function table of kiln_session_options.components serves C and Rust callers.
"""

import ctypes
import json
import math
import threading
from collections import namedtuple

from . import _capi

__all__ = ["lr_policy", "LRPolicy", "Option", "Schedule"]

# kiln/plugin.h and kiln/abi.h numbers.
_COMPONENT_LR_POLICY = 2
_CAP_DEVICE_CPU = 1 << 0
_CAP_DEVICE_CUDA = 1 << 1
_OPT_BOOL, _OPT_INT, _OPT_FLOAT, _OPT_STRING = 1, 2, 3, 4
_OPT_INT_LIST, _OPT_FLOAT_LIST, _OPT_STRING_LIST = 5, 6, 7
_ERR_INVALID_ARGUMENT, _ERR_INTERNAL = 1, 5

Schedule = namedtuple("Schedule", "base_lr max_iters warmup_iters iters_per_epoch options state",
                      defaults=(None,))
Schedule.__doc__ = """The schedule's frame an LR policy is made for (kiln_lr_schedule), in
optimizer steps, the component's options, and `state`: a dict of the instance's own for a policy
that reacts to evaluations (its `state` keys are checkpointed)."""


class Option:
    """One option of a component's schema: its default (which also gives its type: bool, int,
    float, str, or a list of one of them; None makes the option required, of `type`), inclusive
    bounds for numbers, allowed strings, and one line of documentation."""

    def __init__(self, default=None, min=None, max=None, choices=None, doc="", type=None):
        self.default = default
        self.min = min
        self.max = max
        self.choices = choices
        self.doc = doc
        self.type = type if type is not None else _type_of(default)


def _type_of(value):
    if isinstance(value, bool):
        return _OPT_BOOL
    if isinstance(value, int):
        return _OPT_INT
    if isinstance(value, float):
        return _OPT_FLOAT
    if isinstance(value, str):
        return _OPT_STRING
    if isinstance(value, (list, tuple)) and value:
        item = _type_of(value[0])
        lists = {_OPT_INT: _OPT_INT_LIST, _OPT_FLOAT: _OPT_FLOAT_LIST, _OPT_STRING: _OPT_STRING_LIST}
        if item in lists:
            return lists[item]
    raise TypeError(f"cannot tell an option's type from {value!r}: give Option(type=...) or a "
                    "bool, int, float, str or a non-empty list of one of them")


def _literal(value):
    """The TOML literal of a default (kiln_option_spec.default_value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for what JSON escapes
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    raise TypeError(f"no TOML literal for {value!r}")


# ---- ctypes mirrors of the plugin ABI's structs (field for field, in the headers' order) ----

c_size_t, c_int32, c_uint32, c_int64, c_uint64 = (ctypes.c_size_t, ctypes.c_int32,
                                                   ctypes.c_uint32, ctypes.c_int64,
                                                   ctypes.c_uint64)
c_double, c_char_p, c_void_p = ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p
_P = ctypes.POINTER


class kiln_option_spec(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p), ("type", c_int32),
                ("has_min", c_int32), ("has_max", c_int32), ("reserved", c_int32),
                ("min", c_double), ("max", c_double), ("default_value", c_char_p),
                ("choices", c_char_p), ("doc", c_char_p)]


class kiln_option_value(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p), ("type", c_int32),
                ("bool_value", c_int32), ("int_value", c_int64), ("float_value", c_double),
                ("string_value", c_char_p), ("int_list", _P(c_int64)),
                ("float_list", _P(c_double)), ("list_length", c_size_t),
                ("string_list", _P(c_char_p))]


class kiln_options(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("count", c_size_t),
                ("values", _P(kiln_option_value))]


class kiln_capabilities(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("flags", c_uint64), ("attribute_count", c_size_t),
                ("attributes", c_void_p)]


class kiln_lr_schedule(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("base_lr", c_double), ("max_iters", c_int64),
                ("warmup_iters", c_int64), ("iters_per_epoch", c_int64)]


# The host's table up to make_status: all a Python policy calls.
_make_status_fn = ctypes.CFUNCTYPE(c_void_p, c_int32, c_char_p)


class kiln_host_api(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("abi_major", c_uint32), ("abi_minor", c_uint32),
                ("make_status", _make_status_fn)]


# Statuses travel as plain addresses (c_void_p), NULL for success.
_create_fn = ctypes.CFUNCTYPE(c_void_p, _P(kiln_host_api), _P(kiln_options),
                              _P(kiln_lr_schedule), _P(c_void_p))
_destroy_fn = ctypes.CFUNCTYPE(None, c_void_p)
_lr_at_fn = ctypes.CFUNCTYPE(c_void_p, c_void_p, c_int64, _P(c_double))
_init_fn = ctypes.CFUNCTYPE(c_void_p, _P(kiln_host_api))


class kiln_lr_observation(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("iter", c_int64), ("epoch", c_int64),
                ("count", c_size_t), ("names", _P(c_char_p)), ("values", _P(c_double))]


_observe_fn = ctypes.CFUNCTYPE(c_void_p, c_void_p, _P(kiln_lr_observation))
_get_state_fn = ctypes.CFUNCTYPE(c_void_p, c_void_p, _P(c_double), c_size_t, _P(c_size_t))
_set_state_fn = ctypes.CFUNCTYPE(c_void_p, c_void_p, _P(c_double), c_size_t)


class kiln_lr_policy_vtable(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("create", _create_fn), ("destroy", _destroy_fn),
                ("lr_at", _lr_at_fn), ("observe", _observe_fn), ("get_state", _get_state_fn),
                ("set_state", _set_state_fn)]


class kiln_component_descriptor(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("kind", c_int32), ("reserved", c_int32),
                ("name", c_char_p), ("version", _capi.kiln_version), ("summary", c_char_p),
                ("capabilities", _P(kiln_capabilities)), ("option_count", c_size_t),
                ("options", _P(kiln_option_spec)), ("vtable", c_void_p)]


class kiln_plugin_descriptor(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("abi_major", c_uint32), ("abi_minor", c_uint32),
                ("name", c_char_p), ("version", _capi.kiln_version),
                ("component_count", c_size_t),
                ("components", _P(_P(kiln_component_descriptor))), ("init", _init_fn),
                ("torch_version", c_char_p), ("torch_cxx11_abi", c_int32),
                ("reserved", c_int32)]


def _option_values(options):
    """The validated options of a create call as a dict (copied: the host's array is valid
    during the call only)."""
    out = {}
    if not options:
        return out
    o = options.contents
    for i in range(o.count):
        v = o.values[i]
        name = v.name.decode("utf-8")
        n = v.list_length
        if v.type == _OPT_BOOL:
            out[name] = bool(v.bool_value)
        elif v.type == _OPT_INT:
            out[name] = v.int_value
        elif v.type == _OPT_FLOAT:
            out[name] = v.float_value
        elif v.type == _OPT_STRING:
            out[name] = (v.string_value or b"").decode("utf-8")
        elif v.type == _OPT_INT_LIST:
            out[name] = [v.int_list[j] for j in range(n)]
        elif v.type == _OPT_FLOAT_LIST:
            out[name] = [v.float_list[j] for j in range(n)]
        elif v.type == _OPT_STRING_LIST:
            out[name] = [(v.string_list[j] or b"").decode("utf-8") for j in range(n)]
    return out


class LRPolicy:
    """An LR policy whose lr_at is the Python function `lr_at(iteration, schedule) -> float`,
    named `name` in the pipeline's [lr_policy] table; `options` is its schema, a dict of option
    name -> default value or Option. Pass it to Session.from_file/from_string(components=[...]);
    keep no other use of it in mind: the session holds it until closed. One policy may serve
    several sessions (each makes its own instance)."""

    def __init__(self, name, lr_at, options=None, summary=None, version=(1, 0, 0), *,
                 observe=None, state=()):
        if not callable(lr_at):
            raise TypeError("lr_at must be callable as lr_at(iteration, schedule) -> float")
        if observe is not None and not callable(observe):
            raise TypeError("observe must be callable as "
                            "observe(metrics, iteration, epoch, schedule) -> None")
        if isinstance(state, str) or not all(isinstance(k, str) for k in state):
            raise TypeError("state must be a sequence of names (str) of schedule.state entries")
        if state and observe is None:
            raise ValueError("state keeps what observe learns: give observe too")
        self.observe = observe
        self.state_keys = tuple(state)
        if not isinstance(name, str) or not name:
            raise ValueError("an LR policy needs a non-empty name")
        self.name = name
        self.lr_at = lr_at
        self.error = None  # the latest exception lr_at raised, if any
        self._lock = threading.Lock()
        self._instances = {}  # instance id -> (Schedule, host table pointer)
        self._next_id = 1
        self._host = None
        self._options = {k: (v if isinstance(v, Option) else Option(v))
                         for k, v in (options or {}).items()}
        if summary is None:
            doc = (getattr(lr_at, "__doc__", None) or "").strip().splitlines()
            summary = doc[0] if doc else f"Python LR policy {getattr(lr_at, '__qualname__', '')}"
        self.summary = summary
        self._version = version
        self._descriptor = None  # built on first use (needs the library's ABI)

    # -- the C functions: no exception may leave them (ctypes would print it and return NULL,
    # which the host reads as success) --

    def _status(self, host, code, message):
        try:
            return host.contents.make_status(code, message.encode("utf-8", "replace"))
        except BaseException:  # noqa: B902
            return None

    def _init(self, host):
        self._host = host
        return None

    def _create(self, host, options, schedule, out):
        try:
            s = schedule.contents
            frame = Schedule(s.base_lr, s.max_iters, s.warmup_iters, s.iters_per_epoch,
                             _option_values(options), {})
            with self._lock:
                handle = self._next_id
                self._next_id += 1
                self._instances[handle] = (frame, host)
            out[0] = handle
            return None
        except BaseException as e:  # noqa: B902
            self.error = e
            return self._status(host, _ERR_INTERNAL,
                                f"{self.name}: create: {type(e).__name__}: {e}")

    def _destroy(self, handle):
        try:
            with self._lock:
                self._instances.pop(handle, None)
        except BaseException:  # noqa: B902
            pass

    def _lr_at(self, handle, iteration, lr):
        frame, host = self._instances.get(handle, (None, self._host))
        try:
            if frame is None:
                raise RuntimeError(f"unknown instance {handle}")
            value = float(self.lr_at(iteration, frame))
            lr[0] = value
            return None
        except BaseException as e:  # noqa: B902 (KeyboardInterrupt too: it fails the step)
            self.error = e
            code = _ERR_INVALID_ARGUMENT if isinstance(e, (ValueError, TypeError)) \
                else _ERR_INTERNAL
            return self._status(host, code,
                                f"{self.name}: lr_at({iteration}) raised {type(e).__name__}: {e}")

    def _observe(self, handle, observation):
        frame, host = self._instances.get(handle, (None, self._host))
        try:
            if frame is None:
                raise RuntimeError(f"unknown instance {handle}")
            o = observation.contents
            metrics = {o.names[i].decode("utf-8"): o.values[i] for i in range(o.count)}
            self.observe(metrics, o.iter, o.epoch, frame)
            return None
        except BaseException as e:  # noqa: B902
            self.error = e
            code = _ERR_INVALID_ARGUMENT if isinstance(e, (KeyError, ValueError, TypeError)) \
                else _ERR_INTERNAL
            return self._status(host, code, f"{self.name}: observe raised {type(e).__name__}: {e}")

    def _get_state(self, handle, values, capacity, count):
        frame, host = self._instances.get(handle, (None, self._host))
        try:
            if frame is None:
                raise RuntimeError(f"unknown instance {handle}")
            numbers = [float(frame.state.get(k, math.nan)) for k in self.state_keys]
            for i, v in enumerate(numbers[:capacity]):
                values[i] = v
            count[0] = len(numbers)
            return None
        except BaseException as e:  # noqa: B902
            self.error = e
            return self._status(host, _ERR_INTERNAL,
                                f"{self.name}: state: {type(e).__name__}: {e}")

    def _set_state(self, handle, values, count):
        frame, host = self._instances.get(handle, (None, self._host))
        try:
            if frame is None:
                raise RuntimeError(f"unknown instance {handle}")
            if count != len(self.state_keys):
                raise ValueError(f"the checkpoint holds {count} state values, this policy "
                                 f"keeps {len(self.state_keys)} ({', '.join(self.state_keys)})")
            frame.state.clear()
            for i, k in enumerate(self.state_keys):
                if not math.isnan(values[i]):  # NaN: the entry was not set when saved
                    frame.state[k] = values[i]
            return None
        except BaseException as e:  # noqa: B902
            self.error = e
            return self._status(host, _ERR_INVALID_ARGUMENT,
                                f"{self.name}: restoring state: {type(e).__name__}: {e}")

    # -- the descriptor --

    def _build(self, abi):
        specs = (kiln_option_spec * max(1, len(self._options)))()
        keep = []
        for i, (key, opt) in enumerate(self._options.items()):
            s = specs[i]
            s.struct_size = ctypes.sizeof(kiln_option_spec)
            for text, field in ((key, "name"), (opt.doc or "", "doc")):
                b = text.encode("utf-8")
                keep.append(b)
                setattr(s, field, b)
            s.type = opt.type
            if opt.min is not None:
                s.has_min, s.min = 1, float(opt.min)
            if opt.max is not None:
                s.has_max, s.max = 1, float(opt.max)
            if opt.default is not None:
                b = _literal(opt.default).encode("utf-8")
                keep.append(b)
                s.default_value = b
            if opt.choices is not None:
                b = ",".join(opt.choices).encode("utf-8")
                keep.append(b)
                s.choices = b
        caps = kiln_capabilities(ctypes.sizeof(kiln_capabilities),
                                 _CAP_DEVICE_CPU | _CAP_DEVICE_CUDA, 0, None)
        # Bound methods wrapped once: the host keeps these addresses for the session's life.
        fns = (_create_fn(self._create), _destroy_fn(self._destroy), _lr_at_fn(self._lr_at),
               _init_fn(self._init))
        vtable = kiln_lr_policy_vtable(ctypes.sizeof(kiln_lr_policy_vtable), *fns[:3])
        if self.observe is not None:
            if abi < (1, 15):
                raise RuntimeError(f"{self.name}: observe needs a Kiln library of ABI 1.15 or "
                                   f"later; this one is {abi[0]}.{abi[1]}")
            reacting = (_observe_fn(self._observe), _get_state_fn(self._get_state),
                        _set_state_fn(self._set_state))
            vtable.observe, vtable.get_state, vtable.set_state = reacting
            fns = fns + reacting
        name, summary = self.name.encode("utf-8"), self.summary.encode("utf-8")
        component = kiln_component_descriptor()
        component.struct_size = ctypes.sizeof(kiln_component_descriptor)
        component.kind = _COMPONENT_LR_POLICY
        component.name = name
        component.version = _capi.kiln_version(*self._version)
        component.summary = summary
        component.capabilities = ctypes.pointer(caps)
        component.option_count = len(self._options)
        component.options = specs if self._options else None
        component.vtable = ctypes.cast(ctypes.pointer(vtable), c_void_p)
        array = (_P(kiln_component_descriptor) * 1)(ctypes.pointer(component))
        plugin = kiln_plugin_descriptor()
        plugin.struct_size = ctypes.sizeof(kiln_plugin_descriptor)
        plugin.abi_major, plugin.abi_minor = abi
        plugin.name = b"python:" + name
        plugin.version = _capi.kiln_version(*self._version)
        plugin.component_count = 1
        plugin.components = array
        plugin.init = fns[3]
        plugin.torch_version = None  # no LibTorch: a plain function of numbers
        plugin.torch_cxx11_abi = -1
        self._descriptor = plugin
        self._keep = (specs, keep, caps, fns, vtable, name, summary, component, array)
        return plugin

    def _descriptor_for(self, lib):
        if self._descriptor is None:
            major, minor = c_uint32(), c_uint32()
            lib.plugin_abi(ctypes.byref(major), ctypes.byref(minor))
            self._build((major.value, minor.value))
        return self._descriptor

    def __repr__(self):
        return f"LRPolicy({self.name!r}, {self.lr_at!r})"


def lr_policy(name, fn, options=None, summary=None):
    """LRPolicy(name, lr_at=fn, options=options): fn(iteration, schedule) -> float."""
    return LRPolicy(name, fn, options=options, summary=summary)


def _attach(opts, components, origin=None):
    """Points kiln_session_options `opts` at `components` (LRPolicy objects) and returns what
    must stay alive for the create call; the caller keeps `components` for the session's life."""
    if not components:
        return None
    lib = _capi.library()
    items = list(components)
    for c in items:
        if not isinstance(c, LRPolicy):
            raise TypeError(f"components holds {c!r}; expected kiln.components.LRPolicy objects")
    array = (_P(kiln_plugin_descriptor) * len(items))(
        *[ctypes.pointer(c._descriptor_for(lib)) for c in items])
    opts.components = ctypes.cast(array, c_void_p)
    opts.component_count = len(items)
    name = (origin or "<python>").encode("utf-8")
    opts.component_origin = name
    return (array, name)
