"""Keyed (counter-based) randomness for everything a device draws while training.

Every per-device random number of local training is a pure function of

    (seed, purpose, round, extra words..., user id, index[, attempt])

computed by hashing, never by advancing a shared generator. So a device draws
exactly the same negatives, mini-batch orders and initial private parameters
whether it trains alone (an edge client hosting a few devices), in a cohort of
thirty or with all 943 users of a simulation, and whatever its position in the
batch: `fedmask simulate` and a real federation over gRPC reach the same model
(tests/integration/test_simulate_equivalence.py).

The hash is the `lowbias32` integer finaliser (C. Wellons' hash prospector):
a bijection on 32-bit words with very low avalanche bias. It runs vectorised on
int64 torch tensors holding values in [0, 2^32): every multiplication is done
so that no intermediate leaves int64 (the second constant is split as
2^31 + c': x * 2^31 mod 2^32 = (x & 1) << 31 and x * c' < 2^59), every
shift is a right shift of a non-negative value, and each step is masked back
to 32 bits, so there is no overflow and no signed-shift pitfall, on CPU and
CUDA alike. Words are chained as h <- mix(h ^ mix(word)); the scalar words of
a stream (seed, purpose, round, epoch...) are chained once in Python
(`KeyedStream`), the per-element words (user, index) on tensors; redraw
number a > 0 of an element is mix(key ^ mix(a + c)) (draw 0 is the key).

Outputs:
- `bits`: uniform 32-bit words;
- `integers(n)`: floor(bits * n / 2^32), uniform on [0, n) up to a relative
  bias below n / 2^32 (4e-7 for MovieLens-100K's 1682 items), n < 2^31;
- `uniform`: (bits + 0.5) / 2^32 in float64, in the open interval (0, 1);
- `normal`: Box-Muller on two uniforms of sub-streams 1 and 2 (|z| <= 6.8).

What stays on other generators: the server's initial global parameters (one
`torch.Generator` seeded with the seed, on the coordinator and in `simulate`
alike, `global_init_generator`), the simulation's cohort sampling, and all
noise that protects privacy: DP noise and the stochastic rounding of the
secagg encoding come from os.urandom on an edge client (a noise derived from
a known seed could be subtracted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import torch

M32 = 0xFFFFFFFF
_C1 = 0x7FEB352D  # < 2^31: x * _C1 < 2^63 for x < 2^32
_C2 = 0x846CA68B  # = 2^31 + _C2_LOW
_C2_LOW = _C2 - (1 << 31)  # < 2^27
_TWO32 = float(1 << 32)
_CHUNK_ELEMENTS = 1 << 22


class Purpose(IntEnum):
    """What a stream is for (the first word after the seed)."""

    INIT = 1  # private-state initialisation (extra word: which tensor)
    NEGATIVES = 2  # training negatives (extra word: epoch)
    SHUFFLE = 3  # mini-batch order (extra word: epoch)


# ------------------------------------------------------------------ the mixer


def mix32_int(x: int) -> int:
    """lowbias32 of a Python int (reduced mod 2^32 first)."""
    x &= M32
    x ^= x >> 16
    x = (x * _C1) & M32
    x ^= x >> 15
    x = (x * _C2) & M32
    x ^= x >> 16
    return x


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on an int64 tensor of values in [0, 2^32) (a new tensor)."""
    x = x ^ (x >> 16)
    x.mul_(_C1).bitwise_and_(M32)
    x ^= x >> 15
    lo = x.bitwise_and(1).bitwise_left_shift_(31)  # _mul_c2, in place
    x.mul_(_C2_LOW).add_(lo).bitwise_and_(M32)
    x ^= x >> 16
    return x


def _chain(h: int, *words: int) -> int:
    for w in words:
        h = mix32_int(h ^ mix32_int(w))
    return h


def _seed_words(seed: int) -> tuple[int, int]:
    s = int(seed) & ((1 << 64) - 1)
    return s & M32, s >> 32


# ------------------------------------------------------------------ streams


@dataclass(frozen=True)
class KeyedStream:
    """A family of random numbers named by its scalar words; the numbers
    themselves are addressed by (user, index[, attempt]) tensors."""

    key: int  # 32-bit hash of the scalar words

    @classmethod
    def of(cls, seed: int, *words: int) -> KeyedStream:
        lo, hi = _seed_words(seed)
        return cls(_chain(0x6A09E667, lo, hi, *(int(w) for w in words)))

    def child(self, *words: int) -> KeyedStream:
        return KeyedStream(_chain(self.key, *(int(w) for w in words)))

    # -------------------------------------------------------------- per-element hashes
    def user_keys(self, users: torch.Tensor) -> torch.Tensor:
        """(B,) int64: the stream's key for each user id (>= 0)."""
        u = users.to(torch.int64)
        return mix32(mix32(u & M32) ^ self.key)

    def element_keys(self, user_keys: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Keys of (user, index) pairs from `user_keys` (already gathered per element)."""
        return mix32(user_keys ^ mix32(index.to(torch.int64) & M32))

    @staticmethod
    def attempt(element_keys: torch.Tensor, attempt: int) -> torch.Tensor:
        """32-bit words for draw number `attempt` of each element: the element
        key itself for attempt 0 (already a hash), then mix(key ^ mix(attempt))."""
        if attempt == 0:
            return element_keys
        return mix32(element_keys ^ mix32_int(0x5851F42D + attempt))

    def bits(self, users: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Uniform 32-bit words (int64) for broadcast (user, index) pairs."""
        users, index = torch.broadcast_tensors(users.to(torch.int64), index.to(torch.int64))
        return self.attempt(self.element_keys(self.user_keys(users), index), 0)

    # -------------------------------------------------------------- distributions
    @staticmethod
    def to_integers(bits: torch.Tensor, n: int) -> torch.Tensor:
        if not 1 <= n < (1 << 31):
            raise ValueError(f"n must be in [1, 2^31), got {n}")
        return (bits * n) >> 32

    @staticmethod
    def to_uniform(bits: torch.Tensor) -> torch.Tensor:
        return (bits.to(torch.float64) + 0.5) / _TWO32

    def integers(self, n: int, users: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Uniform int64 in [0, n)."""
        return self.to_integers(self.bits(users, index), n)

    def uniform(self, users: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Uniform float64 in (0, 1)."""
        return self.to_uniform(self.bits(users, index))

    def normal(self, users: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Standard normal float64 (Box-Muller)."""
        u1 = self.child(1).uniform(users, index)
        u2 = self.child(2).uniform(users, index)
        return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)


# ------------------------------------------------------------------ helpers for the models


def check_seed(seed: object) -> int:
    """The int seed of the keyed draws (a torch.Generator is refused: keyed
    draws are addressed, not streamed)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"expected an int seed for keyed randomness, got {type(seed).__name__}")
    return seed


def user_normal(
    seed: int, tag: int, users: torch.Tensor, shape: tuple[int, ...], std: float, *, device: torch.device | None = None
) -> torch.Tensor:
    """float32 (B, *shape) N(0, std^2) initial private parameters: entry e of
    user u is keyed by (seed, INIT, tag, u, e), independent of the batch."""
    dev = users.device if device is None else device
    b = int(users.shape[0])
    if std == 0.0 or b == 0 or math.prod(shape) == 0:
        return torch.zeros((b, *shape), device=dev)
    n = math.prod(shape)
    st = KeyedStream.of(check_seed(seed), Purpose.INIT, tag)
    idx = torch.arange(n, device=users.device, dtype=torch.int64)
    u = users.to(torch.int64)
    out = torch.empty((b, n), dtype=torch.float32, device=dev)
    step = max(1, _CHUNK_ELEMENTS // n)  # bounded temporaries (e.g. D-only FedRAP's (B, m, k) tables)
    for s in range(0, b, step):
        z = st.normal(u[s : s + step, None], idx[None, :])
        out[s : s + step] = (z * std).to(torch.float32).to(dev)
    return out.view(b, *shape)


def global_init_generator(seed: int) -> torch.Generator:
    """The generator of `model.init_global`: a CPU generator seeded with the
    federation's seed, exactly as the coordinator's model host does
    (`coordinator/model_host.py` `init_parameters` calls this), so a simulation with
    seed S starts from the coordinator's version 1 for --seed S."""
    return torch.Generator().manual_seed(int(seed))
