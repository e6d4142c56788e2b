"""What a device insists on before it joins a secure round (pure).

The coordinator chooses the cohort and the Shamir threshold; a malicious or
misconfigured one could ask a device into a cohort of two (the sum then
reveals the other device's input to each) or into a threshold so low that
few colluders reconstruct a device's masks. Each device therefore enforces
its own floor on the RoundTask it receives, and withdraws from a round
below it (`fedmask client --min-cohort N --min-threshold F`):

- cohort: at least `min_cohort` devices (default 3);
- threshold: t > `min_threshold` x the group the shares are spread over
  (the device and its neighbours: the whole cohort on a complete graph),
  default 0.5, i.e. at least a strict majority. Raise it (e.g. 0.66 for the
  active-adversary mode) where the federation's settings allow it.
"""

from __future__ import annotations

from dataclasses import dataclass

from secagg.config import SecAggConfig


@dataclass(frozen=True)
class CohortFloor:
    min_cohort: int = 3
    min_threshold: float = 0.5

    def __post_init__(self) -> None:
        if self.min_cohort < 2:
            raise ValueError(f"--min-cohort must be >= 2, got {self.min_cohort}")
        if not 0.5 <= self.min_threshold < 1.0:
            raise ValueError(f"--min-threshold must be in [0.5, 1), got {self.min_threshold}")

    def refusal(self, config: SecAggConfig) -> str | None:
        """Why this device will not join a round configured so, or None."""
        if config.num_clients < self.min_cohort:
            return f"cohort of {config.num_clients} is below this device's minimum of {self.min_cohort}"
        group = config.degree + 1
        if config.threshold <= self.min_threshold * group:
            return (f"threshold {config.threshold} of a group of {group} is not above this device's minimum "
                    f"fraction {self.min_threshold}")
        return None


__all__ = ["CohortFloor"]
