"""Two hosts on this machine (D93): two network namespaces joined by a veth
pair, one torchrun node in each (`torchrun --nnodes 2 --node-rank R
--master-addr <host 0's address> -m fedmask simulate ...`, the same entry
point as on real hosts), talking real TCP over the veth. The two-node run
reaches bit for bit the model of `fedmask simulate --nproc 1` (torch's scalar
kernels on both sides, so that no device's float32 result depends on its
batch; tests/models/test_sim_ranks.py), and the veth carried the traffic.

Needs root and `ip netns` (CI runs as root); it skips only when a namespace
cannot be made, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from models.sim.global_state import load_global_state

ROOT = Path(__file__).resolve().parents[2]
RUN = ["--model", "fedmf", "--dataset", "synthetic", "--rounds", "3", "--clients-per-round", "150", "--threads",
       "1", "--param", "k=8", "--quiet"]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts() -> Iterator[tuple[tuple[str, str, str], tuple[str, str, str]]]:
    """((namespace, interface, address) of host 0, of host 1); removed afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) on this machine: cannot make network namespaces")
    tag = f"fmr{os.getpid() % 100000}"
    sub = 10 + os.getpid() % 200
    hosts = ((f"{tag}a", f"{tag}a", f"10.231.{sub}.1"), (f"{tag}b", f"{tag}b", f"10.231.{sub}.2"))
    made = _ip("netns", "add", hosts[0][0])
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace here (`ip netns add`: {made.stderr.strip()})")
    try:
        steps = [("netns", "add", hosts[1][0]),
                 ("link", "add", hosts[0][1], "type", "veth", "peer", "name", hosts[1][1])]
        for ns, dev, addr in hosts:
            steps += [("link", "set", dev, "netns", ns), ("-n", ns, "addr", "add", f"{addr}/24", "dev", dev),
                      ("-n", ns, "link", "set", dev, "up"), ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            done = _ip(*step)
            assert done.returncode == 0, f"ip {' '.join(step)}: {done.stderr}"
        yield hosts
    finally:
        for ns, _, _ in hosts:
            _ip("netns", "del", ns)  # deletes its end of the veth pair, and so the pair


def _tx_bytes(ns: str, dev: str) -> int:
    out = _ip("-n", ns, "-j", "-s", "link", "show", dev)
    return int(json.loads(out.stdout)[0]["stats64"]["tx"]["bytes"])


def test_two_namespaces_over_tcp_reach_the_one_rank_model(
    two_hosts: tuple[tuple[str, str, str], tuple[str, str, str]], tmp_path: Path
) -> None:
    env = os.environ | {"PYTHONPATH": str(ROOT), "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    one = tmp_path / "one"
    done = subprocess.run([sys.executable, "-m", "fedmask", "simulate", *RUN, "--nproc", "1", "--out", str(one),
                           "--save-global", str(one / "g.npz")], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    master = two_hosts[0][2]
    procs = []
    for node, (ns, dev, _) in enumerate(two_hosts):
        out = tmp_path / f"node{node}"
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr", master, "--master-port", "29533",
               "-m", "fedmask", "simulate", *RUN, "--out", str(out), "--save-global", str(out / "g.npz")]
        procs.append(subprocess.Popen(cmd, env=env | {"GLOO_SOCKET_IFNAME": dev}, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=300)[0])
        finally:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    results = json.loads((tmp_path / "node0" / "results.json").read_text())
    assert results["ranks"]["world"] == 2 and results["ranks"]["backend"] == "gloo"
    assert not (tmp_path / "node1" / "results.json").exists()  # only rank 0 writes
    g1, g2 = load_global_state(one / "g.npz"), load_global_state(tmp_path / "node0" / "g.npz")
    assert all(np.array_equal(g1[k], g2[k]) for k in g1)
    reference = json.loads((one / "results.json").read_text())
    assert results["best_round"] == reference["best_round"]
    assert round(results["test"]["hr@10"], 4) == round(reference["test"]["hr@10"], 4)
    # the ranks' sums crossed the veth: 3 rounds of at least one m x k float64 vector each way
    assert min(_tx_bytes(ns, dev) for ns, dev, _ in two_hosts) > 3 * 300 * 8 * 8
