"""Debug-only round checks (settings.debug.record_sums; see docs).

With the flag on, the coordinator adds to each committed round's metrics:

    debug.counted             number of devices in the aggregate
    debug.encoded_checksum    encoded_checksum(encoded sum), exact
    debug.unmasked_checksum   removable noise (D110) only: the same of the
                              unmasked sum before the surplus was removed,
                              which is the one the devices' inputs add to
    debug.sum_l1 / sum_l2     norms of the decoded sum
    debug.sum[i]              the first `sum_coordinates` decoded coordinates

A test or benchmark that logs each device's *encoded* input (uint32, as
given to secagg) checks the aggregate bit for bit:

    total = np.sum(encoded_inputs_of_counted_devices, axis=0, dtype=np.uint64).astype(np.uint32)
    assert encoded_checksum(total) == record.metrics["debug.encoded_checksum"]

(the recorded sum is reduced mod 2^w, the round's modulus; an honest sum is
below 2^w, so the two agree bit for bit) and the float sum to within the
quantization step (n * step / 2 per coordinate). The sum is what the secagg server learns by design; the flag
only persists it, so it is refused off loopback.
"""

from __future__ import annotations

import numpy as np

CHECKSUM_BITS = 52  # exactly representable as a float64 metric


def encoded_checksum(encoded_sum: np.ndarray) -> float:
    """sum_i (i + 1) * e_i  mod 2^52, over the uint32 words e of a sum."""
    e = np.asarray(encoded_sum, dtype=np.uint32).astype(np.uint64)
    weights = np.arange(1, e.shape[0] + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        total = int(np.sum(e * weights, dtype=np.uint64))
    return float(total % (1 << CHECKSUM_BITS))


def debug_metrics(encoded_sum: np.ndarray, decoded_sum: np.ndarray, counted: int, coordinates: int,
                  unmasked_sum: np.ndarray | None = None) -> dict[str, float]:
    out = {
        "debug.counted": float(counted),
        "debug.encoded_checksum": encoded_checksum(encoded_sum),
        "debug.sum_l1": float(np.abs(decoded_sum).sum()),
        "debug.sum_l2": float(np.linalg.norm(decoded_sum)),
    }
    if unmasked_sum is not None:
        out["debug.unmasked_checksum"] = encoded_checksum(unmasked_sum)
    for i in range(min(coordinates, decoded_sum.shape[0])):
        out[f"debug.sum[{i}]"] = float(decoded_sum[i])
    return out
