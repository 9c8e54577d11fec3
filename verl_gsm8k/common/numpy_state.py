"""numpy arrays in a checkpoint (the RNG states of verl's extra_state shards), rebuilt only as
numbers: the stand-ins every checkpoint load of common/checkpoint_files.py uses for numpy's names.

numpy's own dtype and ndarray take any pickled state, an object dtype included, whose bytes numpy
then reads as object pointers: a crafted file could hand the loading process forged objects. So
no pickle reaches numpy's classes: ``CheckedDtype`` and ``CheckedArray`` take the state a numeric
array pickles (a number type code, its byte order, the shape and raw bytes) and build the array
themselves; anything else is refused. Standard library and numpy only.
"""

from __future__ import annotations

import pickle
from typing import Any


class _NumpyName:
    """``numpy.ndarray`` as a pickle names it (the class ``_reconstruct`` builds): never called."""

    def __init__(self, *_args: Any) -> None:
        raise pickle.UnpicklingError("numpy.ndarray is only named by a checkpoint, not called")


class CheckedDtype:
    """``numpy.dtype(spec, align, copy)`` and its state: a numeric dtype, or refused."""

    def __init__(self, spec: Any, _align: Any = False, _copy: Any = False) -> None:
        import numpy as np

        if not isinstance(spec, str) or len(spec) > 8:
            raise pickle.UnpicklingError(f"numpy dtype {spec!r}: not a numeric type code")
        self.dtype = np.dtype(spec)
        if self.dtype.kind not in "biufc" or self.dtype.subdtype is not None:
            raise pickle.UnpicklingError(f"numpy dtype {spec!r}: not a number type")

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 8 and state[0] == 3
                and state[1] in ("<", ">", "|", "=") and state[2:5] == (None, None, None)
                and state[7] == 0):  # fmt: skip
            raise pickle.UnpicklingError("numpy dtype state: not a plain number type's")
        if state[1] in "<>":
            self.dtype = self.dtype.newbyteorder(state[1])


class CheckedArray:
    """``numpy._core.multiarray._reconstruct(ndarray, shape, code)`` and its state: a numeric
    array built from its bytes (``array``), or refused."""

    def __init__(self, cls: Any = None, *_args: Any) -> None:
        if not isinstance(cls, type) or not issubclass(cls, _NumpyName):
            raise pickle.UnpicklingError("numpy _reconstruct of another class than ndarray")
        self.array: Any = None

    def __setstate__(self, state: Any) -> None:
        import numpy as np

        ok = isinstance(state, tuple) and len(state) == 5 and isinstance(state[2], CheckedDtype)
        if not ok or not isinstance(state[4], bytes) or not isinstance(state[1], tuple):
            raise pickle.UnpicklingError("numpy array state: not a numeric array's")
        shape, dtype, fortran, raw = state[1], state[2].dtype, bool(state[3]), state[4]
        if not all(isinstance(n, int) and n >= 0 for n in shape):
            raise pickle.UnpicklingError(f"numpy array shape {shape!r}")
        flat = np.frombuffer(raw, dtype=dtype)  # raises unless the bytes fill whole items
        self.array = flat.reshape(shape, order="F" if fortran else "C").copy()


NUMPY: dict[str, Any] = {
    "numpy.dtype": CheckedDtype,
    "numpy.ndarray": _NumpyName,
    "numpy._core.multiarray._reconstruct": CheckedArray,
    "numpy.core.multiarray._reconstruct": CheckedArray,
}


def plain_arrays(value: Any) -> Any:
    """``value`` with every ``CheckedArray`` replaced by its numpy array (dicts, lists and plain
    tuples followed, the rest as they are)."""
    if isinstance(value, CheckedArray):
        return value.array
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = plain_arrays(item)
        return value
    if isinstance(value, list):
        value[:] = [plain_arrays(item) for item in value]
        return value
    if type(value) is tuple:
        return tuple(plain_arrays(item) for item in value)
    return value
