"""Who may open a connection to whom under a set of Kubernetes NetworkPolicies:
a small, pure evaluator of the networking.k8s.io/v1 semantics, for the
offline manifest tests (no cluster, no CNI).

`reaches(policies, src, dst, port)` answers one query: may a pod `src` open
a connection to pod `dst` on `port` (a number; TCP unless `protocol`)?
It is allowed iff both sides allow it:
- ingress at dst: no policy of dst's namespace selects dst for Ingress (not
  isolated), or some ingress rule of such a policy admits src on that port;
- egress at src: likewise, with the Egress policies of src's namespace and
  their `to` peers.

The rules as the API documents them (NetworkPolicySpec, NetworkPolicyPeer,
NetworkPolicyPort):
- `policyTypes` defaults to ["Ingress"], plus "Egress" when the policy has
  an `egress` section;
- a rule with no `from`/`to` (or an empty one) admits every peer; a rule
  with no `ports` (or an empty list) every port;
- a peer with only `podSelector` selects pods of the policy's namespace;
  only `namespaceSelector`, every pod of the selected namespaces; both,
  those pods of those namespaces. An empty selector selects everything;
- an `ipBlock` peer is taken to admit every pod (a pod's IP may fall in
  the block: the evaluator over-approximates reach, the safe direction for
  a test that asserts that something is NOT reachable);
- a port is a number, or a name resolved against dst's container ports,
  optionally with `endPort`; `protocol` defaults to TCP;
- selectors: matchLabels and matchExpressions (In, NotIn, Exists,
  DoesNotExist).
Policies add up: there is no deny rule other than isolation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Policy = Mapping[str, Any]


@dataclass(frozen=True)
class Pod:
    """A pod as the policies see it: its labels, its namespace (and that
    namespace's labels) and its containers' named ports."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    named_ports: Mapping[str, int] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        """The namespace's labels, with the one Kubernetes always sets."""
        return {**self.namespace_labels, "kubernetes.io/metadata.name": self.namespace}


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector matches `labels` (an empty or missing selector matches everything)."""
    selector = selector or {}
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise ValueError(f"unknown selector fields {sorted(unknown)}")
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {op!r}")
    return True


def policy_types(policy: Policy) -> list[str]:
    spec = policy.get("spec", {})
    if spec.get("policyTypes"):
        return list(spec["policyTypes"])
    return ["Ingress", "Egress"] if "egress" in spec else ["Ingress"]


def _namespace(policy: Policy) -> str:
    return str(policy.get("metadata", {}).get("namespace", "default"))


def _peer_admits(peer: Mapping[str, Any], policy_ns: str, other: Pod) -> bool:
    if "ipBlock" in peer:
        return True  # over-approximation (module doc)
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], other.ns_labels()):
            return False
    elif other.namespace != policy_ns:
        return False
    return selects(peer.get("podSelector"), other.labels)


def _port_admits(entry: Mapping[str, Any], dst: Pod, port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    want = entry.get("port")
    if want is None:
        return True
    if isinstance(want, str):
        resolved = dst.named_ports.get(want)
        return resolved == port
    end = entry.get("endPort", want)
    return int(want) <= port <= int(end)


def _rule_admits(rule: Mapping[str, Any], peers_key: str, policy_ns: str, other: Pod, dst: Pod, port: int,
                 protocol: str) -> bool:
    peers = rule.get(peers_key) or []
    ports = rule.get("ports") or []
    peer_ok = not peers or any(_peer_admits(p, policy_ns, other) for p in peers)
    port_ok = not ports or any(_port_admits(p, dst, port, protocol) for p in ports)
    return peer_ok and port_ok


def _side_allows(policies: Iterable[Policy], kind: str, subject: Pod, other: Pod, dst: Pod, port: int,
                 protocol: str) -> bool:
    """Ingress (subject = dst, other = src) or Egress (subject = src, other = dst)."""
    section, peers_key = ("ingress", "from") if kind == "Ingress" else ("egress", "to")
    isolating = [p for p in policies if _namespace(p) == subject.namespace and kind in policy_types(p)
                 and selects(p.get("spec", {}).get("podSelector"), subject.labels)]
    if not isolating:
        return True
    return any(_rule_admits(rule, peers_key, _namespace(p), other, dst, port, protocol)
               for p in isolating for rule in p.get("spec", {}).get(section) or [])


def reaches(policies: Iterable[Policy], src: Pod, dst: Pod, port: int, protocol: str = "TCP") -> bool:
    """May `src` open a connection to `dst` on `port` (module doc)?"""
    policies = list(policies)
    return (_side_allows(policies, "Ingress", dst, src, dst, port, protocol)
            and _side_allows(policies, "Egress", src, dst, dst, port, protocol))


def ingress_allows(policies: Iterable[Policy], src: Pod, dst: Pod, port: int, protocol: str = "TCP") -> bool:
    """The ingress side alone: what dst's own policies admit, whatever src's egress says."""
    return _side_allows(list(policies), "Ingress", dst, src, dst, port, protocol)


def workload_pods(objs: Iterable[Mapping[str, Any]], kinds: Iterable[str]) -> list[Pod]:
    """One Pod per workload of `kinds` in rendered manifests (template labels,
    namespace and its labels from the rendered Namespace, named container ports)."""
    objs = list(objs)
    kinds = set(kinds)
    ns_labels = {o["metadata"]["name"]: dict(o["metadata"].get("labels") or {}) for o in objs
                 if o["kind"] == "Namespace"}
    pods = []
    for o in objs:
        if o["kind"] not in kinds:
            continue
        template = o["spec"]["jobTemplate"]["spec"]["template"] if o["kind"] == "CronJob" else o["spec"]["template"]
        ns = o["metadata"].get("namespace", "default")
        named = {p["name"]: int(p["containerPort"]) for c in template["spec"]["containers"]
                 for p in c.get("ports") or [] if "name" in p}
        pods.append(Pod(o["metadata"]["name"], ns, dict(template["metadata"].get("labels") or {}),
                        ns_labels.get(ns, {}), named))
    return pods
