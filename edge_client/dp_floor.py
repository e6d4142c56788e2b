"""The least differential privacy this client's devices accept (pure).

The RoundTask states the DP mechanism, the clip tau and the noise each
device adds; a malicious coordinator can state DP off, or a multiplier of
1 with a per-device noise far below it, and then difference two rounds'
sums to read one device's update. Each device therefore holds its own floor,
set by whoever configures the client (`fedmask client --min-dp MECHANISM
--min-noise-multiplier Z [--max-dp-clip C]`, or `--no-dp-floor`), and
withdraws from a task below it:

- mechanism: none < distributed < local (local: each device adds the whole
  noise; distributed: each adds 1/n of its variance, so the secure sum of the
  n devices carries it). Default: distributed;
- noise: the multiplier the device's noise actually gives, computed from
  what the device will add, not from the multiplier the task claims; both
  it and the claimed multiplier must reach the floor. Default 1.0.
  * discrete Gaussian (D88): the device rebuilds the mechanism from the task
    (`wire.dp_task.task_mechanism`: its own bound B from the clip, scale
    and length, the task's exact sigma^2) and takes the zCDP rho of one
    release (`dpmech.mechanism.privacy_rho`) with n = the cohort's shares
    (distributed: the sum of its instance's n devices, all assumed counted)
    or its own share alone (local); the multiplier is 1 / sqrt(2 rho), the
    Gaussian's with the same Renyi curve, so it counts the sensitivity
    after rotation and rounding and the bound's own slack;
  * float Gaussian: std / clip (local) or std * sqrt(n) / clip
    (distributed, n = cohort size), from the task's per-device std;
- clip: the noise scales with the clip, so the clip does not change epsilon;
  a deployment that knows its update scale may cap it (`max_clip`, default
  none), which bounds how far one round can move on this device's update.

The default (distributed, z >= 1) is what `fedmask demo` runs; DP off is
refused unless the client is started with `--no-dp-floor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpmech.calibrate import noise_multiplier_of
from dpmech.mechanism import MechanismConfig, privacy_rho
from fedmask_proto.v1 import session_pb2

MECHANISMS = ("none", "distributed", "local")  # weakest first
_MODE_NAMES = {
    session_pb2.DP_MODE_NONE: "none",
    session_pb2.DP_MODE_DISTRIBUTED: "distributed",
    session_pb2.DP_MODE_LOCAL: "local",
}
_TOLERANCE = 1e-9  # float rounding between the coordinator's std and the device's check


@dataclass(frozen=True)
class DpFloor:
    min_mechanism: str = "distributed"
    min_noise_multiplier: float = 1.0
    max_clip: float | None = None

    def __post_init__(self) -> None:
        if self.min_mechanism not in MECHANISMS:
            raise ValueError(f"--min-dp must be one of {', '.join(MECHANISMS)}, got {self.min_mechanism!r}")
        if not (math.isfinite(self.min_noise_multiplier) and self.min_noise_multiplier >= 0):
            raise ValueError(f"--min-noise-multiplier must be >= 0, got {self.min_noise_multiplier}")
        if self.max_clip is not None and not (math.isfinite(self.max_clip) and self.max_clip > 0):
            raise ValueError(f"--max-dp-clip must be > 0, got {self.max_clip}")

    @classmethod
    def off(cls) -> DpFloor:
        """No floor (`--no-dp-floor`): the devices accept DP off. For tests and
        benchmarks of models without DP; never for real users' data."""
        return cls(min_mechanism="none", min_noise_multiplier=0.0)

    @property
    def is_off(self) -> bool:
        return self.min_mechanism == "none" and self.min_noise_multiplier == 0 and self.max_clip is None

    def refusal(self, dp: session_pb2.DpSettings, cohort_size: int,
                mechanism: MechanismConfig | None = None) -> str | None:
        """Why this device will not train a task with these DP settings, or
        None. `mechanism`: the discrete Gaussian the task was checked to
        describe (`RoundTaskView.mechanism`); None: the float Gaussian."""
        mode = _MODE_NAMES.get(dp.mode, "none")
        if MECHANISMS.index(mode) < MECHANISMS.index(self.min_mechanism):
            return f"DP mechanism {mode} is below this device's minimum ({self.min_mechanism})"
        if mode == "none":
            return None
        clip, std = float(dp.clip_norm), float(dp.noise_stddev)
        if self.max_clip is not None and clip > self.max_clip:
            return f"DP clip {clip:g} is above this device's maximum of {self.max_clip:g}"
        if mechanism is not None:
            applied = noise_multiplier_of(privacy_rho(mechanism, cohort_size if mode == "distributed" else 1))
        else:
            applied = std / clip * (math.sqrt(cohort_size) if mode == "distributed" else 1.0)
        least = self.min_noise_multiplier * (1.0 - _TOLERANCE)
        if applied < least or float(dp.noise_multiplier) < least:
            return (f"DP noise multiplier {min(applied, float(dp.noise_multiplier)):.4g} (from the noise this device "
                    f"would add) is below this device's minimum of {self.min_noise_multiplier:g}")
        return None


__all__ = ["MECHANISMS", "DpFloor"]
