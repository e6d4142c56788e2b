"""`HostedModel`: what the coordinator's two `models`-backed server models share.

`RecommenderModel` (coordinator/model_host.py) and `PlatformServerModel`
(coordinator/platform_model_host.py) both subclass it. It lives apart from
both so that model_host, which builds platform models on demand, and
platform_model_host, which subclasses it, do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class HostedModel:
    """A `models` object behind the ServerModel protocol, built from the
    hyper-parameters `config` (sent to the devices as they are, so they
    build the same model): the update is the model's, the catalogue is
    config["n_items"]. Subclasses add the metrics and the parameters."""

    name: str
    config: dict[str, Any]
    model: Any = field(repr=False)

    @property
    def update_dim(self) -> int:
        return int(self.model.update_dim)

    @property
    def n_items(self) -> int:
        return int(self.config["n_items"])

    def hyperparameters(self) -> dict[str, Any]:
        return dict(self.config)
