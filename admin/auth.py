"""Bearer tokens with roles (pure; no FastAPI here).

Tokens are random strings of at least MIN_TOKEN_LENGTH characters that
`fedmask admin-token` makes; the settings hold only their SHA-256. For a
random token of 192+ bits a fast hash is what every token service uses: no
dictionary exists to try, and a slow password hash (scrypt, argon2) would
cost milliseconds on every request of the top-k path (D45).

A presented token is hashed and compared with EVERY stored hash with
`hmac.compare_digest` (no early exit), so the time taken does not depend on
which entry, if any, matches. Tokens are never logged or echoed; only the
entry's `name` is (as the actor of operator actions).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from admin.settings import Role, TokenEntry

MIN_TOKEN_LENGTH = 32

#: Which roles each kind of route admits. Operators may do everything.
READ: frozenset[Role] = frozenset({Role.VIEWER, Role.OPERATOR})
TOP_K: frozenset[Role] = frozenset({Role.RECOMMENDER, Role.OPERATOR})
OPERATE: frozenset[Role] = frozenset({Role.OPERATOR})
ANY: frozenset[Role] = frozenset(Role)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who made a request: the token entry's name and role."""

    name: str
    role: Role


class Unauthenticated(Exception):
    """No token, a malformed Authorization header, or an unknown token (401)."""


class Forbidden(Exception):
    """A valid token whose role may not use the route (403); `principal` is who."""

    def __init__(self, message: str, principal: Principal) -> None:
        super().__init__(message)
        self.principal = principal


def token_hash(token: str) -> str:
    """Lower-case hex SHA-256 of the token's UTF-8 bytes (the stored form)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def check_new_token(token: str) -> None:
    """ValueError unless `token` is long enough and printable ASCII without spaces."""
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"a token needs at least {MIN_TOKEN_LENGTH} characters (got {len(token)})")
    if not all(33 <= ord(c) < 127 for c in token):
        raise ValueError("a token must be printable ASCII without spaces")


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header value."""
    if not authorization:
        raise Unauthenticated("missing bearer token (send 'Authorization: Bearer <token>')")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("malformed Authorization header (expected 'Bearer <token>')")
    return token


class TokenTable:
    """The accepted tokens, by hash."""

    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self._entries: Sequence[TokenEntry] = tuple(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def identify(self, token: str) -> Principal:
        """The principal of `token`, in time independent of which entry
        matches; Unauthenticated if none does."""
        presented = token_hash(token).encode("ascii")
        found: TokenEntry | None = None
        for entry in self._entries:
            if hmac.compare_digest(presented, entry.sha256.encode("ascii")):
                found = entry
        if found is None:
            raise Unauthenticated("unknown bearer token")
        return Principal(found.name, found.role)

    def authorize(self, authorization: str | None, allowed: frozenset[Role]) -> Principal:
        """The request's principal if its role is in `allowed`; raises
        Unauthenticated (401) or Forbidden (403)."""
        principal = self.identify(bearer_token(authorization))
        if principal.role not in allowed:
            need = " or ".join(sorted(r.value for r in allowed))
            raise Forbidden(f"role {principal.role.value!r} may not use this route (needs {need})", principal)
        return principal
