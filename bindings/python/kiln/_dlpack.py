"""DLPack between libkiln and Python: the managed tensors tensor_list_get hands out become torch
tensors (torch.from_dlpack of a "dltensor" capsule, no copy), and anything with __dlpack__
(torch, numpy, JAX, CuPy arrays) is lent to session_load_tensors. torch is imported only here,
and only when a tensor call is made."""

import ctypes
from typing import Any, Dict, List, Tuple

from . import _capi

# The capsule names of the DLPack protocol (unversioned).
_NAME = b"dltensor"

_pythonapi = ctypes.pythonapi
_pythonapi.PyCapsule_New.restype = ctypes.py_object
_pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_pythonapi.PyCapsule_IsValid.restype = ctypes.c_int
_pythonapi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def torch_module():
    """torch, or ImportError saying what needs it."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("kiln's tensor calls (state_dict, parameters, optimizer_state, "
                          "load_state_dict) return torch tensors: install PyTorch "
                          "(pip install torch) in this environment") from e
    return torch


def _release(managed) -> None:
    if managed and managed.contents.deleter:
        managed.contents.deleter(managed)


def to_torch(managed) -> Any:
    """A torch tensor over a managed tensor the caller owns (ownership passes to torch)."""
    torch = torch_module()
    try:
        # No destructor: torch.from_dlpack consumes the capsule (renames it "used_dltensor")
        # and calls the deleter when the tensor dies; on a failure before that, we call it.
        capsule = _pythonapi.PyCapsule_New(ctypes.cast(managed, ctypes.c_void_p), _NAME, None)
        return torch.from_dlpack(capsule)
    except BaseException:
        _release(managed)
        raise


def tensors(lib, handle, kinds: int, check) -> Dict[str, Any]:
    """session_tensors as {name: torch.Tensor}, in the library's order."""
    torch_module()  # before any view is taken: a missing torch leaks nothing
    session_tensors = lib.need("session_tensors")
    lst = ctypes.c_void_p()
    check(lib, session_tensors(handle, kinds, ctypes.byref(lst)))
    out: Dict[str, Any] = {}
    try:
        for i in range(lib.tensor_list_count(lst)):
            name = lib.tensor_list_name(lst, i).decode("utf-8")
            managed = ctypes.POINTER(_capi.DLManagedTensor)()
            check(lib, lib.tensor_list_get(lst, i, ctypes.byref(managed)))
            out[name] = to_torch(managed)
    finally:
        lib.tensor_list_release(lst)
    return out


def names(lib, handle, kinds: int, check) -> List[str]:
    """The names session_tensors gives, without making tensors of them."""
    lst = ctypes.c_void_p()
    check(lib, lib.need("session_tensors")(handle, kinds, ctypes.byref(lst)))
    try:
        return [lib.tensor_list_name(lst, i).decode("utf-8")
                for i in range(lib.tensor_list_count(lst))]
    finally:
        lib.tensor_list_release(lst)


def _borrow(name: str, value: Any) -> Tuple[Any, int]:
    """(capsule, address of its DLManagedTensor) of a tensor lent for one call: the capsule
    keeps ownership (its destructor frees the tensor later), the library only reads it."""
    if hasattr(value, "detach"):
        value = value.detach()  # torch refuses to export a tensor that requires grad
    if not hasattr(value, "__dlpack__"):
        raise TypeError(f"{name!r}: {type(value).__name__} is not a tensor (no __dlpack__)")
    capsule = value.__dlpack__()
    if not _pythonapi.PyCapsule_IsValid(capsule, _NAME):
        raise TypeError(f"{name!r}: __dlpack__ gave no unversioned 'dltensor' capsule")
    return capsule, _pythonapi.PyCapsule_GetPointer(capsule, _NAME)


def load(lib, handle, state_dict, flags: int, check) -> None:
    """session_load_tensors of a {name: tensor} mapping."""
    load_tensors = lib.need("session_load_tensors")
    items = list(state_dict.items())
    keep = []
    n = len(items)
    c_names = (ctypes.c_char_p * max(n, 1))()
    c_tensors = (ctypes.POINTER(_capi.DLManagedTensor) * max(n, 1))()
    for i, (name, value) in enumerate(items):
        if not isinstance(name, str):
            raise TypeError(f"state_dict keys must be strings, not {name!r}")
        capsule, address = _borrow(name, value)
        keep.append(capsule)
        c_names[i] = name.encode("utf-8")
        c_tensors[i] = ctypes.cast(address, ctypes.POINTER(_capi.DLManagedTensor))
    check(lib, load_tensors(handle, c_names, c_tensors, n, flags))
    del keep  # the capsules' destructors free the lent tensors
