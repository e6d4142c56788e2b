"""Benchmark: one whole secure-aggregation round among N simulated devices.

    python -m secagg.bench --clients 100 --dim 53824 --neighbors all \\
        --dropout 0.1 --dropout-stage unmasking --seed 0

Prints a few readable lines, then, as its LAST line, one JSON object:

  ok                      round completed and its sum equals, bit for bit, the
                          plaintext sum of the counted devices' encoded inputs
  clients dim neighbors threshold survivors (counted devices)
  client_ms_mean          mean CPU ms per device over all its stages
  client_ms_max
  server_ms               server CPU ms over all stages
  server_unmask_ms        server CPU ms in the unmasking stage
  server_stage_ms         per stage
  total_s                 wall time of the round (run_round)
  masked_input_bytes      one device's MaskedInput message on the wire
  share_ciphertext_bytes  one sealed share pair (nonce + ciphertext + tag)
  plaintext_sum_ms        summing the same float inputs without protection

CPU times use time.thread_time, so other processes on the machine count
little, but timings on a shared machine are still noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from secagg.config import SecAggConfig
from secagg.errors import SecAggConfigError
from secagg.inprocess import DropoutPlan, run_round
from secagg.stages import CLI_NAMES

#: --dropout-stage: "none" or any stage's command-line spelling, in protocol order.
STAGE_CHOICES: tuple[str, ...] = ("none", *CLI_NAMES)


def _neighbors(value: str) -> int | str:
    if value in ("all", "auto"):
        return value
    try:
        k = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError("expected 'all', 'auto' or an even integer") from None
    if k < 2:
        raise argparse.ArgumentTypeError("the degree must be at least 2")
    return k


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m secagg.bench",
        description="Run one Bonawitz / SecAgg+ round among N simulated devices in this process "
        "and report exactness, CPU time per party and message sizes (last line: JSON).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--clients", type=int, default=100, help="cohort size N")
    p.add_argument("--dim", type=int, default=53_824, help="vector length L")
    p.add_argument(
        "--neighbors",
        type=_neighbors,
        default="all",
        help="graph: 'all' (complete, Bonawitz), 'auto' (SecAgg+ k and t from the failure-probability "
        "formula) or an even Harary degree K",
    )
    p.add_argument("--threshold", type=int, default=None, help="override the threshold t")
    p.add_argument("--dropout", type=float, default=0.0, help="fraction P of devices that drop")
    p.add_argument(
        "--dropout-stage",
        choices=STAGE_CHOICES,
        default="none",
        help="stage at which they drop: advertise-keys (never advertise), share-keys (advertised, never "
        "share), share-check (shared keys, never report on the relayed shares), masked-input (shared "
        "keys, never send the masked input), consistency-check (sent the masked input, never sign "
        "the consistency check; --active), unmasking (sent the masked input, never answer the unmasking "
        "request)",
    )
    p.add_argument(
        "--expected-dropout",
        type=float,
        default=None,
        help="dropout rate assumed by --neighbors auto (default: --dropout, or 0.05 if that is 0)",
    )
    p.add_argument("--corrupt-fraction", type=float, default=0.05, help="tolerated corrupt fraction (auto)")
    p.add_argument("--clip", type=float, default=1.0, help="inputs are clipped to [-clip, clip]")
    p.add_argument("--active", action="store_true", help="active-adversary mode (signatures, consistency check)")
    p.add_argument("--seed", type=int, default=0, help="seed of inputs, dropouts, keys and rounding")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    expected = args.expected_dropout
    if expected is None:
        expected = args.dropout if args.dropout > 0 else 0.05
    try:
        config = SecAggConfig.create(
            num_clients=args.clients,
            vector_length=args.dim,
            session_id=f"bench-{args.seed}".encode(),
            clip=args.clip,
            neighbors=args.neighbors,
            threshold=args.threshold,
            expected_dropout=expected,
            corrupt_fraction=args.corrupt_fraction,
            active_adversary=args.active,
        )
    except SecAggConfigError as exc:
        parser.error(str(exc))
    rng = np.random.default_rng(args.seed)
    inputs = (rng.standard_normal((args.clients, args.dim), dtype=np.float32) * np.float32(0.1 * args.clip))
    plan = DropoutPlan.random(args.clients, args.dropout, args.dropout_stage, seed=args.seed + 1)
    print(f"config: {config.describe()}; dropouts: {args.dropout:g} at {args.dropout_stage}", file=sys.stderr)

    outcome = run_round(inputs, config=config, dropouts=plan, round_idx=0, seed=args.seed)

    t0 = time.perf_counter()
    np.sum(inputs, axis=0)
    plaintext_ms = (time.perf_counter() - t0) * 1e3

    cpu = outcome.client_cpu_ms
    active = [i for i in range(args.clients) if i not in plan.advertise_keys]
    result = {
        "ok": bool(outcome.ok and outcome.exact),
        "clients": args.clients,
        "dim": args.dim,
        "neighbors": "all" if config.is_complete_graph else config.degree,
        "threshold": config.threshold,
        "survivors": len(outcome.counted),
        "dropout": args.dropout,
        "dropout_stage": args.dropout_stage,
        "abort_reason": None if outcome.abort_reason is None else outcome.abort_reason.value,
        "client_ms_mean": round(float(np.mean(cpu[active])), 3),
        "client_ms_max": round(float(np.max(cpu[active])), 3),
        "server_ms": round(sum(outcome.server_cpu_ms.values()), 3),
        "server_unmask_ms": round(outcome.server_cpu_ms.get("unmasking", 0.0), 3),
        "server_stage_ms": {k: round(v, 3) for k, v in outcome.server_cpu_ms.items()},
        "total_s": round(outcome.wall_s, 3),
        "masked_input_bytes": outcome.masked_input_bytes,
        "share_ciphertext_bytes": outcome.share_ciphertext_bytes,
        "plaintext_sum_ms": round(plaintext_ms, 3),
        "seed": args.seed,
    }
    if outcome.ok:
        err = np.abs(outcome.mean - np.clip(inputs[list(outcome.counted)], -args.clip, args.clip).mean(0, dtype=np.float64))
        print(f"counted {len(outcome.counted)} devices; max |decoded mean - float mean| = {err.max():.3g}", file=sys.stderr)
    else:
        print(f"aborted at {outcome.abort_stage}: {outcome.abort_reason} ({outcome.abort_detail})", file=sys.stderr)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
