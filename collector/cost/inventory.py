"""The inventory: which targets make up which deployment, on what GPUs, at what price, serving
what model geometry. One object the cost, capacity and SLO code all read."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

import yaml

from collector.config import DeploymentConfig, GpuSpecConfig, TargetConfig
from collector.cost.arch import ModelArch, read_arch
from collector.cost.formulas import ApiPrices

if TYPE_CHECKING:
    from collector.config import Settings

HOURS_PER_MONTH = 730.0  # 365 x 24 / 12, as cloud price sheets use


def shipped_gpus() -> dict[str, GpuSpecConfig]:
    text = resources.files("collector").joinpath("data/gpus.yaml").read_text(encoding="utf-8")
    return {name: GpuSpecConfig.model_validate(spec) for name, spec in yaml.safe_load(text).items()}


def gpu_table(settings: Settings) -> dict[str, GpuSpecConfig]:
    return {**shipped_gpus(), **settings.gpus}


@dataclass(frozen=True, slots=True)
class Deployment:
    config: DeploymentConfig
    gpu: GpuSpecConfig
    targets: tuple[str, ...]  # configured members (a counted deployment bills the ones scraped)
    arch: ModelArch | None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def gpu_hour_usd(self) -> float:
        return self.config.hourly_gpu_price

    def replica_hour_usd(self) -> float:
        return self.gpu_hour_usd * self.config.gpus_per_replica

    def fixed_hour_usd(self) -> float:
        return self.config.fixed_monthly_usd / HOURS_PER_MONTH

    @property
    def api_prices(self) -> ApiPrices | None:
        p = self.config.api_prices
        return None if p is None else ApiPrices(p.input, p.output, p.cached_input)

    @property
    def bytes_per_parameter(self) -> float | None:
        bits = self.config.weight_bits
        return None if bits is None else bits / 8.0


class Inventory:
    """Deployments by name and by member target. Targets in no deployment are unpriced: their
    work is reported, their cost is not (there is no price to allocate)."""

    def __init__(self, deployments: list[Deployment]) -> None:
        self.deployments = {d.name: d for d in deployments}
        self.of_target: dict[str, str] = {t: d.name for d in deployments for t in d.targets}

    def __bool__(self) -> bool:
        return bool(self.deployments)

    def deployment_of(self, target: str) -> Deployment | None:
        name = self.of_target.get(target)
        return None if name is None else self.deployments[name]

    @classmethod
    def from_settings(cls, settings: Settings) -> Inventory:
        gpus = gpu_table(settings)
        out = []
        for d in settings.deployments:
            members = list(d.targets)
            if d.match_labels:
                members += [t.name for t in settings.targets if _matches(t, d.match_labels) and t.name not in members]
            arch = None
            if d.model_config_path is not None:
                arch = read_arch(d.model_config_path, d.kv_cache_dtype, d.parameters)
            out.append(Deployment(d, gpus[d.gpu], tuple(members), arch))
        return cls(out)


def _matches(target: TargetConfig, labels: dict[str, str]) -> bool:
    return all(target.labels.get(k) == v for k, v in labels.items())
