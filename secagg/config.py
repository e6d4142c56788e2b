"""Frozen settings of one secure-aggregation cohort.

A `SecAggConfig` holds only resolved, concrete values (n, L, session id, the
graph degree k, the threshold t, the encoding, the adversary mode); the
policy that picks them lives in `SecAggConfig.create`. The round index is not
part of the config: one config serves every round of a session with the same
cohort size, and each state takes `round_idx` explicitly.

Device ids are 0..n-1 (the coordinator's per-round cohort index).

A config describes one SecAgg(+) *instance*: the whole cohort, or one group
of a round run in groups (`secagg.groups`, D87). A group's encoding is the
round's, sized for the whole cohort (`create(encoding_clients=...)`, i.e.
`FixedPointEncoding.for_group`), so that the groups' sums add without
overflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from secagg.encoding import FixedPointEncoding
from secagg.errors import SecAggConfigError
from secagg.graph import CommunicationGraph, build_graph, choose_parameters, majority_threshold
from secagg.keys import graph_seed

MAX_SESSION_ID_BYTES = 255
MAX_VECTOR_LENGTH = 1 << 28

Neighbors = int | Literal["all", "auto"]


@dataclass(frozen=True, slots=True)
class SecAggConfig:
    """Resolved settings; build with `SecAggConfig.create`."""

    num_clients: int
    vector_length: int
    session_id: bytes
    degree: int  # k: n - 1 for the complete graph, else an even Harary degree
    threshold: int  # t of every closure N[v] (t of n for the complete graph)
    encoding: FixedPointEncoding
    active_adversary: bool = False
    # Removable noise (Dordis's way): each device secret-shares n - t seeds of
    # noise components beside b_v and s_v^SK; at unmasking the survivors'
    # components k > n - |U3| are rebuilt and taken out of the sum.
    removable_noise: bool = False

    def __post_init__(self) -> None:
        n = self.num_clients
        if not (isinstance(n, int) and n >= 2):
            raise SecAggConfigError(f"num_clients must be an int >= 2, got {n!r}")
        if not (isinstance(self.vector_length, int) and 1 <= self.vector_length <= MAX_VECTOR_LENGTH):
            raise SecAggConfigError(f"vector_length must be in 1..{MAX_VECTOR_LENGTH}, got {self.vector_length!r}")
        if not (isinstance(self.session_id, bytes) and 1 <= len(self.session_id) <= MAX_SESSION_ID_BYTES):
            raise SecAggConfigError("session_id must be 1..255 bytes")
        k = self.degree
        if not isinstance(k, int) or not (k == n - 1 or (k % 2 == 0 and 2 <= k <= n - 2)):
            raise SecAggConfigError(f"degree must be n-1 (complete) or even in 2..n-2, got {k!r} for n={n}")
        t = self.threshold
        if not (isinstance(t, int) and majority_threshold(k) <= t <= k + 1):
            raise SecAggConfigError(
                f"threshold must be in {majority_threshold(k)}..{k + 1} (a strict majority of each "
                f"closure of {k + 1} devices), got {t!r}"
            )
        if not isinstance(self.encoding, FixedPointEncoding) or self.encoding.num_clients != n:
            raise SecAggConfigError("encoding must be a FixedPointEncoding for this cohort size")
        if not isinstance(self.active_adversary, bool):
            raise SecAggConfigError("active_adversary must be a bool")
        if not isinstance(self.removable_noise, bool):
            raise SecAggConfigError("removable_noise must be a bool")
        if self.removable_noise and k != n - 1:
            # a neighbourhood's survivors are not the sum's: n - |U3| would not say how many shares it lost
            raise SecAggConfigError("removable_noise needs the complete graph (one threshold for the whole sum)")

    @classmethod
    def create(
        cls,
        *,
        num_clients: int,
        vector_length: int,
        session_id: bytes,
        clip: float = 1.0,
        neighbors: Neighbors = "all",
        threshold: int | None = None,
        modulus_bits: int | None = None,
        precision: float | None = None,
        expected_dropout: float = 0.1,
        corrupt_fraction: float = 0.05,
        correctness_bits: int = 20,
        security_bits: int = 40,
        active_adversary: bool = False,
        encoding_clients: int | None = None,
        removable_noise: bool = False,
    ) -> SecAggConfig:
        """Resolve the policy into concrete settings.

        neighbors:
          "all"  complete graph (Bonawitz); default threshold floor(n/2) + 1,
                 or floor(2n/3) + 1 in active-adversary mode.
          "auto" SecAgg+: (k, t) from `graph.choose_parameters(n,
                 dropout_rate=expected_dropout, corrupt_fraction=...)`, which
                 may also answer with the complete graph for small n.
          K      Harary graph of even degree K (K >= n-1 means complete);
                 default threshold = majority of the closure, floor((K+1)/2)+1.
        An explicit `threshold` always wins (and is validated).
        Encoding: see `FixedPointEncoding.for_cohort` (clip, modulus_bits,
        precision), sized for `encoding_clients` devices (default: this
        instance's n; a group of a round in groups passes the whole cohort's
        size and gets the cohort's encoding `for_group(n)`, D87).
        """
        n = num_clients
        if not (isinstance(n, int) and n >= 2):
            raise SecAggConfigError(f"num_clients must be an int >= 2, got {n!r}")
        auto_t: int | None = None
        if neighbors == "all":
            k = n - 1
        elif neighbors == "auto":
            k, auto_t = choose_parameters(
                n,
                dropout_rate=expected_dropout,
                corrupt_fraction=corrupt_fraction,
                correctness_bits=correctness_bits,
                security_bits=security_bits,
            )
        elif isinstance(neighbors, int) and not isinstance(neighbors, bool):
            k = min(neighbors, n - 1)
        else:
            raise SecAggConfigError(f"neighbors must be 'all', 'auto' or an int, got {neighbors!r}")
        if threshold is None:
            if auto_t is not None:
                threshold = auto_t
            elif k == n - 1:
                threshold = (2 * n) // 3 + 1 if active_adversary else n // 2 + 1
            else:
                threshold = majority_threshold(k)
        if encoding_clients is None:
            encoding_clients = n
        elif isinstance(encoding_clients, bool) or not (isinstance(encoding_clients, int) and encoding_clients >= n):
            raise SecAggConfigError(f"encoding_clients must be an int >= num_clients ({n}), got {encoding_clients!r}")
        encoding = FixedPointEncoding.for_cohort(
            encoding_clients, clip=clip, modulus_bits=modulus_bits, precision=precision
        ).for_group(n)
        return cls(n, vector_length, session_id, k, threshold, encoding, active_adversary, removable_noise)

    @property
    def removable_components(self) -> int:
        """m = n - t seeded noise components per device (0 without removable noise)."""
        return self.num_clients - self.threshold if self.removable_noise else 0

    def removed_components(self, survivors: int) -> range:
        """The components k (1..m) of each survivor taken out of a sum of
        `survivors` devices: those above j = n - survivors. Each survivor then
        keeps components 0..j."""
        m = self.removable_components
        return range(min(m, self.num_clients - survivors) + 1, m + 1)

    @property
    def is_complete_graph(self) -> bool:
        return self.degree == self.num_clients - 1

    def graph(self, round_idx: int) -> CommunicationGraph:
        """The round's graph (the relabeling changes every round)."""
        if self.is_complete_graph:
            return build_graph(self.num_clients, self.degree, b"")
        return build_graph(self.num_clients, self.degree, graph_seed(self.session_id, round_idx))

    def describe(self) -> str:
        kind = "complete" if self.is_complete_graph else f"Harary k={self.degree}"
        return f"n={self.num_clients} L={self.vector_length} graph={kind} t={self.threshold}"
