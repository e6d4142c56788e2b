"""The results document of a simulation (results.json): what ran, every
round's record, the kept best round and its test metrics, and the privacy
blocks (DP's epsilon, a hybrid run's plaintext share)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import torch

from models.base import FederatedRecommender
from models.sim.config import SimulationConfig


def selection_key(explicit: bool) -> tuple[str, int]:
    """(metric, sign): the validation metric that picks the best round; sign +1 = higher is better."""
    return ("rmse", -1) if explicit else ("hr@10", +1)


def test_block(test: Mapping[str, float], explicit: bool) -> dict[str, float]:
    keys = ("rmse", "mae", "n_ratings") if explicit else ("hr@10", "ndcg@10", "full_hr@10", "full_ndcg@10", "n_users")
    return {k: float(test[k]) for k in keys if k in test}


def protocol_note(explicit: bool) -> str:
    if explicit:
        return "per-user random split 72/8/20 (train/val/test); best round by validation RMSE; test once at the end"
    return (
        "leave-one-out by time; training negatives drawn every epoch from all items minus the user's training "
        "items; best round by validation HR@10 (99 sampled negatives); test once at the end on the kept state"
    )


def results_document(
    config: SimulationConfig,
    *,
    dataset: str,
    explicit: bool,
    n_users: int,
    n_items: int,
    cohort_size: int,
    population: int,
    model: FederatedRecommender,
    rounds: int,
    records: list[dict[str, Any]],
    best_round: int | None,
    test: Mapping[str, float],
    summary_best: Mapping[str, Any],
    timing: Mapping[str, float],
    memory: Mapping[str, Any],
    device: torch.device,
    saved_global: str | None,
    diverged_at: int | None,
    epsilon: float,
    threads: Mapping[str, Any],
    epsilon_amplified: float | None = None,
) -> dict[str, Any]:
    """The results dict `simulate` returns (written as results.json).
    `timing`: seconds_total, seconds_setup and seconds_training; `epsilon`:
    the accountant's without amplification by sampling (inf when DP adds no
    noise), reported only with DP; `epsilon_amplified`: the figure that
    assumes Poisson sampling (float Gaussian only), labelled so; `threads`:
    the torch thread count and why (models/sim/threads.py)."""
    sel_key, sel_sign = selection_key(explicit)
    out: dict[str, Any] = {
        "model": config.model,
        "dataset": dataset,
        "seed": config.seed,
        "kind": "explicit" if explicit else "implicit",
        "n_users": n_users,
        "n_items": n_items,
        "cohort_size": cohort_size,
        "population": population,
        "update_dim": model.update_dim,
        "rounds": records,
        "best_round": best_round,
        "selection": {"metric": f"val {sel_key}", "higher_is_better": sel_sign > 0},
        "best_val": next(rec["val"] for rec in records if rec["round"] == best_round and "val" in rec)
        if any("val" in rec and rec["round"] == best_round for rec in records)
        else None,
        "test": test_block(test, explicit),
        "summary": summary_best,
        "seconds_total": timing["seconds_total"],
        "seconds_setup": timing["seconds_setup"],
        "seconds_training": timing["seconds_training"],
        "config": asdict(config) | {"rounds": rounds},
        "model_config": model.config(),
        "memory": dict(memory),
        "threads": dict(threads),
        "protocol": protocol_note(explicit),
    }
    if device.type == "cuda":  # what the accelerator held at most (the tensors torch allocated)
        out["accelerator"] = {
            "name": torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)),
        }
    if saved_global is not None:
        out["saved_global"] = saved_global
    if diverged_at is not None:
        out["diverged_at_round"] = diverged_at
    if config.plaintext_j_bound is not None:
        out["hybrid"] = _hybrid_block(config.plaintext_j_bound, records)
    if not explicit:
        out["placebo"] = {"hr@10": test.get("placebo_hr@10", math.nan), "ndcg@10": test.get("placebo_ndcg@10", math.nan)}
    if config.dp is not None:
        out["dp"] = _dp_block(config, sampling_rate=cohort_size / population, rounds=rounds)
        out["epsilon"] = epsilon
        if epsilon_amplified is not None:
            out["epsilon_poisson_amplified"] = epsilon_amplified
    return out


def _hybrid_block(bound: float, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A hybrid run's totals over its rounds (D64-D66)."""
    plain = sum(rec.get("plaintext_devices", 0) for rec in records)
    chosen = sum(rec.get("secure_devices_chosen", 0) for rec in records)
    counted_sec = sum(rec.get("secure_devices_counted", 0) for rec in records)
    return {
        "plaintext_j_bound": bound,
        "plaintext_share": plain / max(plain + chosen, 1),
        "plaintext_contributions": plain,
        "secure_contributions": counted_sec,
        "secure_sat_out": chosen - counted_sec,
        "meaning": "plaintext contributions are UNPROTECTED: the server sees each such device's item-factor "
        "update (D64-D66); no epsilon or secure-aggregation guarantee covers them",
    }


def _dp_block(config: SimulationConfig, *, sampling_rate: float, rounds: int) -> dict[str, Any]:
    """The DP settings of a run and what its epsilon means."""
    discrete = config.dp_mechanism == "discrete-gaussian"
    return {
        "noise_multiplier": config.dp_noise,
        "clip": config.dp_clip,
        "delta": config.dp_delta,
        "accountant": config.dp_accountant,
        "mode": config.dp_mode,
        "mechanism": config.dp_mechanism,
        "sampling_rate": sampling_rate,
        "rounds": rounds,
        "meaning": (
            ("user-level epsilon (one device, all of its data; neighbours replace its update by zero) of the "
             "distributed discrete Gaussian (D88) from its own zCDP bound, with the sensitivity after rotation and "
             "rounding and the noise of the shares each sum counted, composed over all rounds (dp_accounting, "
             "RDP), WITHOUT amplification by sampling (the cohort is a fixed-size draw); "
             if discrete else
             "APPROXIMATE (float noise): user-level (add/remove one device) epsilon of the Gaussian mechanism "
             "with noise multiplier z, composed over all rounds (dp_accounting), WITHOUT amplification by "
             "sampling (the cohort is a fixed-size draw); epsilon_poisson_amplified ASSUMES Poisson sampling at "
             "q = cohort/population; ")
            + "for what the aggregated updates reveal; "
            + (
                "local noise: conservative for the aggregate (it carries noise z*tau*sqrt(B))"
                if config.dp_mode == "local"
                else "distributed noise: each device's share is sized for its secure-aggregation group, so "
                "every group's sum, which the server sees, carries multiplier z; exact for those sums, "
                "assuming the devices add their share; the model's summed update carries z*sqrt(groups)"
            )
            + "; a round's epsilon is its worst group's (each device is in one group's sum: parallel "
            "composition); each round's entry is rounds[].dp; see models/privacy.py and models/sim/dp_groups.py"
        ),
    }
