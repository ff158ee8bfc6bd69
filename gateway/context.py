"""What every route needs, stored on ``app.state.ctx``."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from gateway.dispatch import Dispatcher
from gateway.errors import ApiError
from gateway.metrics import GatewayMetrics
from gateway.replicas import ReplicaSet
from gateway.scheduler_client import SchedulerClient
from gateway.settings import GatewaySettings
from gateway.tokenizer import GatewayTokenizer


@dataclass(frozen=True)
class GatewayContext:
    """The replicas and the dispatcher that routes calls to them, the tokenizer, the settings and the metrics of
    one app."""

    replicas: ReplicaSet
    dispatcher: Dispatcher
    tokenizer: GatewayTokenizer
    settings: GatewaySettings
    metrics: GatewayMetrics

    @property
    def client(self) -> SchedulerClient:
        """The first replica's scheduler client (the only one with one replica)."""
        return self.replicas.replicas[0].client

    def check_model(self, model: str | None) -> None:
        """Raises ApiError 404 when ``model`` is given and is not the served model's name."""
        if model is not None and model != self.settings.model_name:
            raise ApiError(404, f"The model `{model}` does not exist; this server serves "
                                f"`{self.settings.model_name}`.", "not_found_error", "model")


def get_ctx(request: Request) -> GatewayContext:
    """The GatewayContext of the app serving ``request``."""
    return request.app.state.ctx
