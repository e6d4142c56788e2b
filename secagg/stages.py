"""The one vocabulary of protocol stages.

Every package names a secure-aggregation stage with a `Stage`: the secagg
client and server states (`state.stage`), the coordinator's round phases and
stored round states, the wire's stage-message maps, fault injection and the
command line. The value is the canonical spelling (`masked_input`: used in
round records, logs and JSON); `cli_name` is the one command-line spelling
(`masked-input`), and `Stage.parse` accepts either.

Stage order is protocol order: ADVERTISE_KEYS -> SHARE_KEYS -> SHARE_CHECK
-> MASKED_INPUT -> CONSISTENCY_CHECK (active-adversary mode only) ->
UNMASKING. SHARE_CHECK is where devices open the relayed shares and report
the senders whose shares they could not decrypt, before anyone masks
(decision D37).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Stage(enum.StrEnum):
    ADVERTISE_KEYS = "advertise_keys"
    SHARE_KEYS = "share_keys"
    SHARE_CHECK = "share_check"
    MASKED_INPUT = "masked_input"
    CONSISTENCY_CHECK = "consistency_check"
    UNMASKING = "unmasking"

    @property
    def order(self) -> int:
        """Position in protocol order (0 = ADVERTISE_KEYS)."""
        return _ORDER[self]

    @property
    def cli_name(self) -> str:
        """The command-line spelling: `masked-input`."""
        return self.value.replace("_", "-")

    @classmethod
    def parse(cls, text: str) -> Stage:
        """`masked-input` or `masked_input` -> Stage.MASKED_INPUT; ValueError
        naming the accepted spellings otherwise."""
        try:
            return cls(text.strip().lower().replace("-", "_"))
        except ValueError:
            raise ValueError(f"unknown stage {text!r}; one of {', '.join(CLI_NAMES)}") from None


_ORDER: dict[Stage, int] = {s: i for i, s in enumerate(Stage)}
#: Every stage in protocol order.
STAGES: tuple[Stage, ...] = tuple(Stage)
#: Their command-line spellings, in protocol order.
CLI_NAMES: tuple[str, ...] = tuple(s.cli_name for s in Stage)



def check_mirrors_stages(values: Iterable[str], *, owner: str) -> None:
    """The contract of a list that mirrors the stages (a round's phases, its
    stored states): the stage values among `values` are every `Stage`, in
    protocol order, one after another (nothing else between two of them).
    Raises TypeError naming `owner` otherwise. The modules that spell such a
    list as an enum (so the type checker knows its members) call this when
    they are imported, so a stage added here cannot be missed there."""
    listed = list(values)
    at = [i for i, v in enumerate(listed) if v in _VALUES]
    found = [listed[i] for i in at]
    contiguous = at == list(range(at[0], at[0] + len(at))) if at else False
    if found != list(_VALUES) or not contiguous:
        raise TypeError(f"{owner} must list every secagg stage once, in protocol order and one after another "
                        f"({', '.join(_VALUES)}); it lists {listed}")


#: The stages' values in protocol order (`check_mirrors_stages`).
_VALUES: tuple[str, ...] = tuple(s.value for s in Stage)

__all__ = ["CLI_NAMES", "STAGES", "Stage", "check_mirrors_stages"]
