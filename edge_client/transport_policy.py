"""Whether the edge client may send its bearer token over the channel it
is configured for (pure; imports nothing from edge_client).

    refusal = token_transport_refusal("10.0.0.5:50051", has_token=True, has_tls_ca=False,
                                      allow_insecure=False)
    -> "... would cross the network in clear ..." (None when allowed)

A token sent without TLS (no --tls-ca) to a coordinator that is not on a
loopback address crosses the network in clear, where anyone on the path
can read it and impersonate every client of the federation. `fedmask
client` refuses that unless --insecure-token-without-tls is given (the
coordinator has the matching auth.allow_insecure_token).
"""

from __future__ import annotations

from wire.protocol import is_loopback_target

INSECURE_TOKEN_FLAG = "--insecure-token-without-tls"


def token_in_clear(target: str, *, has_token: bool, has_tls_ca: bool) -> bool:
    """True when a bearer token would go to a non-loopback `target` (any
    address of a comma-separated list) without TLS."""
    return has_token and not has_tls_ca and not all(is_loopback_target(t.strip()) for t in target.split(","))


def token_transport_refusal(target: str, *, has_token: bool, has_tls_ca: bool, allow_insecure: bool) -> str | None:
    """Why the client must not start with these transport settings, or None."""
    if allow_insecure or not token_in_clear(target, has_token=has_token, has_tls_ca=has_tls_ca):
        return None
    return (
        f"--token without --tls-ca would send the bearer token to {target} over the network in clear; "
        f"give --tls-ca (the CA of the coordinator's certificate), or accept that with {INSECURE_TOKEN_FLAG}"
    )


__all__ = ["INSECURE_TOKEN_FLAG", "token_in_clear", "token_transport_refusal"]
