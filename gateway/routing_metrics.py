"""Prometheus metrics of the routing decisions (several replicas only; one replica is not routed):

- ``codeserve:routed_requests_total{replica, policy}``: Generate calls sent to each replica (a retry counts again,
  on the replica it went to);
- ``codeserve:route_retries_total{replica, code}``: calls refused before their first message by ``replica`` with a
  gRPC ``code`` (RESOURCE_EXHAUSTED, UNAVAILABLE) and retried once elsewhere;
- ``codeserve:route_predictions_total{outcome}``: decisions whose predicted cached tokens were ``exact`` (== the
  first message's cached_tokens), ``over`` or ``under`` the realized ones;
- ``codeserve:route_prediction_exact_share``: exact / all predictions so far (0 before the first).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class RoutingMetrics:
    """Registered in the gateway's registry, labelled with its ``model_name``."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        self.routed = Counter("codeserve:routed_requests", "Generate calls routed to each replica.",
                              ["model_name", "replica", "policy"], registry=registry)
        self.retries = Counter("codeserve:route_retries", "Calls refused before their first message and retried "
                               "once on the next-best replica, by the refusing replica and gRPC code.",
                               ["model_name", "replica", "code"], registry=registry)
        self.predictions = Counter("codeserve:route_predictions", "Routing decisions by how the predicted cached "
                                   "tokens compare with the realized ones (exact, over, under).",
                                   ["model_name", "outcome"], registry=registry)
        self.exact_share = Gauge("codeserve:route_prediction_exact_share", "Share of routing decisions whose "
                                 "predicted cached tokens equal the realized ones.", ["model_name"], registry=registry)
        self.exact_share.labels(model_name).set_function(self._share)

    def _share(self) -> float:
        """exact / all, read from the predictions counter (the one place the count lives)."""
        totals = {s.labels["outcome"]: s.value for family in self.predictions.collect() for s in family.samples
                  if s.name.endswith("_total")}
        everything = sum(totals.values())
        return totals.get("exact", 0.0) / everything if everything else 0.0

    def count_routed(self, replica: str, policy: str) -> None:
        self.routed.labels(self.model_name, replica, policy).inc()

    def count_retry(self, replica: str, code: str) -> None:
        self.retries.labels(self.model_name, replica, code).inc()

    def count_prediction(self, predicted: int, realized: int) -> None:
        """One decision's predicted vs realized cached tokens."""
        outcome = "exact" if predicted == realized else ("over" if predicted > realized else "under")
        self.predictions.labels(self.model_name, outcome).inc()
