"""numpy arrays <-> proto Tensor / ModelParameters.

Model parameters travel as float32, little-endian, row-major
(`np.frombuffer(data, "<f4").reshape(shape)`). `params_to_proto` casts any
floating array to float32 (the models' dtype); integer or object arrays are
refused. `params_from_proto` checks every tensor: dtype FLOAT32, a shape of
at most MAX_DIMS non-negative dims, len(data) == prod(shape) * 4, unique
non-empty names, a total below `max_elements`, and (if given) exactly the
`expected` names and shapes. Any deviation raises WireError.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fedmask_proto.v1 import common_pb2
from wire.errors import WireError

MAX_DIMS = 8
MAX_NAME_CHARS = 256
DEFAULT_MAX_ELEMENTS = 1 << 28  # 1 GiB of float32

_DTYPES: dict[common_pb2.DType.ValueType, np.dtype] = {
    common_pb2.DTYPE_FLOAT32: np.dtype("<f4"),
    common_pb2.DTYPE_FLOAT64: np.dtype("<f8"),
    common_pb2.DTYPE_FLOAT16: np.dtype("<f2"),
    common_pb2.DTYPE_INT32: np.dtype("<i4"),
    common_pb2.DTYPE_INT64: np.dtype("<i8"),
    common_pb2.DTYPE_UINT32: np.dtype("<u4"),
}
_BY_NUMPY = {dt.newbyteorder("=") if dt.byteorder != "|" else dt: code for code, dt in _DTYPES.items()}


def tensor_to_proto(array: np.ndarray) -> common_pb2.Tensor:
    """Any array of a supported dtype, as is (one copy into the bytes)."""
    a = np.asarray(array)
    code = _BY_NUMPY.get(a.dtype.newbyteorder("=")) if a.dtype.byteorder != "|" else None
    if code is None:
        raise WireError(f"dtype {a.dtype} has no proto DType")
    le = a.astype(_DTYPES[code], copy=False)
    return common_pb2.Tensor(dtype=code, shape=list(a.shape), data=np.ascontiguousarray(le).tobytes())


def tensor_from_proto(
    t: common_pb2.Tensor, *, what: str = "Tensor", dtype: common_pb2.DType.ValueType | None = None, max_elements: int = DEFAULT_MAX_ELEMENTS,
    writable: bool = False,
) -> np.ndarray:
    """The array (native byte order). `dtype` (a proto DType) restricts the
    accepted element type. Read-only zero-copy view unless `writable`."""
    if t.dtype not in _DTYPES:
        raise WireError(f"{what}: dtype {t.dtype} is unspecified or unknown")
    if dtype is not None and t.dtype != dtype:
        raise WireError(f"{what}: dtype {common_pb2.DType.Name(t.dtype)}, expected {common_pb2.DType.Name(dtype)}")
    shape = tuple(int(d) for d in t.shape)
    if len(shape) > MAX_DIMS:
        raise WireError(f"{what}: {len(shape)} dimensions (at most {MAX_DIMS})")
    count = math.prod(shape)
    if count > max_elements:
        raise WireError(f"{what}: {count} elements (at most {max_elements})")
    dt = _DTYPES[t.dtype]
    if len(t.data) != count * dt.itemsize:
        raise WireError(f"{what}: {len(t.data)} data bytes, shape {list(shape)} of {dt.name} needs {count * dt.itemsize}")
    a = np.frombuffer(t.data, dtype=dt).reshape(shape)
    native = dt.newbyteorder("=")
    if a.dtype != native or writable:
        a = a.astype(native, copy=True)
    return a


def params_to_proto(params: Mapping[str, np.ndarray]) -> common_pb2.ModelParameters:
    """Global parameters as float32 tensors (names sorted, for stable bytes)."""
    out = common_pb2.ModelParameters()
    for name in sorted(params):
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise WireError(f"parameter name {name!r} must be a non-empty str of at most {MAX_NAME_CHARS} chars")
        a = np.asarray(params[name])
        if not np.issubdtype(a.dtype, np.floating):
            raise WireError(f"parameter {name!r} has dtype {a.dtype}, not floating point")
        f32 = np.ascontiguousarray(a, dtype="<f4")
        out.tensors.add(name=name, tensor=common_pb2.Tensor(dtype=common_pb2.DTYPE_FLOAT32, shape=list(a.shape), data=f32.tobytes()))
    return out


def params_from_proto(
    p: common_pb2.ModelParameters,
    *,
    expected: Mapping[str, tuple[int, ...]] | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    writable: bool = False,
) -> dict[str, np.ndarray]:
    """{name: float32 array}; see the module doc for the checks."""
    out: dict[str, np.ndarray] = {}
    total = 0
    for nt in p.tensors:
        name = nt.name
        if not name or len(name) > MAX_NAME_CHARS:
            raise WireError(f"ModelParameters: tensor name {name[:40]!r} is empty or too long")
        if name in out:
            raise WireError(f"ModelParameters: tensor {name!r} appears twice")
        if not nt.HasField("tensor"):
            raise WireError(f"ModelParameters: tensor {name!r} has no data")
        a = tensor_from_proto(
            nt.tensor, what=f"ModelParameters[{name!r}]", dtype=common_pb2.DTYPE_FLOAT32,
            max_elements=max_elements - total, writable=writable,
        )
        total += a.size
        out[name] = a
    if expected is not None:
        want = {k: tuple(v) for k, v in expected.items()}
        if set(out) != set(want):
            missing, extra = sorted(set(want) - set(out)), sorted(set(out) - set(want))
            raise WireError(f"ModelParameters: missing {missing}, unexpected {extra}")
        for name, shape in want.items():
            if out[name].shape != shape:
                raise WireError(f"ModelParameters[{name!r}]: shape {out[name].shape}, expected {shape}")
    return out
