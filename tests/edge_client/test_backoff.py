"""Reconnect delays: exponential backoff with full jitter (injected randomness and sleep)."""

from __future__ import annotations

import asyncio
import random

import pytest

from edge_client.backoff import Backoff


def test_ceiling_grows_exponentially_up_to_the_cap() -> None:
    b = Backoff(base=0.5, cap=30.0, multiplier=2.0)
    assert [b.ceiling(a) for a in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert b.ceiling(10_000) == 30.0  # no overflow


def test_full_jitter_schedule_with_fixed_draws() -> None:
    draws = iter([1.0, 0.5, 0.0, 0.25, 0.999, 0.5, 0.5, 0.5])
    b = Backoff(base=1.0, cap=10.0, uniform=lambda: next(draws))
    assert [b.next_delay() for _ in range(8)] == pytest.approx([1.0, 1.0, 0.0, 2.0, 9.99, 5.0, 5.0, 5.0])
    assert b.attempt == 8


def test_delays_are_uniform_over_the_whole_window() -> None:
    rng = random.Random(7)
    samples = []
    for _ in range(4000):
        b = Backoff(base=1.0, cap=8.0, uniform=rng.random)
        b.attempt = 3  # window [0, 8]
        samples.append(b.next_delay())
    assert min(samples) >= 0.0 and max(samples) <= 8.0
    assert sum(samples) / len(samples) == pytest.approx(4.0, abs=0.2)
    assert sum(s < 1.0 for s in samples) / len(samples) == pytest.approx(1 / 8, abs=0.03)  # no floor: full jitter


def test_reset_after_a_successful_session() -> None:
    b = Backoff(base=1.0, cap=100.0, uniform=lambda: 1.0)
    for _ in range(5):
        b.next_delay()
    b.reset()
    assert b.next_delay() == 1.0


def test_wait_uses_the_injected_sleep() -> None:
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)

    b = Backoff(base=2.0, cap=4.0, uniform=lambda: 0.5, sleep=fake_sleep)

    async def go() -> list[float]:
        return [await b.wait() for _ in range(3)]

    assert asyncio.run(go()) == [1.0, 2.0, 2.0]
    assert slept == [1.0, 2.0, 2.0]


@pytest.mark.parametrize("kw", [{"base": 0}, {"base": 2.0, "cap": 1.0}, {"multiplier": 0.5}])
def test_bad_settings(kw: dict) -> None:
    with pytest.raises(ValueError):
        Backoff(**kw)


def test_a_refusal_with_a_retry_pushback_hint_sets_the_wait() -> None:
    from edge_client.backoff import MAX_PUSHBACK_S, retry_pushback_s

    assert retry_pushback_s((("content-type", "x"), ("grpc-retry-pushback-ms", "1500"))) == 1.5
    assert retry_pushback_s((("Grpc-Retry-Pushback-Ms", b"20"),)) == 0.02
    assert retry_pushback_s((("grpc-retry-pushback-ms", "999999999"),)) == MAX_PUSHBACK_S
    assert retry_pushback_s((("grpc-retry-pushback-ms", "-1"),)) is None
    assert retry_pushback_s(()) is None and retry_pushback_s(None) is None

