"""Queries the coordinator relays to a device: answered on the device.

`answer(request, devices, trainer, policy=...)` turns one `DeviceRequest`
into its `DeviceResponse` (same correlation id and device id). The only
request kind is top-k: the device scores every item with `model.score` from
the latest global model it trained from (`Trainer.latest`) and its own
private state (the synthetic benchmark model: `synthetic_scores`), ranks
them, and returns the best item ids in rank order, each also as the
dataset's own item id and title (`item_catalogue`: MovieLens' movie id and
its `u.item` title; "" where the dataset ships no titles).

What leaves the device is its policy's (`RecommendationPolicy`, D84), not
the request's: at most `policy.max_k` items, the user's seen items left out
unless the policy lets a request ask for them (the answer's seen_excluded
says which), and never a score. Errors are answered, never raised:
UNKNOWN_DEVICE (not hosted here), REFUSED (the client runs with
--no-serve-recommendations), UNSUPPORTED (another request kind),
INVALID_ARGUMENT (k outside 1..n_items), NOT_READY (no model yet, or the
device never trained it), INTERNAL (anything else; logged). Blocking
(torch): run it in a thread.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from edge_client.devices import Device
from edge_client.recommend_policy import RecommendationPolicy
from edge_client.task import SYNTHETIC_MODEL
from edge_client.trainer import Trainer
from fedmask_proto.v1 import session_pb2

log = logging.getLogger("edge_client.queries")
#: The policy of a client started with no recommendation flags.
DEFAULT_POLICY = RecommendationPolicy()


def top_k(trainer: Trainer, number: int, k: int, *, exclude_seen: bool) -> tuple[list[int], list[float], int]:
    """(item ids, scores descending, global model version) for device `number`,
    scored on the device over all items with model.score. KeyError for a
    device not hosted, ValueError for k < 1, LookupError when not ready."""
    if number not in trainer.devices:
        raise KeyError(number)
    if k < 1:
        raise ValueError("k must be >= 1")
    latest = trainer.latest.latest()
    if latest is None:
        raise LookupError("no trained model on this device yet")
    if latest.model_name == SYNTHETIC_MODEL:
        scores = torch.from_numpy(synthetic_scores(latest.global_params, latest.hyperparameters,
                                                   n_items=trainer.n_items, user=trainer.devices[number].user,
                                                   seed=trainer.seed))
    else:
        entry = trainer.model_for(latest.model_name, latest.hyperparameters)
        global_ = trainer.globals_for(entry, latest.global_params, latest.model_name)
        got = trainer.devices[number].store.load_model(latest.model_name)
        if got is None:
            raise LookupError(f"device has not trained {latest.model_name} yet")
        arrays, _meta = got
        dev = trainer.device
        private = {key: torch.as_tensor(v).unsqueeze(0).to(dev) for key, v in arrays.items()}
        items = torch.arange(trainer.n_items, device=dev).unsqueeze(0)
        users = torch.tensor([trainer.devices[number].user], device=dev)
        with torch.no_grad():
            scores = entry.model.score(global_, private, users, items)[0].to(torch.float32)
    scores = torch.nan_to_num(scores, nan=-math.inf)
    if exclude_seen:
        seen = trainer.data.seen(number)
        if seen is not None and len(seen):
            scores[torch.as_tensor(seen, device=scores.device)] = -math.inf
    avail = int(torch.isfinite(scores).sum())
    kk = min(k, avail)
    if kk == 0:
        return [], [], int(latest.model_version)
    top = torch.topk(scores, kk)
    return (
        [int(i) for i in top.indices.cpu()],
        [float(s) for s in top.values.cpu()],
        int(latest.model_version),
    )


def synthetic_scores(global_params: Mapping[str, Any], hyperparameters: Mapping[str, Any], *, n_items: int,
                     user: int, seed: int) -> np.ndarray:
    """The synthetic model's item scores for one device (float32, n_items):
    the global "mean" (L,) read as an n_items x (L // n_items) item table
    (its first n_items * (L // n_items) coordinates) times the device's own
    user vector, standard normal drawn from (seed, user). A stand-in with a
    real model's cost profile (a dot product per item), for benchmarks of
    the top-k relay; it recommends nothing meaningful. LookupError when the
    federation's synthetic model has no catalogue (hyper-parameter n_items),
    one of another size than this client's dataset, or one larger than its
    vector."""
    n = hyperparameters.get("n_items")
    if n is None:
        raise LookupError("the synthetic model has no item catalogue (start the coordinator with "
                          "--model-params '{\"vector_length\": L, \"n_items\": M}')")
    if int(n) != n_items:
        raise LookupError(f"the synthetic model's catalogue has {n} items, this client's dataset {n_items}")
    mean = np.asarray(global_params["mean"], dtype=np.float32).reshape(-1)
    width = mean.size // n_items
    if width < 1:
        raise LookupError(f"the synthetic model's vector ({mean.size}) is shorter than its catalogue ({n_items})")
    table = mean[: n_items * width].reshape(n_items, width)
    u = np.random.default_rng([int(seed), int(user), 0x70B]).standard_normal(width).astype(np.float32)
    return np.asarray(table @ u, dtype=np.float32)


def item_catalogue(interactions: Any) -> tuple[list[str], list[str]]:
    """(dataset item id, title) per dense item index of the loaded dataset
    (titles "" where it ships none)."""
    raw = getattr(interactions, "raw_item_ids", None)
    n = int(interactions.n_items)
    ids = [str(v) for v in raw.tolist()] if raw is not None else [str(i) for i in range(n)]
    titles_arr = getattr(interactions, "item_titles", None)
    titles = [str(t) if t is not None else "" for t in titles_arr.tolist()] if titles_arr is not None else [""] * n
    return ids, titles


def answer(req: session_pb2.DeviceRequest, devices: Mapping[int, Device], trainer: Trainer, *,
           policy: RecommendationPolicy = DEFAULT_POLICY) -> session_pb2.DeviceResponse:
    """The response to `req`; `devices` maps device id -> hosted device;
    `policy` is what this client's devices disclose (module doc)."""
    resp = session_pb2.DeviceResponse(correlation_id=req.correlation_id, device_id=req.device_id)
    dev = devices.get(req.device_id)
    kind = req.WhichOneof("request")

    def error(code: session_pb2.DeviceErrorCode.ValueType, text: str) -> session_pb2.DeviceResponse:
        resp.error.CopyFrom(session_pb2.DeviceError(code=code, message=text))
        return resp

    if dev is None:
        return error(session_pb2.DEVICE_ERROR_CODE_UNKNOWN_DEVICE, "device not hosted by this client")
    if kind != "top_k":
        return error(session_pb2.DEVICE_ERROR_CODE_UNSUPPORTED, f"request {kind or 'empty'} not supported")
    if not policy.serve:
        return error(session_pb2.DEVICE_ERROR_CODE_REFUSED,
                     "this device does not serve recommendations (--no-serve-recommendations)")
    if req.top_k.k < 1 or req.top_k.k > trainer.n_items:
        return error(session_pb2.DEVICE_ERROR_CODE_INVALID_ARGUMENT, f"k must be in 1..{trainer.n_items}")
    plan = policy.plan(int(req.top_k.k), exclude_seen=bool(req.top_k.exclude_seen))
    try:
        items, _scores, version = top_k(trainer, dev.number, plan.k, exclude_seen=plan.exclude_seen)
    except LookupError as e:
        return error(session_pb2.DEVICE_ERROR_CODE_NOT_READY, str(e))
    except Exception as e:  # noqa: BLE001 - answered, logged; the process stays up
        log.exception("top-k for %s failed", dev.local_id)
        return error(session_pb2.DEVICE_ERROR_CODE_INTERNAL, type(e).__name__)
    ids, titles = item_catalogue(trainer.x)
    # the scores rank the items here and stay here: the order is the answer
    resp.top_k.CopyFrom(session_pb2.TopKResult(
        item_ids=items, model_version=version, seen_excluded=plan.exclude_seen,
        dataset_item_ids=[ids[i] for i in items], titles=[titles[i] for i in items],
    ))
    return resp
