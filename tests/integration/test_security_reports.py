"""Hostile share-check reports over real processes and mTLS (D37).

One coordinator process (mTLS from `fedmask certs init`, full graph,
majority threshold, cohort minimum 5, short selection window) and eleven
edge-client processes, each with its own client certificate (credential):

- four honest clients of five devices each (20 honest devices);
- three hostile clients of one device each (`--fault-false-reports`): they
  follow the protocol but name every relayed sender undecryptable in each
  share-check receipt;
- one client whose device seals garbage shares (`--fault-garbage-shares`);
- later, three more hostile clients of one device each
  (`--fault-false-reports-about IDS`): they accuse only four honest devices
  and keep their other edges, so they stay in each round and their reports
  count. This is the case the per-credential quota bounds.

Checked:
- rounds keep committing with the honest devices while the coalition is
  connected (before the fix, every honest device was quarantined after two
  rounds and no round ever opened again);
- at most N = floor(k * quota / reporters) honest devices are quarantined
  (k = 3 credentials; here none, since the liars leave each round at the
  share check and their reports do not count);
- the garbage sealer is still reported by honest peers of several
  credentials and quarantined: the defence stays on;
- after the coalition leaves, a round opens within 2 selection intervals;
- the coalition that accuses a few: exactly N = floor(3 * 2 / 3) = 2 of the
  four accused honest devices are quarantined in the window, the log shows
  the quota refusing the other two (`quarantine_refused`, no reporting
  credential with quota left), and rounds keep committing and counting
  those two.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from coordinator.peer_reports import ReportPolicy
from integration_harness import (
    Processes,
    all_rounds,
    client_args,
    coordinator_args,
    events,
    free_port,
    open_store_readonly,
    wait_serving,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

SELECTION_S = 2.0
HONEST = {"honest-a": "1-5", "honest-b": "6-10", "honest-c": "11-15", "honest-d": "16-20"}
HOSTILE = {"liar-a": "21", "liar-b": "22", "liar-c": "23"}
GARBAGE = {"garbage": "24"}
ACCUSERS = {"accuser-a": "25", "accuser-b": "26", "accuser-c": "27"}


def _committed(db: str) -> list[int]:
    return [r.number for r in all_rounds(db) if r.state.value == "committed"]


def _devices_by_client(db: str) -> dict[str, set[int]]:
    store = open_store_readonly(db)
    try:
        out: dict[str, set[int]] = {}
        for d in store.list_devices():
            out.setdefault(d.client_id or "", set()).add(d.id)
        return out
    finally:
        store.close()


def _quarantined(db: str) -> set[int]:
    store = open_store_readonly(db)
    try:
        return {q.device_id for q in store.list_quarantines()}
    finally:
        store.close()


def test_a_coalition_of_liars_costs_only_itself(procs: Processes, tmp_path: Path) -> None:
    import grpc

    names = [*HONEST, *HOSTILE, *GARBAGE, *ACCUSERS]
    pki = tmp_path / "pki"
    certs = procs.start("certs", ["certs", "init", str(pki), "--devices", str(len(names)), "--no-device-ca"])
    assert certs.wait(60) == 0, certs.tail()
    cert = {n: (pki / "devices" / f"device-{i:04d}.pem", pki / "devices" / f"device-{i:04d}.key")
            for i, n in enumerate(names, start=1)}
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, db, auth="mtls", tls_cert=pki / "coordinator.pem", tls_key=pki / "coordinator.key",
        tls_client_ca=pki / "ca.pem", require_client_cert=True,
        model="fedrap", model_params={"n_users": 200, "n_items": 300, "k": 8, "local_epochs": 1},
        cohort_size=24, cohort_minimum=5, over_selection=0.0, allow_consecutive=True, round_pause=0.0,
        selection_deadline=SELECTION_S, deadline_policy="fixed", training_deadline=20, advertise_keys_deadline=5,
        share_keys_deadline=5, share_check_deadline=5, masked_input_deadline=5, unmasking_deadline=5,
        secagg_graph="full", secagg_threshold="majority", dp_mode="none",
    ))
    ca = (pki / "ca.pem").read_bytes()
    first = cert["honest-a"]
    wait_serving(port, coord, credentials=grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=first[1].read_bytes(), certificate_chain=first[0].read_bytes()))
    common = dict(dataset="synthetic", seed=3, threads=1, tls_ca=pki / "ca.pem")
    clients = {}
    for group, fault in ((HONEST, {}), (HOSTILE, {"fault_false_reports": True}),
                         (GARBAGE, {"fault_garbage_shares": True})):
        for name, users in group.items():
            clients[name] = procs.start(name, client_args(port, users, tmp_path / name, tls_cert=cert[name][0],
                                                          tls_key=cert[name][1], **common, **fault))
    watch = [coord, *clients.values()]

    # rounds keep committing with the coalition connected (before the fix: two rounds, then none)
    wait_until(lambda: len(_committed(db)) >= 5, 75, what="5 committed rounds with the liars connected",
               watch=watch, step=0.3)
    by_client = _devices_by_client(db)
    cn = {n: f"device-{i:04d}" for i, n in enumerate(names, start=1)}
    honest = set().union(*(by_client[cn[n]] for n in HONEST))
    liars = set().union(*(by_client[cn[n]] for n in HOSTILE))
    (garbage,) = by_client[cn["garbage"]]
    assert len(honest) == 20 and len(liars) == 3
    rounds = [r for r in all_rounds(db) if r.state.value == "committed"]
    for rec in rounds:  # every committed round counted the honest devices only
        assert set(rec.survivors["masked_input"]) <= honest, rec.survivors
        assert not liars & set(rec.survivors.get("share_check", [])), rec.survivors

    # at most N honest devices quarantined; the garbage sealer is quarantined (reported by 3 credentials)
    wait_until(lambda: garbage in _quarantined(db), 30, what="the garbage sealer quarantined", watch=watch, step=0.3)
    bound = ReportPolicy().bound(len(HOSTILE))
    assert len(_quarantined(db) & honest) <= bound
    assert _quarantined(db) == {garbage}  # the liars' own reports never counted
    reports = events(coord.log(), "share_reports")
    counted = [c.split(":") for e in reports for c in e.get("counted", "").split(";") if c]
    assert counted and {who for who, _ in counted} <= {cn[n] for n in HONEST}  # no liar's report counted
    assert {int(d) for _, d in counted} == {garbage}

    # the coalition (and the garbage sealer) leave: a round opens within 2 selection intervals
    for name in [*HOSTILE, *GARBAGE]:
        procs.stop(clients[name])
    last = max(r.number for r in all_rounds(db))
    wait_until(lambda: all(r.state.value in ("committed", "aborted") for r in all_rounds(db)), 40,
               what=f"round {last} to end", watch=[coord], step=0.1)
    ended = time.monotonic()
    last = max(r.number for r in all_rounds(db))
    wait_until(lambda: max(r.number for r in all_rounds(db)) > last, 2 * SELECTION_S + 1.0,
               what="a round to open within 2 selection intervals", watch=[coord], step=0.1)
    assert time.monotonic() - ended <= 2 * SELECTION_S + 1.0
    wait_until(lambda: len(_committed(db)) > len(rounds) and max(_committed(db)) > last, 40,
               what="a round to commit after the coalition left", watch=[coord], step=0.3)

    # a coalition of 3 credentials that accuses only four honest devices stays in the rounds
    accused = sorted(by_client[cn["honest-a"]])[:2] + sorted(by_client[cn["honest-b"]])[:1] \
        + sorted(by_client[cn["honest-c"]])[:1]
    for name, users in ACCUSERS.items():
        clients[name] = procs.start(name, client_args(
            port, users, tmp_path / name, tls_cert=cert[name][0], tls_key=cert[name][1], **common,
            fault_false_reports_about=",".join(map(str, accused))))
    watch = [coord, *(clients[n] for n in [*HONEST, *ACCUSERS])]
    accusers_cn = {cn[n] for n in ACCUSERS}
    wait_until(lambda: any(e.get("quarantined") for e in events(coord.log(), "share_reports")
                           if set(e.get("counted", "").replace(";", ":").split(":")) & accusers_cn), 60,
               what="the accusers' reports to quarantine", watch=watch, step=0.3)
    bound = ReportPolicy().bound(len(ACCUSERS))
    hit = _quarantined(db) & honest
    assert hit <= set(accused) and len(hit) == bound == 2, (hit, accused)
    spared = set(accused) - hit
    refused = events(coord.log(), "quarantine_refused")
    assert {int(e["device"]) for e in refused} == spared, refused
    assert all(e["with_quota"] == "" and set(e["reporters"].split(",")) == accusers_cn for e in refused)
    # rounds keep committing, with the spared accused devices (and the accusers) counted
    after = max(_committed(db))
    wait_until(lambda: any(r.number > after and spared <= set(r.survivors["masked_input"])
                           for r in all_rounds(db) if r.state.value == "committed"), 40,
               what="a round counting the spared accused devices", watch=watch, step=0.3)
    assert _quarantined(db) & honest == hit  # no further quarantine in the window
