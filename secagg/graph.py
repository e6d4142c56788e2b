"""Communication graphs: the complete graph (Bonawitz et al.) and the randomly
relabeled Harary graph of SecAgg+ (Bell et al., CCS 2020), with the choice of
its degree k and per-neighbourhood threshold t.

Vocabulary: `neighbors(v)` excludes v; the *closure* N[v] = N(v) + {v} is the
set of holders of v's Shamir shares (a device keeps one share of its own
secrets). A threshold t is "t of the closure": a secret of v is reconstructed
from t shares held by members of N[v]. For the complete graph N[v] is the
whole cohort and this is Bonawitz's t-of-n.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secagg.errors import SecAggConfigError


class CommunicationGraph:
    """An undirected k-regular graph on device ids 0..n-1. Immutable."""

    __slots__ = ("num_nodes", "degree", "_position", "_order", "_cache")

    def __init__(self, num_nodes: int, degree: int, order: np.ndarray | None) -> None:
        self.num_nodes = num_nodes
        self.degree = degree
        self._order = order  # order[ring position] = device id (None: complete graph)
        self._position = None if order is None else np.argsort(order)
        self._cache: dict[int, frozenset[int]] = {}

    @property
    def is_complete(self) -> bool:
        return self._order is None

    def neighbors(self, v: int) -> frozenset[int]:
        """N(v): the devices v shares masks and secrets with (v excluded)."""
        hit = self._cache.get(v)
        if hit is not None:
            return hit
        if not 0 <= v < self.num_nodes:
            raise ValueError(f"device id {v} outside 0..{self.num_nodes - 1}")
        if self._order is None or self._position is None:  # both None together: complete graph
            out = frozenset(range(v)) | frozenset(range(v + 1, self.num_nodes))
        else:
            n = self.num_nodes
            p = int(self._position[v])
            half = self.degree // 2
            out = frozenset(
                int(self._order[(p + j) % n]) for j in range(-half, half + 1) if j != 0
            )
        self._cache[v] = out
        return out

    def closure(self, v: int) -> frozenset[int]:
        """N[v] = N(v) + {v}."""
        return self.neighbors(v) | {v}


def complete_graph(num_nodes: int) -> CommunicationGraph:
    return CommunicationGraph(num_nodes, num_nodes - 1, None)


def random_permutation(num_nodes: int, seed: bytes) -> np.ndarray:
    """A permutation of 0..n-1 from a 32-byte seed: argsort of n uint64 words
    of AES-256-CTR(seed) keystream (ties, probability < n^2 / 2^65, fall back
    to index order: still a permutation, and deterministic)."""
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    words = np.frombuffer(enc.update(bytes(8 * num_nodes)), dtype="<u8")
    return np.argsort(words, kind="stable")


@functools.lru_cache(maxsize=16)
def harary_graph(num_nodes: int, degree: int, seed: bytes) -> CommunicationGraph:
    """H(n, k) for even k: on a ring, each node is joined to the k/2 nearest
    on each side; ring positions are a random relabeling drawn from `seed`
    (keys.graph_seed: derived from session and round, known to everyone)."""
    if degree % 2 or not 2 <= degree <= num_nodes - 2:
        raise SecAggConfigError(f"a Harary graph needs an even degree in 2..n-2, got k={degree}, n={num_nodes}")
    return CommunicationGraph(num_nodes, degree, random_permutation(num_nodes, seed))


def build_graph(num_nodes: int, degree: int, seed: bytes) -> CommunicationGraph:
    """The complete graph when degree == n - 1, else the relabeled Harary graph."""
    if degree == num_nodes - 1:
        return complete_graph(num_nodes)
    return harary_graph(num_nodes, degree, seed)


def majority_threshold(degree: int) -> int:
    """The smallest t with 2t > k + 1: more than half of every closure."""
    return (degree + 1) // 2 + 1


# ---------------------------------------------------------------------------
# Choosing k and t (SecAgg+ "auto")
# ---------------------------------------------------------------------------


def _probability(value: float, name: str) -> Fraction:
    if not 0 <= value < 1:
        raise SecAggConfigError(f"{name} must be in [0, 1), got {value!r}")
    return Fraction(repr(float(value)))  # the decimal the user wrote, exactly


def binomial_tail_at_least(k: int, p: Fraction, t: int) -> Fraction:
    """P[Bin(k, p) >= t], exactly (math.comb and rationals)."""
    q = 1 - p
    return sum(
        (Fraction(math.comb(k, i)) * p**i * q ** (k - i) for i in range(max(t, 0), k + 1)),
        Fraction(0),
    )


def parameters_hold(
    num_nodes: int,
    degree: int,
    threshold: int,
    *,
    dropout_rate: float,
    corrupt_fraction: float,
    correctness_bits: int = 20,
    security_bits: int = 40,
) -> bool:
    """Whether (k, t) meets the conditions of `choose_parameters` (see there)."""
    delta = _probability(dropout_rate, "dropout_rate")
    gamma = _probability(corrupt_fraction, "corrupt_fraction")
    return _holds(num_nodes, degree, threshold, delta, gamma, correctness_bits, security_bits)


def _holds(n: int, k: int, t: int, delta: Fraction, gamma: Fraction, eta: int, sigma: int) -> bool:
    eps_c = Fraction(1, 2**eta)
    eps_s = Fraction(1, 2**sigma)
    if not (2 * t > k + 1 and t <= k + 1):  # (3)
        return False
    if k < n - 1 and math.comb(n, 2) * (delta + gamma) ** k > eps_s:  # (4)
        return False
    if n * binomial_tail_at_least(k, gamma, t) > eps_s:  # (2)
        return False
    return n * (1 - binomial_tail_at_least(k, 1 - delta, t)) <= eps_c  # (1)


@functools.lru_cache(maxsize=256)
def choose_parameters(
    num_nodes: int,
    *,
    dropout_rate: float,
    corrupt_fraction: float,
    correctness_bits: int = 20,
    security_bits: int = 40,
) -> tuple[int, int]:
    """The smallest degree k (then the smallest threshold t) that meets, with
    n devices, each dropping independently with probability delta (dropout_rate)
    and each corrupt (colluding with the server) with probability gamma:

    (1) correctness  n * P[Bin(k, 1 - delta) < t] <= 2^-eta
        every device keeps t live holders of its shares among its k neighbours
        (its own share is not counted: a device that drops at unmasking cannot
        answer);
    (2) secrecy      n * P[Bin(k, gamma) >= t] <= 2^-sigma
        no device has t corrupt neighbours (who could pool its s-key shares);
    (3) majority     2t > k + 1
        two disjoint sets of honest holders cannot both reach t, so a server
        lying "alive" to some and "dropped" to others never gets both b_u and
        s_u^SK of one device;
    (4) connectivity C(n, 2) * (delta + gamma)^k <= 2^-sigma   (Harary only)
        H(n, k) falls apart only if two disjoint runs of k/2 consecutive ring
        positions are all dropped or corrupt; the random relabeling makes each
        position such with probability <= delta + gamma independently, so the
        honest survivors stay one component and the server learns only their
        total.

    eta = correctness_bits (default 20), sigma = security_bits (default 40).
    This follows the structure of Bell et al., CCS 2020, Sec. 4 (random
    k-regular Harary graph; per-neighbourhood thresholds; union bounds over
    devices); the neighbourhood counts are hypergeometric and bounded here by
    binomial tails (Hoeffding), computed exactly with math.comb and rationals.
    If no k < n - 1 works, the complete graph (k = n - 1, no condition (4)) is
    tried; if that fails too, SecAggConfigError.

    Examples: n=1000, delta=gamma=0.05 -> (30, 18); n=1000, delta=0.1,
    gamma=0.05 -> (38, 20); n=100, delta=0.1, gamma=0.05 -> (34, 18).
    """
    if num_nodes < 2:
        raise SecAggConfigError("a cohort needs at least 2 devices")
    delta = _probability(dropout_rate, "dropout_rate")
    gamma = _probability(corrupt_fraction, "corrupt_fraction")
    eta, sigma = correctness_bits, security_bits
    candidates = list(range(2, num_nodes - 1, 2)) + [num_nodes - 1]
    for k in candidates:
        if k < num_nodes - 1 and math.comb(num_nodes, 2) * (delta + gamma) ** k > Fraction(1, 2**sigma):
            continue
        for t in range(majority_threshold(k), k + 2):
            if num_nodes * binomial_tail_at_least(k, gamma, t) > Fraction(1, 2**sigma):
                continue
            # Larger t only makes (1) worse: stop at the first t meeting (2).
            if num_nodes * (1 - binomial_tail_at_least(k, 1 - delta, t)) <= Fraction(1, 2**eta):
                return k, t
            break
    raise SecAggConfigError(
        f"no (degree, threshold) meets the failure targets for n={num_nodes}, "
        f"dropout_rate={dropout_rate}, corrupt_fraction={corrupt_fraction}; pass them explicitly"
    )
