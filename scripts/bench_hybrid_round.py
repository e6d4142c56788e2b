"""Benchmark: a FedMMF hybrid round (D64) against an all-secure round, in process.

Drives the coordinator's round machines (`coordinator.rounds.RoundMachine`,
`coordinator.hybrid.HybridRoundMachine`) with real secagg client states for
every device, through the proto wire format (the same codec as gRPC), with
no network and no training. For each plaintext share p, the first
round(p * n) devices send their encoded update in plaintext (a MaskedInput
during advertise-keys) and the others run secure aggregation. Prints, per
share: the server's time (all `handle`/`tick` calls of the machine), the
devices' time (all devices' secagg and encoding work, summed: devices run in
parallel in a real federation, so the per-device mean is what one device
waits), the round's wall time in this single process, and whether the
aggregate equals the plaintext sum of the counted inputs bit for bit.

    PYTHONPATH=. python scripts/bench_hybrid_round.py --devices 100 --dim 26912 --shares 0,0.2,0.5

Run it under `nice -n 19` with OMP_NUM_THREADS=1 on a shared machine, and
report the load average with the figures.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from coordinator.hybrid import HybridRoundMachine
from coordinator.rounds import Action, RoundMachine, Send
from coordinator.store import RoundState
from fedmask_proto.v1 import common_pb2, secagg_pb2
from secagg.client import ClientAdvertiseKeys, ClientState
from secagg.config import SecAggConfig
from secagg.messages import AdvertiseKeys
from secagg.randomness import DeterministicRandom
from secagg.stages import Stage
from wire import RoundIds
from wire import secagg_codec as codec

#: A generous deadline for every secagg stage.
DEADLINES = {s.value: 60.0 for s in Stage}


@dataclass
class _Device:
    device_id: int
    encoded: np.ndarray
    state: ClientState | None = None
    own: AdvertiseKeys | None = None
    seconds: float = 0.0


def _reply(dev: _Device, msgs: list[Any], ids: RoundIds, bits: int) -> list[Any]:
    return [codec.client_to_proto(m, ids, modulus_bits=bits) for m in msgs]


def one_round(config: SecAggConfig, cohort: list[int], plaintext: set[int], seed: int) -> dict[str, Any]:
    """One round; returns the timings and the exactness check."""
    rng = np.random.default_rng(seed)
    ids = RoundIds.from_cohort(cohort)
    bits = config.encoding.modulus_bits
    machine_cls = HybridRoundMachine if plaintext else RoundMachine
    m = machine_cls(number=1, config=config, cohort=cohort, deadlines=DEADLINES)
    server_s = 0.0
    t_wall = time.perf_counter()
    devices: dict[int, _Device] = {}
    inbox: list[tuple[int, Any]] = []
    for d in cohort:
        t0 = time.perf_counter()
        update = rng.uniform(-config.encoding.clip, config.encoding.clip, config.vector_length)
        dev = _Device(d, config.encoding.encode(update, rng))
        if d in plaintext:
            inbox.append((d, secagg_pb2.MaskedInput(
                session_id=config.session_id, round_number=1, device_id=d,
                masked_vector=dev.encoded.astype("<u4").tobytes(), length=config.vector_length, modulus_bits=bits)))
        else:
            state = ClientAdvertiseKeys(config, ids.secagg(d), 1, dev.encoded,
                                        rand=DeterministicRandom(os.urandom(32), b"bench-hybrid"))
            dev.state, out = state.start()
            first = out[0]
            assert isinstance(first, AdvertiseKeys)
            dev.own = first
            inbox += [(d, p) for p in _reply(dev, out, ids, bits)]
        dev.seconds += time.perf_counter() - t0
        devices[d] = dev

    def apply(actions: list[Action]) -> None:
        for a in actions:
            if not isinstance(a, Send):
                continue
            which = a.message.WhichOneof("message")
            if which is None:
                continue
            inner = getattr(a.message, which)
            dev = devices[a.device_id]
            if isinstance(inner, common_pb2.AbortNotice) or dev.state is None:
                continue
            t0 = time.perf_counter()
            msg: Any
            if isinstance(inner, secagg_pb2.AdvertisedKeys):
                assert dev.own is not None
                msg, _ = codec.key_list_from_proto(inner, ids, dev.own)
            else:
                msg = codec.server_from_proto(inner, ids)
            dev.state, out = dev.state.handle(msg)
            inbox.extend((a.device_id, p) for p in _reply(dev, out, ids, bits))
            dev.seconds += time.perf_counter() - t0

    t0 = time.perf_counter()
    apply(m.start(0.0))
    server_s += time.perf_counter() - t0
    while m.phase.is_collecting:
        while inbox:
            d, p = inbox.pop(0)
            t0 = time.perf_counter()
            actions = m.handle(d, p, 0.0)
            server_s += time.perf_counter() - t0
            apply(actions)
        t0 = time.perf_counter()
        actions = m.tick(0.0 if m.wants_close else m.deadline)
        server_s += time.perf_counter() - t0
        apply(actions)
    wall = time.perf_counter() - t_wall
    ok = m.phase is RoundState.AGGREGATING and m.result is not None
    exact = False
    if ok and m.result is not None:
        want = np.sum(np.stack([devices[d].encoded for d in m.result.counted]), axis=0, dtype=np.uint64)
        exact = bool(np.array_equal(m.result.encoded_sum, want.astype(np.uint32)))
    secure = [devices[d].seconds for d in cohort if d not in plaintext]
    plain = [devices[d].seconds for d in cohort if d in plaintext]
    return {
        "ok": ok, "exact": exact, "counted": len(m.result.counted) if m.result is not None else 0,
        "server_s": server_s, "wall_s": wall,
        "secure_device_s": float(np.mean(secure)) if secure else float("nan"),
        "plaintext_device_s": float(np.mean(plain)) if plain else float("nan"),
        "abort": m.abort_detail,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=100, help="cohort size n (default 100)")
    ap.add_argument("--dim", type=int, default=26912,
                    help="update length L (default 26,912: FedMMF's item factors, 1,682 items x k 16, ML-100K)")
    ap.add_argument("--shares", default="0,0.2,0.5",
                    help="comma-separated plaintext shares to measure (0 = the all-secure round)")
    ap.add_argument("--neighbors", default="all", help="secagg graph: 'all' (Bonawitz, default) or 'auto' (SecAgg+)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds per share (the median is printed)")
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    if args.devices < 3 or args.dim < 1 or any(not 0.0 <= s <= 1.0 for s in shares) or args.repeats < 1:
        ap.error("need --devices >= 3, --dim >= 1, shares in [0, 1], --repeats >= 1")
    neighbors: Any = args.neighbors if args.neighbors in ("all", "auto") else int(args.neighbors)
    cohort = list(range(1, args.devices + 1))
    config = SecAggConfig.create(num_clients=args.devices, vector_length=args.dim, session_id=b"bench-hybrid-sess",
                                 neighbors=neighbors)
    print(f"n={args.devices} L={args.dim} graph={config.describe()} repeats={args.repeats} "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'plaintext share':>15} {'plaintext':>9} {'counted':>7} {'exact':>5} {'server s':>9} "
          f"{'secure device s':>15} {'plaintext device s':>18} {'in-process wall s':>17}")
    for share in shares:
        plain = set(cohort[: round(share * args.devices)])
        runs = [one_round(config, cohort, plain, seed=r) for r in range(args.repeats)]
        med = {k: float(np.median([r[k] for r in runs])) for k in
               ("server_s", "wall_s", "secure_device_s", "plaintext_device_s")}
        ok = all(r["ok"] for r in runs)
        exact = all(r["exact"] for r in runs)
        counted = runs[-1]["counted"] if ok else f"aborted: {runs[-1]['abort']}"
        print(f"{share:>15.2f} {len(plain):>9} {counted!s:>7} {exact!s:>5} {med['server_s']:>9.3f} "
              f"{med['secure_device_s']:>15.4f} {med['plaintext_device_s']:>18.4f} {med['wall_s']:>17.2f}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
