"""Scenario files for `llmslo simulate`: a versioned YAML spec, validated with located errors,
turned into the simulator's frozen specs. `builtin` names the scenarios shipped in the package."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from collector.config import Duration, DurationOrZero
from collector.sim.exposition import VERSIONS
from collector.sim.model import BusinessProfile, DeploymentSpec, Fleet, Incident, ModelSpec
from collector.yamlfile import YamlProblem, describe_errors, line_of, parse_yaml_mapping

BUILTIN = ("demo", "healthy", "incidents")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LengthSpec(_Strict):
    median: float = Field(gt=0)
    sigma: float = Field(0.5, ge=0, le=3)


class BusinessSpec(_Strict):
    share: float = Field(gt=0)
    prompt_tokens: LengthSpec
    output_tokens: LengthSpec
    max_tokens: int = Field(1024, gt=0)
    system_prompt_tokens: int = Field(0, ge=0)
    system_prompts: int = Field(1, ge=1)
    tenants: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    streaming_share: float = Field(0.8, ge=0, le=1)


class ModelSpecIn(_Strict):
    name: str
    params_billion: float = Field(gt=0)
    layers: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    dtype_bytes: int = Field(2, gt=0)


class DeploymentIn(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    model: ModelSpecIn
    gpu_memory_gb: float = Field(gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    replicas: int = Field(1, ge=1, le=64)
    business_types: list[str] = Field(min_length=1)
    max_num_seqs: int = Field(64, ge=1)
    max_model_len: int = Field(8192, ge=16)
    block_size: int = Field(16, ge=1)
    prefill_tokens_per_second: float = Field(8000.0, gt=0)
    decode_seconds_per_token: float = Field(0.012, gt=0)
    decode_batch_slope: float = Field(0.02, ge=0)
    # a canary: this share of its business types' requests goes to this deployment, the rest to
    # the others (unset: least-loaded routing over every replica of the business type)
    traffic_share: float | None = Field(None, gt=0, lt=1)


class IncidentIn(_Strict):
    kind: Literal[
        "latency_regression",
        "overload",
        "prefix_cache_collapse",
        "prompt_drift",
        "error_burst",
        "server_restart",
        "replica_down",
        "slow_metrics",
        "malformed_metrics",
        "gpu_memory_pressure",  # another process takes GPU memory: DCGM's FB_USED reaches `factor` of it
    ]
    start: DurationOrZero
    duration: Duration
    target: str | None = None
    factor: float = Field(1.0, gt=0)
    error_ratio: float = Field(0.0, ge=0, le=1)
    delay_seconds: float = Field(0.0, ge=0)


class WorkloadIn(_Strict):
    requests_per_second: float = Field(gt=0, le=10_000)
    daily_amplitude: float = Field(0.5, ge=0, lt=1)
    prefix_cache_ttl: Duration = 600.0


class OtlpIn(_Strict):
    endpoint: str
    headers: dict[str, str] = Field(default_factory=dict)


class ScenarioIn(_Strict):
    version: Literal["v1"]
    seed: int = 1
    start: datetime = datetime(2026, 1, 5, 10, 0, 0)  # a Monday, 10:00 (UTC when no zone is given)
    vllm_version: str = "current"
    workload: WorkloadIn
    business_types: dict[str, BusinessSpec] = Field(min_length=1)
    deployments: list[DeploymentIn] = Field(min_length=1)
    incidents: list[IncidentIn] = Field(default_factory=list)
    otlp: OtlpIn | None = None

    @field_validator("vllm_version")
    @classmethod
    def _known_version(cls, v: str) -> str:
        if v not in VERSIONS:
            raise ValueError(f"unknown vLLM naming family {v!r} (known: {', '.join(VERSIONS)})")
        return v


class ScenarioError(Exception):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class Scenario:
    """A validated scenario: its spec and the specs the simulator runs on."""

    def __init__(self, spec: ScenarioIn, source: str) -> None:
        self.spec = spec
        self.source = source
        start = spec.start if spec.start.tzinfo else spec.start.replace(tzinfo=UTC)
        self.start_unix = start.timestamp()
        self.profiles = [
            BusinessProfile(
                name,
                b.share,
                b.prompt_tokens.median,
                b.prompt_tokens.sigma,
                b.output_tokens.median,
                b.output_tokens.sigma,
                b.max_tokens,
                b.system_prompt_tokens,
                b.system_prompts,
                tuple(b.tenants),
                b.streaming_share,
            )
            for name, b in spec.business_types.items()
        ]
        self.deployments = [
            DeploymentSpec(
                name=d.name,
                model=ModelSpec(**d.model.model_dump()),
                gpu_memory_gb=d.gpu_memory_gb,
                replicas=d.replicas,
                business_types=tuple(d.business_types),
                gpu_memory_utilization=d.gpu_memory_utilization,
                max_num_seqs=d.max_num_seqs,
                max_model_len=d.max_model_len,
                block_size=d.block_size,
                prefill_tokens_per_second=d.prefill_tokens_per_second,
                decode_seconds_per_token=d.decode_seconds_per_token,
                decode_batch_slope=d.decode_batch_slope,
                traffic_share=d.traffic_share,
            )
            for d in spec.deployments
        ]
        self.incidents = [
            Incident(i.kind, i.start, i.duration, i.target, i.factor, i.error_ratio, i.delay_seconds)
            for i in spec.incidents
        ]

    @property
    def replica_names(self) -> list[str]:
        return [f"{d.name}-{i}" for d in self.deployments for i in range(d.replicas)]

    def fleet(self) -> Fleet:
        w = self.spec.workload
        hour = self.spec.start.hour + self.spec.start.minute / 60
        return Fleet(
            self.deployments,
            self.profiles,
            self.incidents,
            w.requests_per_second,
            w.daily_amplitude,
            hour,
            self.spec.seed,
            self.start_unix,
            w.prefix_cache_ttl,
        )


def load_scenario(path_or_name: str) -> Scenario:
    """A scenario from a file, or one of the built-in names (a built-in name wins over a file or
    folder of that name in the current directory: give `./demo` for the local one). Raises
    ScenarioError with every problem."""
    if path_or_name in BUILTIN:
        source = f"builtin:{path_or_name}"
        text = resources.files("collector").joinpath("data", f"scenario-{path_or_name}.yaml").read_text("utf-8")
    else:
        source = path_or_name
        try:
            text = Path(path_or_name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ScenarioError([f"{source}: cannot read: {exc}"]) from None
    return parse_scenario(text, source)


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    try:
        data, root = parse_yaml_mapping(text, source)
    except YamlProblem as exc:
        raise ScenarioError([str(exc)]) from None
    try:
        spec = ScenarioIn.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(describe_errors(exc, source, root)) from None
    problems = _cross_checks(spec, source, root)
    if problems:
        raise ScenarioError(problems)
    return Scenario(spec, source)


def _cross_checks(spec: ScenarioIn, source: str, root: object) -> list[str]:
    problems: list[str] = []

    def at(*loc: str | int) -> str:
        return f"{source}:{line_of(root, loc) or '?'}"  # type: ignore[arg-type]

    served: set[str] = set()
    names: set[str] = set()
    for i, d in enumerate(spec.deployments):
        if d.name in names:
            problems.append(f"{at('deployments', i, 'name')}: deployments[{i}].name: duplicate deployment {d.name!r}")
        names.add(d.name)
        for j, bt in enumerate(d.business_types):
            if bt not in spec.business_types:
                problems.append(
                    f"{at('deployments', i, 'business_types', j)}: deployments[{i}].business_types[{j}]: "
                    f"unknown business type {bt!r} (defined: {', '.join(sorted(spec.business_types))})"
                )
            served.add(bt)
        model = ModelSpec(**d.model.model_dump())
        dep = DeploymentSpec(
            d.name, model, d.gpu_memory_gb, d.replicas, tuple(d.business_types), d.gpu_memory_utilization
        )
        if dep.kv_capacity_tokens < d.max_model_len:
            weights = model.weight_bytes / 1e9
            usable = d.gpu_memory_gb * d.gpu_memory_utilization
            problems.append(
                f"{at('deployments', i, 'gpu_memory_gb')}: deployments[{i}]: the KV cache holds "
                f"{dep.kv_capacity_tokens} tokens ({usable:.1f} GB usable - {weights:.1f} GB of weights, "
                f"{model.kv_bytes_per_token} bytes per token), less than max_model_len {d.max_model_len}"
            )
        for name, b in spec.business_types.items():
            if name in d.business_types and b.max_tokens + b.system_prompt_tokens > d.max_model_len:
                problems.append(
                    f"{at('business_types', name, 'max_tokens')}: business_types.{name}.max_tokens: "
                    f"system prompt + max_tokens exceed max_model_len {d.max_model_len} of "
                    f"deployment {d.name!r}"
                )
    for name in spec.business_types:
        if name not in served:
            problems.append(f"{at('business_types', name)}: business_types.{name}: no deployment serves it")
    replicas = {f"{d.name}-{k}" for d in spec.deployments for k in range(d.replicas)}
    for i, inc in enumerate(spec.incidents):
        valid = names | replicas | (set(spec.business_types) if inc.kind == "prompt_drift" else set())
        if inc.target is not None and inc.target not in valid:
            problems.append(
                f"{at('incidents', i, 'target')}: incidents[{i}].target: {inc.target!r} is not a "
                f"deployment or replica{' or business type' if inc.kind == 'prompt_drift' else ''}"
            )
        needs = {
            "latency_regression": "factor",
            "overload": "factor",
            "prompt_drift": "factor",
            "error_burst": "error_ratio",
            "slow_metrics": "delay_seconds",
            "gpu_memory_pressure": "factor",
        }.get(inc.kind)
        if needs == "factor" and inc.factor == 1.0:
            problems.append(f"{at('incidents', i)}: incidents[{i}]: {inc.kind} needs a factor other than 1")
        if needs == "error_ratio" and inc.error_ratio == 0.0:
            problems.append(f"{at('incidents', i)}: incidents[{i}]: error_burst needs error_ratio > 0")
        if needs == "delay_seconds" and inc.delay_seconds == 0.0:
            problems.append(f"{at('incidents', i)}: incidents[{i}]: slow_metrics needs delay_seconds > 0")
    return problems
