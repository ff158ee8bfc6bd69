"""What every route needs, stored on ``app.state.ctx``."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from gateway.errors import ApiError
from gateway.metrics import GatewayMetrics
from gateway.scheduler_client import SchedulerClient
from gateway.settings import GatewaySettings
from gateway.tokenizer import GatewayTokenizer


@dataclass(frozen=True)
class GatewayContext:
    """The scheduler client, the tokenizer, the settings and the metrics of one app."""

    client: SchedulerClient
    tokenizer: GatewayTokenizer
    settings: GatewaySettings
    metrics: GatewayMetrics

    def check_model(self, model: str | None) -> None:
        """Raises ApiError 404 when ``model`` is given and is not the served model's name."""
        if model is not None and model != self.settings.model_name:
            raise ApiError(404, f"The model `{model}` does not exist; this server serves "
                                f"`{self.settings.model_name}`.", "not_found_error", "model")


def get_ctx(request: Request) -> GatewayContext:
    """The GatewayContext of the app serving ``request``."""
    return request.app.state.ctx
