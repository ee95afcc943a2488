"""What the simulation needs from a deployment (SimSettings), with Knative's and KServe's defaults;
serverless/settings_from_manifest.py resolves one from an InferenceService."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from serverless.kpa import DeciderSpec, ScalerConfig
from serverless.metrics import MetricCollector

REVISION_TIMEOUT_DEFAULT_S = 300.0  # config-defaults revision-timeout-seconds
PROGRESS_DEADLINE_DEFAULT_S = 600.0  # config-deployment progress-deadline
ACTIVATOR_QUEUE_DEPTH = 10000  # activator breakerQueueDepth
KSERVE_DEFAULT_MIN_REPLICAS = 1


@dataclass
class SimSettings:
    """Everything the simulation needs from a deployment, with the source of each value in `sources`."""

    name: str = "isvc"
    component: str = "predictor"
    metric: str = "concurrency"
    aggregation_algorithm: str = "linear"
    min_scale: int = KSERVE_DEFAULT_MIN_REPLICAS
    max_scale: int = 0
    initial_scale: int = 1
    activation_scale: int = 0
    container_concurrency: int = 0
    target: float = 100.0  # per-pod `total` before utilization
    target_utilization: float = 0.7
    target_value: float = 70.0
    total_value: float = 100.0
    stable_window: float = 60.0
    panic_window_percentage: float = 10.0
    panic_window: float = 6.0
    panic_threshold_percentage: float = 200.0
    target_burst_capacity: float = 211.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_down_delay: float = 0.0
    scale_to_zero_grace_period: float = 30.0
    scale_to_zero_pod_retention_period: float = 0.0
    enable_scale_to_zero: bool = True
    activator_capacity: float = 100.0
    activator_queue_depth: int = ACTIVATOR_QUEUE_DEPTH
    timeout_s: float = REVISION_TIMEOUT_DEFAULT_S
    progress_deadline_s: float = PROGRESS_DEADLINE_DEFAULT_S
    gpus_per_pod: float = 1.0
    sources: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def decider_spec(self) -> DeciderSpec:
        return DeciderSpec(
            target_value=self.target_value,
            total_value=self.total_value,
            target_burst_capacity=self.target_burst_capacity,
            panic_threshold=self.panic_threshold_percentage / 100.0,
            max_scale_up_rate=self.max_scale_up_rate,
            max_scale_down_rate=self.max_scale_down_rate,
            activation_scale=self.activation_scale,
            stable_window=self.stable_window,
            scale_down_delay=self.scale_down_delay,
            reachable=True,
            initial_scale=self.initial_scale,
            activator_capacity=self.activator_capacity,
            scaling_metric=self.metric,
        )

    def scaler_config(self) -> ScalerConfig:
        return ScalerConfig(
            min_scale=self.min_scale,
            max_scale=self.max_scale,
            initial_scale=self.initial_scale,
            enable_scale_to_zero=self.enable_scale_to_zero,
            scale_to_zero_grace_period=self.scale_to_zero_grace_period,
            scale_to_zero_pod_retention_period=self.scale_to_zero_pod_retention_period,
            stable_window=self.stable_window,
            target_burst_capacity=self.target_burst_capacity,
            progress_deadline=self.progress_deadline_s,
        )

    def metric_collector(self) -> MetricCollector:
        # With TBC -1 the activator stays in the path: Knative has no scrape target, "no data" means 0.
        return MetricCollector(
            self.stable_window,
            self.panic_window,
            self.aggregation_algorithm,
            scrape_target=self.target_burst_capacity != -1,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
