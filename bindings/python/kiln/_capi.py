"""ctypes declarations of sdk/include/kiln/kiln.h (C API version 2) and the loading of libkiln.

Every struct and every slot of the function table mirrors the header field for field, in the
header's order: the table is read by offset, so one slot out of place would call the wrong
function. Only `kiln_get_api` is bound by name; everything else comes through the table.
"""

import ctypes
import ctypes.util
import os
import threading

CAPI_VERSION = 2

# kiln/abi.h status codes, and kiln.h's own.
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_UNSUPPORTED = 2
ERR_FAILED_PRECONDITION = 3
ERR_OUT_OF_MEMORY = 4
ERR_INTERNAL = 5
ERR_CANCELLED = 6
ERR_CONFIG = 16
ERR_PLUGIN_REFUSED = 17
ERR_RUN_FAILED = 18

LOG_DEFAULT, LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF = range(6)

SESSION_READY = 0
SESSION_FINISHED = 1
SESSION_CANCELLED = 2
SESSION_STOPPED = 3
SESSION_FAILED = 4

METRICS_STEP = 1
METRICS_EVAL = 2
WEIGHTS_TRAINED = 1  # kiln_metrics.weights (V4): which weights an evaluation measured
WEIGHTS_AVERAGE = 2

# session_tensors' kinds (KILN_TENSORS_*) and session_load_tensors' flags (KILN_LOAD_*), version 2
TENSORS_PARAMETERS = 1
TENSORS_BUFFERS = 2
TENSORS_MODEL = 3
TENSORS_OPTIMIZER = 4
TENSORS_AVERAGE = 8  # [ema]'s average, "ema/<name>"
LOAD_ALLOW_MISSING = 1
LOAD_ALLOW_UNEXPECTED = 2

# kiln_session_options.process_settings bits (KILN_PROCESS_*)
PROCESS_COUNT_CPU_MEMORY = 1
PROCESS_TORCH_SETTINGS = 2
PROCESS_TUNE_HEAP = 4
PROCESS_SIGNALS = 8
PROCESS_ALL = 15

c_size_t = ctypes.c_size_t
c_int32 = ctypes.c_int32
c_uint32 = ctypes.c_uint32
c_int64 = ctypes.c_int64
c_double = ctypes.c_double
c_char_p = ctypes.c_char_p
# Opaque handles (kiln_status*, kiln_session*, kiln_plugin_list*) travel as plain addresses.
c_handle = ctypes.c_void_p


class kiln_version(ctypes.Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32), ("patch", c_uint32)]


class kiln_session_options(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("overrides", ctypes.POINTER(c_char_p)),
        ("override_count", c_size_t),
        ("plugin_paths", ctypes.POINTER(c_char_p)),
        ("plugin_path_count", c_size_t),
        ("metrics_path", c_char_p),
        ("resume", c_char_p),
        ("log_level", c_int32),
        ("distributed", c_int32),
        ("process_settings", c_uint32),  # appended after version 1
        # V2: in-process components (kiln/components.py builds the descriptors)
        ("components", ctypes.c_void_p),
        ("component_count", c_size_t),
        ("component_origin", c_char_p),
    ]
    _v1_last_ = "distributed"


class kiln_progress(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("state", c_int32),
        ("epoch_ended", c_int32),
        ("step", c_int64),
        ("max_steps", c_int64),
        ("epoch", c_int64),
        ("epochs", c_int64),
        ("batches_in_epoch", c_int64),
        ("batches_per_epoch", c_int64),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("stop_reason", c_char_p),
        ("last_checkpoint", c_char_p),
    ]


class kiln_metrics(ctypes.Structure):
    _v1_last_ = "activation_mb"
    _fields_ = [
        ("struct_size", c_size_t),
        ("kind", c_int32),
        ("skipped", c_int32),
        ("step", c_int64),
        ("epoch", c_int64),
        ("loss", c_double),
        ("accuracy", c_double),
        ("lr", c_double),
        ("grad_norm", c_double),
        ("loss_scale", c_double),
        ("step_seconds", c_double),
        ("data_seconds", c_double),
        ("samples_per_second", c_double),
        ("tensor_mb", c_double),
        ("tensor_peak_mb", c_double),
        ("activation_mb", c_double),
        ("accuracy_top5", c_double),  # V2
        ("map", c_double),  # V3: multi-label evaluations
        ("weights", c_int32),  # V4: WEIGHTS_* on evaluations
    ]


class kiln_plugin_info(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char_p),
        ("kind", c_char_p),
        ("summary", c_char_p),
        ("library", c_char_p),
        ("version", kiln_version),
        ("abi_major", c_uint32),
        ("abi_minor", c_uint32),
    ]


class kiln_status_location(ctypes.Structure):  # version 2
    _fields_ = [
        ("struct_size", c_size_t),
        ("file", c_char_p),
        ("line", c_int64),
        ("column", c_int64),
        ("key", c_char_p),
    ]


# dlpack/dlpack.h's unversioned structs (DLPack 0.x/1.x "dltensor" capsules), which
# tensor_list_get hands out and session_load_tensors reads.
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(c_int64)),
        ("strides", ctypes.POINTER(c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))),
]


# typedef int32_t (*kiln_metrics_callback)(void* user_data, const kiln_metrics* metrics);
metrics_callback = ctypes.CFUNCTYPE(c_int32, ctypes.c_void_p, ctypes.POINTER(kiln_metrics))

_F = ctypes.CFUNCTYPE
_P = ctypes.POINTER


class kiln_api(ctypes.Structure):
    _v1_last_ = "plugins_release"
    # CFUNCTYPE (not PYFUNCTYPE): ctypes releases the GIL for the length of every call, so
    # session_cancel, session_progress and Python threads keep running while a step trains.
    _fields_ = [
        ("struct_size", c_size_t),
        ("version", c_uint32),
        ("reserved", c_uint32),
        # versions
        ("version_string", _F(c_char_p)),
        ("plugin_abi", _F(None, _P(c_uint32), _P(c_uint32))),
        # statuses
        ("status_code", _F(c_int32, c_handle)),
        ("status_message", _F(c_char_p, c_handle)),
        ("status_release", _F(None, c_handle)),
        # sessions
        ("session_create_from_file",
         _F(c_handle, c_char_p, _P(kiln_session_options), _P(c_handle))),
        ("session_create_from_string",
         _F(c_handle, c_char_p, c_char_p, _P(kiln_session_options), _P(c_handle))),
        ("session_destroy", _F(None, c_handle)),
        ("session_set_metrics_callback", _F(c_handle, c_handle, metrics_callback, c_handle)),
        ("session_run", _F(c_handle, c_handle)),
        ("session_step", _F(c_handle, c_handle)),
        ("session_evaluate", _F(c_handle, c_handle, _P(kiln_metrics))),
        ("session_save_checkpoint", _F(c_handle, c_handle, _P(c_char_p))),
        ("session_cancel", _F(None, c_handle)),
        ("session_progress", _F(c_handle, c_handle, _P(kiln_progress))),
        ("session_last_metrics", _F(c_handle, c_handle, c_int32, _P(kiln_metrics))),
        # plugins
        ("plugins_list", _F(c_handle, _P(c_char_p), c_size_t, _P(c_handle))),
        ("plugins_count", _F(c_size_t, c_handle)),
        ("plugins_get", _F(c_handle, c_handle, c_size_t, _P(kiln_plugin_info))),
        ("plugins_refused_count", _F(c_size_t, c_handle)),
        ("plugins_refused", _F(c_char_p, c_handle, c_size_t)),
        ("plugins_release", _F(None, c_handle)),
        # ---- version 2 ----
        ("status_location", _F(c_int32, c_handle, _P(kiln_status_location))),
        ("session_tensors", _F(c_handle, c_handle, c_uint32, _P(c_handle))),
        ("tensor_list_count", _F(c_size_t, c_handle)),
        ("tensor_list_name", _F(c_char_p, c_handle, c_size_t)),
        ("tensor_list_get", _F(c_handle, c_handle, c_size_t, _P(_P(DLManagedTensor)))),
        ("tensor_list_release", _F(None, c_handle)),
        ("session_load_tensors",
         _F(c_handle, c_handle, _P(c_char_p), _P(_P(DLManagedTensor)), c_size_t, c_uint32)),
    ]


def v1_size(struct):
    """KILN_SIZE_UP_TO(struct, <last version-1 field>): the smallest struct_size the library
    accepts. Fields appended later follow the one a struct names in `_v1_last_`."""
    name = getattr(struct, "_v1_last_", struct._fields_[-1][0])
    field = getattr(struct, name)
    return field.offset + field.size


KILN_API_V1_SIZE = v1_size(kiln_api)
KILN_API_V2_SIZE = ctypes.sizeof(kiln_api)

_SLOTS = [name for name, _ in kiln_api._fields_[3:]]
# The slots a version-1 library serves; the rest are version 2's.
_V1_SLOTS = _SLOTS[:_SLOTS.index("plugins_release") + 1]


class Library:
    """A loaded libkiln and its function table: version 2's, or version 1's from an older
    library (whose version-2 slots are then None, and the calls that need them say so).

    The slots are copied out of the table once (attribute access on a ctypes Structure builds a
    new function object each time).
    """

    def __init__(self, path):
        self.path = path
        try:
            self.dll = ctypes.CDLL(path)
        except OSError as e:
            raise OSError(f"cannot load libkiln from {path!r}: {e}") from e
        try:
            get_api = self.dll.kiln_get_api
        except AttributeError:
            raise OSError(f"{path}: no kiln_get_api symbol; is this libkiln?") from None
        get_api.argtypes = [c_uint32]
        get_api.restype = _P(kiln_api)
        wanted = CAPI_VERSION
        table = get_api(wanted)
        if not table:
            wanted = 1  # an older library: everything but the version-2 calls
            table = get_api(wanted)
        if not table:
            raise OSError(f"{path}: kiln_get_api({CAPI_VERSION}) and kiln_get_api(1) returned "
                          f"NULL: the library serves neither C API version")
        # The table is library-owned and static; a version-1 table is only KILN_API_V1_SIZE
        # bytes, so it is read through a view of that many bytes, never past its end.
        self.table = table.contents
        self.capi_version = wanted
        if self.table.version != wanted:
            raise OSError(f"{path}: kiln_get_api({wanted}) returned a table of version "
                          f"{self.table.version}")
        need = KILN_API_V2_SIZE if wanted >= 2 else KILN_API_V1_SIZE
        if self.table.struct_size < need:
            raise OSError(f"{path}: kiln_api.struct_size is {self.table.struct_size}, smaller "
                          f"than the version-{wanted} table ({need} bytes)")
        for name in _SLOTS:
            if name not in _V1_SLOTS and wanted < 2:
                setattr(self, name, None)
                continue
            fn = getattr(self.table, name)
            if not fn:
                raise OSError(f"{path}: kiln_api.{name} is NULL (every slot must be set)")
            setattr(self, name, fn)

    def need(self, slot):
        """The version-2 slot `slot`, or OSError naming the library when it serves version 1."""
        fn = getattr(self, slot)
        if fn is None:
            raise OSError(f"{self.path} serves C API version {self.capi_version}; "
                          f"{slot} needs version 2 (a newer libkiln)")
        return fn


_lock = threading.Lock()
_library = None


def bundled_path():
    """libkiln inside this package when it is an installed wheel (lib/libkiln.so.1 beside the
    Python files; docs/install.md), else None: the Python code and its library are one release."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libkiln.so.1")
    return path if os.path.isfile(path) else None


def default_path():
    path = bundled_path()
    if path:
        return path
    path = os.environ.get("KILN_LIBRARY")
    if path:
        return path
    path = ctypes.util.find_library("kiln")
    if path:
        return path
    raise OSError("libkiln not found: install the kiln-train wheel, set the environment variable "
                  "KILN_LIBRARY to its path (e.g. build/release/lib/libkiln.so), or call "
                  "kiln.load(path)")


def load(path=None):
    """Loads libkiln once per process; later calls return the same library."""
    global _library
    with _lock:
        if _library is not None:
            if path is not None and os.fspath(path) != _library.path and \
                    os.path.realpath(path) != os.path.realpath(_library.path):
                raise OSError(f"libkiln is already loaded from {_library.path}; cannot load "
                              f"{os.fspath(path)} as well")
            return _library
        _library = Library(os.fspath(path) if path is not None else default_path())
        return _library


def library():
    return _library if _library is not None else load()
