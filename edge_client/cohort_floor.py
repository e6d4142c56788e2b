"""What a device insists on before it joins a secure round (pure).

The coordinator chooses the cohort and the Shamir threshold; a malicious or
misconfigured one could ask a device into a cohort of two (the sum then
reveals the other device's input to each) or into a threshold so low that
few colluders reconstruct a device's masks. Each device therefore enforces
its own floor on the RoundTask it receives, and withdraws from a round
below it (`fedmask client --min-cohort N --min-threshold F`):

- cohort: at least `min_cohort` devices (default 3) in the secure-
  aggregation instance the device is asked into. In a round run in groups
  (D87) that is the device's *group*, whose sum the server learns, not the
  whole cohort: the config the device is given describes exactly its
  instance (`config.num_clients` is its group's size). Over gRPC the
  coordinator does not form groups yet, so a device's group is the cohort
  and the RoundTask is unchanged;
- threshold: t > `min_threshold` x the set the shares are spread over
  (the device and its neighbours in its group's graph: the whole group on a
  complete graph), default 0.5, i.e. at least a strict majority. Raise it
  (e.g. 0.66 for the active-adversary mode) where the federation's
  settings allow it.

The floor counts devices, not people: a malicious coordinator may fill a
group with devices it controls around one honest device. The floor makes
that cost at least `min_cohort - 1` such devices (D34, D87).
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
        """Why this device will not join the secure-aggregation instance
        `config` describes (its group, see the module doc), or None."""
        n = config.num_clients
        if n < self.min_cohort:
            return (f"cohort of {n} (the secure sum this device is asked into: its group) is below this "
                    f"device's minimum of {self.min_cohort}")
        closure = config.degree + 1
        if config.threshold <= self.min_threshold * closure:
            return (f"threshold {config.threshold} of the {closure} devices holding a device's shares is not above "
                    f"this device's minimum fraction {self.min_threshold}")
        return None


__all__ = ["CohortFloor"]
