"""The discrete Gaussian N_Z(0, sigma^2), sampled exactly, vectorised over numpy.

The algorithms are those of Canonne, Kamath and Steinke, "The Discrete
Gaussian for Differential Privacy" (2020), Algorithms 1-3, run on whole
arrays at once: every element that is still undecided takes one more step
in each pass, so a pass costs a few numpy operations whatever the size.

Exactness. Every random choice is `random_source.uniform_below` on bytes
from a CSPRNG; every probability is a ratio of integers; nothing inside is
floating point. The output's law is exactly

    P[Y = y] = exp(-y^2 / (2 sigma^2)) / sum_k exp(-k^2 / (2 sigma^2)),

with sigma^2 a rational number (`fractions.Fraction`). Rejection sampling
runs on batches a little larger than what is missing and keeps the first
accepted candidates in index order; candidates are independent, so the kept
ones are independent draws of the target law. Integers stay in int64: the
caller's sigma^2 = a/b must satisfy 2 a b t^2 <= 2^62 with t = floor(sigma)
+ 1 (about sigma < 2^15 for b = 1; `check_variance` refuses more). The one
product that can outgrow int64, the acceptance exponent of a tail draw
(|y| b t >= 2^31), is evaluated in Python's unbounded integers, so every
draw stays exact.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpmech.random_source import I64, MAX_MODULUS, Bits, ByteSource, fair_bits, uniform_below

_NEAR = 1 << 31  # |y| b t below this keeps (|y| b t - a)^2 below 2^62
# k! for k = 2..10: Bernoulli(exp(-1))'s first nine factors from one draw.
_FACTORIALS = tuple(math.factorial(k) for k in range(2, 11))


def check_variance(sigma2: Fraction) -> tuple[int, int, int]:
    """(a, b, t) for sigma^2 = a/b in lowest terms and t = floor(sigma) + 1;
    ValueError when sigma^2 is not positive or too large for int64."""
    if not isinstance(sigma2, Fraction):
        raise TypeError(f"sigma^2 must be a fractions.Fraction (exact), got {type(sigma2).__name__}")
    if sigma2 <= 0:
        raise ValueError(f"sigma^2 must be > 0, got {sigma2}")
    a, b = sigma2.numerator, sigma2.denominator
    t = math.isqrt(a // b) + 1
    if 2 * a * b * t * t > MAX_MODULUS or a >= _NEAR:
        raise ValueError(
            f"sigma^2 = {sigma2} is too large (or its denominator too fine) for the exact int64 sampler: "
            "need 2 a b t^2 <= 2^62 and a < 2^31 with sigma^2 = a/b, t = floor(sigma) + 1 "
            "(sigma below about 2^15 for an integer sigma^2); use a smaller scale")
    return a, b, t


def _bernoulli_over_k(numerator: I64, denominator: int, k: int, source: ByteSource) -> Bits:
    """Bernoulli(numerator_i / (denominator k)), in one draw when it fits."""
    if denominator * k <= MAX_MODULUS:
        one: Bits = uniform_below(denominator * k, numerator.size, source) < numerator
        return one
    first: Bits = uniform_below(denominator, numerator.size, source) < numerator
    second: Bits = uniform_below(k, numerator.size, source) == 0
    return first & second


def bernoulli_exp_minus_fraction(numerator: I64, denominator: int, source: ByteSource) -> Bits:
    """Bernoulli(exp(-gamma_i)) for gamma_i = numerator_i / denominator in [0, 1].

    Algorithm 1 of Canonne et al., case gamma <= 1: draw A_k ~
    Bernoulli(gamma / k) for k = 1, 2, ... until one is 0; the result is 1
    iff that k is odd. All elements still going share the same k."""
    result = np.empty(numerator.size, dtype=np.bool_)
    active = np.arange(numerator.size)
    k = 1
    while active.size:
        a = _bernoulli_over_k(numerator[active], denominator, k, source)
        result[active[~a]] = (k & 1) == 1
        active = active[a]
        k += 1
    return result


def bernoulli_exp_minus_one(n: int, source: ByteSource) -> Bits:
    """`n` independent Bernoulli(exp(-1)) bits.

    Algorithm 1 with gamma = 1: A_1 = 1, A_k ~ Bernoulli(1/k). The mixed-radix
    digits of R uniform on [0, 10!) are independent uniforms on [0, k) for
    k = 2..10, and A_2 = ... = A_k = 1 exactly when k! divides R; so the
    first k with A_k = 0 is read off R, and only R = 0 (probability 1/10!)
    goes on drawing A_11, A_12, ... one at a time."""
    r = uniform_below(_FACTORIALS[-1], n, source)
    result = np.zeros(n, dtype=np.bool_)  # first zero at k = 2: even
    going = np.flatnonzero(r % 2 == 0)
    for k, f in enumerate(_FACTORIALS[1:], start=3):
        divides = r[going] % f == 0
        result[going[~divides]] = (k & 1) == 1
        going = going[divides]
    for i in going:  # r = 0: A_2..A_10 were all 1
        k = 11
        while int(uniform_below(k, 1, source)[0]) == 0:
            k += 1
        result[i] = (k & 1) == 1
    return result


def bernoulli_exp_minus(whole: I64, numerator: I64, denominator: int, source: ByteSource) -> Bits:
    """Bernoulli(exp(-(whole_i + numerator_i / denominator))), numerator < denominator.

    Algorithm 1, case gamma > 1: the product of `whole` Bernoulli(exp(-1))
    draws (stopping at the first 0) and one Bernoulli(exp(-fraction))."""
    result = bernoulli_exp_minus_fraction(numerator, denominator, source)
    remaining = whole.copy()
    active = np.flatnonzero(result & (remaining > 0))
    while active.size:
        b = bernoulli_exp_minus_one(active.size, source)
        result[active[~b]] = False
        remaining[active] -= 1
        active = active[b & (remaining[active] > 0)]
    return result


def geometric_exp_minus_one(n: int, source: ByteSource) -> I64:
    """The number of Bernoulli(exp(-1)) successes before the first failure:
    P[V >= v] = exp(-v)."""
    v = np.zeros(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        active = active[bernoulli_exp_minus_one(active.size, source)]
        v[active] += 1
    return v


def discrete_laplace(n: int, t: int, source: ByteSource) -> I64:
    """`n` draws with P[Y = y] proportional to exp(-|y| / t), t a positive int.

    Algorithm 2 of Canonne et al. with s = 1: U uniform on {0..t-1} kept with
    probability exp(-U/t), V geometric as above, X = U + t V, a fair sign,
    and -0 rejected so that 0 is not counted twice. About 63% of candidates
    are kept, so a batch is 8/5 of what is missing plus a margin."""
    if t < 1:
        raise ValueError(f"t must be a positive int, got {t}")
    found: list[I64] = []
    missing = n
    while missing > 0:
        batch = missing * 8 // 5 + 64
        u = uniform_below(t, batch, source)
        u = u[bernoulli_exp_minus_fraction(u, t, source)]
        v = geometric_exp_minus_one(u.size, source)
        if v.size and int(v.max()) >= MAX_MODULUS // t:  # P <= exp(-2^47): never, but never silent
            raise OverflowError("a discrete Laplace draw left int64")
        x = u + t * v
        negative = fair_bits(x.size, source)
        y = np.where(negative, -x, x)[~(negative & (x == 0))][:missing]
        found.append(y)
        missing -= y.size
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _accept_far(magnitude: int, a: int, b: int, t: int, source: ByteSource) -> bool:
    """Algorithm 3's acceptance test for one draw, all in Python's unbounded
    integers (for an exponent whose integer part would leave int64)."""
    den = 2 * a * b * t * t
    whole, rest = divmod((magnitude * b * t - a) ** 2, den)
    if not bernoulli_exp_minus_fraction(np.array([rest], dtype=np.int64), den, source)[0]:
        return False
    while whole > 0:  # ends at the first failure: after 1.6 tries on average
        if not bernoulli_exp_minus_one(1, source)[0]:
            return False
        whole -= 1
    return True


def _accept(y: I64, a: int, b: int, t: int, source: ByteSource) -> Bits:
    """Bernoulli(exp(-(|y| - sigma^2/t)^2 / (2 sigma^2))) for each y, with
    sigma^2 = a/b: the exponent is (|y| b t - a)^2 / (2 a b t^2), split into
    its integer part and remainder exactly (in int64 near the centre, in
    Python integers beyond; an integer part >= 2^62, i.e. a draw beyond
    about 2^31 sigma, is decided one element at a time)."""
    den = 2 * a * b * t * t
    mag = np.abs(y)
    whole = np.zeros(y.size, dtype=np.int64)
    rest = np.zeros(y.size, dtype=np.int64)
    near = mag < _NEAR // (b * t)
    diff = mag[near] * (b * t) - a
    square = diff * diff
    whole[near], rest[near] = square // den, square % den
    far = np.flatnonzero(~near)
    huge = np.zeros(0, dtype=np.int64)
    if far.size:
        parts = [divmod((int(m) * b * t - a) ** 2, den) for m in mag[far]]
        fits = np.array([q < MAX_MODULUS for q, _ in parts], dtype=np.bool_)
        whole[far[fits]] = [q for q, _ in parts if q < MAX_MODULUS]
        rest[far[fits]] = [r for q, r in parts if q < MAX_MODULUS]
        huge = far[~fits]
    decided = np.ones(y.size, dtype=np.bool_)
    decided[huge] = False
    accept = np.zeros(y.size, dtype=np.bool_)
    accept[decided] = bernoulli_exp_minus(whole[decided], rest[decided], den, source)
    for i in huge:
        accept[i] = _accept_far(int(mag[i]), a, b, t, source)
    return accept


def discrete_gaussian(n: int, sigma2: Fraction, source: ByteSource) -> I64:
    """`n` independent draws of N_Z(0, sigma2), exactly (Algorithm 3 of
    Canonne et al.): discrete Laplace with t = floor(sigma) + 1, accepted with
    probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)); batches of 3/2 of
    what is missing plus a margin."""
    if n < 0:
        raise ValueError(f"cannot draw {n} values")
    a, b, t = check_variance(sigma2)
    found: list[I64] = []
    missing = n
    while missing > 0:
        y = discrete_laplace(missing * 3 // 2 + 64, t, source)
        y = y[_accept(y, a, b, t, source)][:missing]
        found.append(y)
        missing -= y.size
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
