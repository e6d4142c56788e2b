"""Where a dataset enters a federation: the interactions of a named dataset
and their train / validation / test split, the same for `fedmask simulate`,
an edge client and the demos."""

from __future__ import annotations

from typing import Literal, overload

from models.data.types import ExplicitSplit, ImplicitSplit, Interactions
from models.registry import ConfigError


def load_interactions(dataset: str, data_dir: str | None, seed: int) -> Interactions:
    """The interactions of `dataset` ("synthetic": the seeded synthetic set);
    ConfigError when its files are not there."""
    if dataset == "synthetic":
        from models.data.synthetic import synthetic

        return synthetic(seed=seed)
    from models.data.loaders import load_dataset

    try:
        return load_dataset(dataset, data_dir)
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from e


@overload
def make_split(interactions: Interactions, explicit: Literal[False], seed: int) -> ImplicitSplit: ...
@overload
def make_split(interactions: Interactions, explicit: bool, seed: int) -> ImplicitSplit | ExplicitSplit: ...
def make_split(interactions: Interactions, explicit: bool, seed: int) -> ImplicitSplit | ExplicitSplit:
    """A random per-user split of the ratings (explicit) or leave-one-out by time (implicit)."""
    from models.data.splits import leave_one_out, random_explicit_split

    return random_explicit_split(interactions, seed) if explicit else leave_one_out(interactions, seed)
