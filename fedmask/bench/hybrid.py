"""`fedmask bench hybrid`: FedMMF hybrid rounds against all-secure rounds over
real processes and mTLS (D64-D66).

Each mode starts fresh processes on 127.0.0.1: a PKI (`fedmask.certs.init_pki`,
one client certificate per client process), a coordinator (SQLite in a temp
folder, model fedmmf sized to the dataset, mTLS, cohort = every device, no
injected dropout, `--debug-record-sums`) and P edge-client processes hosting
users 1..N of the dataset (`--debug-record-inputs`), which train FedMMF for
real. R rounds run:

- `secure`: no J bound anywhere; every device runs secure aggregation;
- `hybrid`: the coordinator runs with `--unprotected-plaintext-j-bound B`
  and every client consents with the same bound, so a device whose privacy
  indicator J is at most B uploads its update in plaintext and the rest run
  secure aggregation among themselves.

Round time = the round record's ended_at - started_at (the coordinator
opening the round to its commit), local training included. Every committed
aggregate is checked bit for bit: the checksum the coordinator recorded
equals that of the sum of the counted devices' encoded inputs (plaintext
and secure ones), as the clients recorded them. Per hybrid round the record's
`hybrid.plaintext_devices` / `hybrid.secure_devices` metrics are reported.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedmask.bench.loopback_federation import (
    bench_folder,
    committed_times,
    exact_aggregate,
    full_cohort,
    is_neighbors,
    read_rounds,
    round_seconds,
    run_to_exit,
    secagg_graph,
    start_client,
    start_coordinator,
)
from fedmask.bench.processes import LOOPBACK, ProcessGroup, free_port, split_users

MODES = ("secure", "hybrid")


@dataclass(frozen=True)
class HybridBenchConfig:
    devices: int = 100
    client_processes: int = 2
    dataset: str = "ml-100k"
    data_dir: Path = Path("data")
    #: the hybrid mode's J bound, on the coordinator and on every client
    j_bound: float = 0.5
    neighbors: str = "all"  # all | auto | an even K
    #: Shamir threshold policy, chosen for the whole cohort; in a hybrid round
    #: it applies to the secure subset (coordinator/hybrid.py)
    threshold: str = "two_thirds"
    rounds: int = 5
    seed: int = 0
    #: FedMMF hyper-parameters over the model's defaults (n_users / n_items come from the dataset)
    model_params: dict[str, Any] | None = None
    timeout: float = 1200.0
    keep: Path | None = None

    def __post_init__(self) -> None:
        if self.devices < 3:
            raise ValueError("--devices must be at least 3")
        if self.client_processes < 1 or self.client_processes > self.devices:
            raise ValueError("--client-processes must be between 1 and --devices")
        if not (self.j_bound >= 0 and np.isfinite(self.j_bound)):
            raise ValueError("--j-bound must be a finite number >= 0")
        if self.rounds < 1:
            raise ValueError("--rounds must be at least 1")
        if not is_neighbors(self.neighbors):
            raise ValueError("--neighbors must be 'all', 'auto' or an even number")


def _secure_part_aborted(log_text: str) -> dict[int, str]:
    """round number -> why its secure part aborted, for the hybrid rounds that
    committed the plaintext sum alone (the coordinator's `aggregate_ready`
    log event carries `secure_part=aborted: ...`)."""
    out: dict[int, str] = {}
    for m in re.finditer(r"event=aggregate_ready round=(\d+) .*?secure_part='?aborted: ([^'\n]*)", log_text):
        out[int(m.group(1))] = m.group(2).strip()
    return out


def _dataset_size(cfg: HybridBenchConfig) -> tuple[int, int]:
    from models.data.entry import load_interactions

    x = load_interactions(cfg.dataset, str(cfg.data_dir), cfg.seed)
    if cfg.devices > x.n_users:
        raise ValueError(f"{cfg.dataset} has {x.n_users} users, fewer than --devices {cfg.devices}")
    return int(x.n_users), int(x.n_items)


def _mode(cfg: HybridBenchConfig, root: Path, mode: str, size: tuple[int, int], log: Any) -> dict[str, Any]:
    """One PKI + coordinator + P clients; R rounds; the mode's figures."""
    import grpc

    from fedmask.certs import PkiLayout, init_pki

    hybrid = mode == "hybrid"
    work = root / mode
    work.mkdir()
    pki = PkiLayout(work / "pki")
    init_pki(pki.root, devices=cfg.client_processes)
    db = work / "coordinator.db"
    port = free_port()
    n_users, n_items = size
    coord_flags = {
        "database_url": f"sqlite:///{db}",
        "listen": f"{LOOPBACK}:{port}",
        "auth": "mtls",
        "tls_cert": pki.server_cert,
        "tls_key": pki.server_key,
        "tls_client_ca": pki.ca_cert,
        "require_client_cert": True,
        "model": "fedmmf",
        "model_params": {"n_users": n_users, "n_items": n_items, **(cfg.model_params or {})},
        **full_cohort(cfg.devices, cfg.seed, cfg.rounds),
        "selection_deadline": 300,
        "secagg_graph": secagg_graph(cfg.neighbors),
        "secagg_threshold": cfg.threshold,
        "dp_mode": "none",
        "debug_record_sums": True,
        "unprotected_plaintext_j_bound": cfg.j_bound if hybrid else None,
        "log_level": "INFO",
    }
    state_dirs = [work / f"client-{i}" for i in range(cfg.client_processes)]
    t_start = time.monotonic()
    with ProcessGroup(work, env={"OMP_NUM_THREADS": "1"}) as group:
        cert, key = pki.device(1)
        creds = grpc.ssl_channel_credentials(root_certificates=pki.ca_cert.read_bytes(),
                                             private_key=key.read_bytes(), certificate_chain=cert.read_bytes())
        coord = start_coordinator(group, port, coord_flags, credentials=creds, timeout=120)
        clients = []
        for i, users in enumerate(split_users(1, cfg.devices, cfg.client_processes)):
            cert, key = pki.device(i + 1)
            client_flags = {
                "dataset": cfg.dataset,
                "data_dir": cfg.data_dir,
                "seed": cfg.seed,
                "tls_ca": pki.ca_cert,
                "tls_cert": cert,
                "tls_key": key,
                "unprotected_plaintext_j_bound": cfg.j_bound if hybrid else None,
                "no_dp_floor": True,  # the bench runs without DP (D85)
                "debug_record_inputs": True,
                "threads": 1,
                "log_level": "warning",
            }
            clients.append(start_client(group, f"client-{i}", port, users, state_dirs[i], client_flags))
        log(f"[{mode}] coordinator pid {coord.pid} on port {port} (mTLS), {len(clients)} client process(es) "
            f"hosting users 1-{cfg.devices} of {cfg.dataset}")
        seen: set[int] = set()

        def report_ended_rounds() -> None:
            for r in read_rounds(db):
                if r.state.is_terminal and r.number not in seen:
                    seen.add(r.number)
                    log(f"[{mode}] round {r.number} {r.state.value} in {round_seconds(r):.1f}s, plaintext devices "
                        f"{int(r.metrics.get('hybrid.plaintext_devices', 0))}")

        run_to_exit(coord, clients, cfg.timeout, what=f"{cfg.rounds} {mode} rounds", step=1.0,
                    poll=report_ended_rounds)
    records = [r for r in read_rounds(db) if r.state.is_terminal]
    coord_log = (work / "coordinator.log").read_text(errors="replace")
    secure_aborted = _secure_part_aborted(coord_log)
    per_round = [_round_detail(r, state_dirs, secure_aborted) for r in records]
    ok = len(records) == cfg.rounds and all(p["exact"] for p in per_round)
    log(f"[{mode}] {len(records)} round(s) in {time.monotonic() - t_start:.1f}s (processes included)")
    m = re.search(r"config='n=\d+ L=(\d+) graph=(.+?) t=(\d+)'", coord_log)
    return {
        "ok": ok,
        # every committed round counted every device (no secure part lost)
        "all_counted": all(p["counted"] == cfg.devices for p in per_round if p["state"] == "committed"),
        "secagg": {"L": int(m.group(1)), "graph": m.group(2), "threshold": int(m.group(3))} if m else None,
        **committed_times(records),
        "plaintext_devices": [p["plaintext_devices"] for p in per_round],
        "secure_devices": [p["secure_devices"] for p in per_round],
        "rounds": per_round,
    }


def _round_detail(r: Any, state_dirs: list[Path], secure_aborted: dict[int, str]) -> dict[str, Any]:
    """One ended round of a mode: its state and time, who was counted (plaintext and secure devices),
    and `exact`: committed, with the aggregate equal bit for bit to the counted devices' recorded inputs."""
    plaintext = len(r.survivors.get("plaintext", []))
    secure = len(r.survivors.get("masked_input", []))
    return {
        "round": r.number, "state": r.state.value, "abort_reason": r.abort_reason,
        "seconds": round(round_seconds(r), 3), "counted": plaintext + secure,
        # a hybrid round whose secure part aborted commits the plaintext sum alone (coordinator/hybrid.py)
        "secure_part_aborted": secure_aborted.get(r.number),
        "plaintext_devices": int(r.metrics.get("hybrid.plaintext_devices", plaintext)),
        "secure_devices": int(r.metrics.get("hybrid.secure_devices", secure)),
        "exact": r.state.value == "committed" and exact_aggregate(r, state_dirs),
        "timings": {k: round(v, 3) for k, v in r.timings.items()},
    }


def run_hybrid_bench(cfg: HybridBenchConfig, log: Any = print) -> dict[str, Any]:
    """Both modes, all-secure first; the result (module doc) as a dict."""
    size = _dataset_size(cfg)
    with bench_folder("fedmask-bench-hybrid-", cfg.keep, ignore=("*.npy", "*.fms", "*.key")) as root:
        got = {m: _mode(cfg, root, m, size, log) for m in MODES}
        sec, hyb = got["secure"]["round_s_median"], got["hybrid"]["round_s_median"]
        return {
            "ok": bool(got["secure"]["ok"] and got["hybrid"]["ok"]),
            "devices": cfg.devices,
            "client_processes": cfg.client_processes,
            "dataset": cfg.dataset,
            "model": "fedmmf",
            "neighbors": cfg.neighbors,
            "threshold": cfg.threshold,
            "secagg": got["secure"]["secagg"],
            "j_bound": cfg.j_bound,
            "rounds": cfg.rounds,
            "secure": got["secure"],
            "hybrid": got["hybrid"],
            "all_counted": bool(got["secure"]["all_counted"] and got["hybrid"]["all_counted"]),
            "hybrid_over_secure_median": round(hyb / sec, 3) if sec and hyb else None,
        }


__all__ = ["HybridBenchConfig", "MODES", "run_hybrid_bench"]
