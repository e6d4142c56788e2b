"""The parameter-blob format of stored model versions.

A blob is an .npz archive (numpy's zip of .npy arrays, readable with
np.load(..., allow_pickle=False)) with one array per named tensor. Floating
arrays are stored as little-endian float32; other dtypes as they are.
Entries are written in sorted name order with fixed zip timestamps, so the
same parameters always give the same bytes and the same sha256.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

_FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def pack_parameters(parameters: Mapping[str, npt.ArrayLike]) -> bytes:
    """Serialize named arrays (float -> float32) into deterministic npz bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(parameters):
            if not name or "/" in name:
                raise ValueError(f"invalid parameter name {name!r}")
            array = np.asarray(parameters[name])
            if np.issubdtype(array.dtype, np.floating):
                array = array.astype("<f4", copy=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_FIXED_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w") as member:
                np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def unpack_parameters(blob: bytes) -> dict[str, np.ndarray]:
    """Inverse of pack_parameters (never unpickles)."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}
