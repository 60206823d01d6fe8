"""Settings: one YAML file plus `LLMSLO_*` environment overrides, validated by pydantic.

Every problem is reported at once, each with where it came from (`file:line: key.path` or the
environment variable), so `llmslo check-config` can print them all and exit non-zero.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from collector.secrets import redact_url
from collector.yamlfile import YamlProblem, describe_errors, line_of, parse_yaml_mapping

DEFAULT_BUSINESS_TYPES = ("chat", "customer_service", "code_completion", "batch")
ENV_PREFIX = "LLMSLO_"

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


def parse_duration(value: object, allow_zero: bool = False) -> float:
    """'15s', '5m', '1h', '500ms', '2d' or a number of seconds -> seconds (float); 0 only where
    `allow_zero` (a setting whose 0 means "none", as scrape.commit_linger)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '15s' or '5m'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise ValueError(f"expected a duration such as '15s' or '5m', got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"duration must be {'zero or more' if allow_zero else 'positive'}, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Inverse of parse_duration for whole units: 300 -> '5m', 3600 -> '1h'."""
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


Duration = Annotated[float, BeforeValidator(parse_duration)]
# a duration for which 0 is meaningful (no linger, no settling time, an incident at the start)
DurationOrZero = Annotated[float, BeforeValidator(lambda value: parse_duration(value, allow_zero=True))]


def regex(pattern: str) -> str:
    """A regular expression setting, refused with the reason when it does not compile."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
    return pattern


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetConfig(_Strict):
    """One vLLM server's /metrics endpoint."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$", max_length=128)
    url: str
    # vllm: a vLLM server's /metrics; dcgm: NVIDIA's DCGM exporter (GPU memory, activity, power),
    # listed in a deployment's `targets:` to give its GPUs' busy share and the GPU memory alert
    kind: Literal["vllm", "dcgm"] = "vllm"
    interval: Duration | None = None
    timeout: Duration | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    business_type: str | None = None
    models: dict[str, str] = Field(default_factory=dict)
    default_model: str = "unknown"
    sample_limit: int | None = Field(None, ge=0)  # overrides scrape.sample_limit
    model_limit: int | None = Field(None, ge=0)  # overrides scrape.model_limit
    # the OTel `service.name` this server's spans carry (OTEL_SERVICE_NAME): its spans are then
    # attributed to this target (also by `service.instance.id` or `llmslo.target` = name)
    service_name: str | None = None

    @field_validator("labels")
    @classmethod
    def _label_names(cls, v: dict[str, str]) -> dict[str, str]:
        reserved = {
            "target",
            "model",
            "business_type",
            "window",
            "quantile",
            "estimated",
            "finished_reason",
            "reason",
            "job",
            "instance",
        }
        problems = []
        for name in v:
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) or name.startswith("__"):
                problems.append(f"{name!r} is not a valid Prometheus label name")
            elif name in reserved:
                problems.append(f"label {name!r} is set by llmslo itself; choose another name")
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"expected an http:// or https:// URL, got {redact_url(v)!r}")
        return v

    def business_type_of(self, model: str) -> str | None:
        return self.models.get(model, self.business_type)


class ScrapeConfig(_Strict):
    interval: Duration = 15.0
    timeout: Duration = 10.0
    # Ignored since scrapes run on fixed per-target slots (collector/sources/scrapeloop.py); still
    # accepted so that existing configuration files load.
    jitter_ratio: float = Field(0.1, ge=0.0, le=0.5, description="deprecated and ignored")
    max_body_bytes: int = Field(10 * 1024 * 1024, gt=0)
    backoff_max: Duration = 60.0  # a recovered server is seen within a minute
    # On a target's first scrape, count its counters from zero when its server started at most
    # this long ago (created-timestamp semantics); a server running longer is taken as a baseline.
    startup_lookback: Duration = 600.0
    # Per-target limits, as Prometheus' sample_limit: a scrape over either is refused whole (the
    # target is down with reason sample_limit / model_limit), so one target cannot hold the
    # store, memory or /metrics hostage. 0 = no limit.
    sample_limit: int = Field(100_000, ge=0)
    model_limit: int = Field(256, ge=0)
    # a kept label value (model_name, finished_reason) longer than this refuses the scrape, as
    # Prometheus' label_value_length_limit: 512 is what the database keeps for a model name
    label_value_length_limit: int = Field(512, ge=0, le=512)
    # When writes arrive at least twice per this long, a write waits up to this long for others
    # to share its transaction (collector/store/committer.py); 0 = commit each group at once.
    commit_linger: DurationOrZero = Field(0.25, ge=0, le=5)


class RetentionConfig(_Strict):
    minute_rollups: Duration = 48 * 3600.0  # older minutes are compacted into hours
    hour_rollups: Duration = 90 * 86400.0
    compaction_interval: Duration = 300.0


class ClassificationRule(_Strict):
    """Trace classification: when `attribute` fully matches `pattern`, set business type, tenant
    and/or track. Attributes are span or resource attributes; `model` is the normalised model name."""

    attribute: str
    pattern: str
    business_type: str | None = None
    tenant: str | None = None
    track: str | None = Field(None, min_length=1, max_length=64)

    _regex = field_validator("pattern")(lambda cls, v: regex(v))


class TracesConfig(_Strict):
    ingest_keys: list[str] = Field(default_factory=list, description="when set, OTLP requests need one of these")
    key_header: str = "authorization"  # "authorization" expects `Bearer <key>`; any other header: the raw key
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    max_concurrent_batches: int = Field(4, ge=1)
    body_read_timeout: Duration = 10.0  # a request body not received within this is answered 408
    dedupe_horizon: Duration = 24 * 3600.0
    default_business_type: str = "unassigned"
    classification: list[ClassificationRule] = Field(default_factory=list)
    # the deployment track of a request (canary, stable, a version), for `llmslo compare track=...`:
    # this span or resource attribute, else the `track_label` of the target the span came from
    track_attribute: str = Field("llmslo.track", min_length=1)
    track_label: str = Field("track", min_length=1)
    max_tracks_per_minute: int = Field(20, ge=1)
    top_tenants: int = Field(20, ge=1)
    # per minute and business type; the rest are counted under tenant (model) "other", and
    # business types no configuration names under "unassigned"
    max_tenants_per_minute: int = Field(1000, ge=1)
    max_models_per_minute: int = Field(200, ge=1)
    otlp_http_port: int | None = Field(None, ge=0, le=65535, description="also serve POST /v1/traces here (4318)")
    otlp_grpc_port: int | None = Field(
        None, ge=0, le=65535, description="serve OTLP/gRPC TraceService/Export here (4317; the grpc extra)"
    )


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(9464, ge=0, le=65535)
    # When set, /api/v1/*, /metrics, /docs and /openapi.json need `Authorization: Bearer <token>`
    # (/healthz, /readyz stay open; /v1/traces has its own ingest keys). Unset by default, with
    # the server bound to loopback.
    api_token: str | None = Field(None, min_length=16)
    # /metrics carries the per-(target, model) derived series (llmslo_serving_*, ~370 per pair with
    # three windows) only while the fleet has at most this many pairs; a larger fleet gets the
    # per-business-type series (llmslo_business_*), and per-target figures from
    # /api/v1/serving?target=... (or from Prometheus scraping vLLM directly).
    metrics_target_limit: int = Field(100, ge=0)
    # Python's switch interval while serving: how long the event loop may wait for the interpreter
    # after each socket operation while a worker thread computes (collector/gcpolicy.py: 0.5ms
    # halved /metrics' latency under load at 1,000 targets for 15 % more CPU)
    switch_interval: Duration = Field(0.005, gt=0, le=0.1)
    # ... and while a periodic pass (derive, drift, SLO evaluation) computes, when the event loop
    # would otherwise wait longest (collector/gcpolicy.py: PassSwitching)
    pass_switch_interval: Duration = Field(0.001, gt=0, le=0.1)


class ApiPricesConfig(_Strict):
    """A managed API's list prices in USD per million tokens, for the self-hosted comparison."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(None, ge=0)


class GpuSpecConfig(_Strict):
    memory_gib: float = Field(gt=0)
    bandwidth_tbps: float | None = Field(None, gt=0)
    bf16_tflops: float | None = Field(None, gt=0)
    tdp_watts: float | None = Field(None, gt=0)
    confirmed: bool = False
    source: str = ""


class DeploymentConfig(_Strict):
    """One model's replica set and what it costs: the cost model's inventory entry."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$", max_length=128)
    targets: list[str] = Field(default_factory=list, description="target names serving this deployment")
    match_labels: dict[str, str] = Field(default_factory=dict, description="or: every target with these labels")
    gpu: str = Field(description="a GPU type of the shipped table (collector/data/gpus.yaml) or of `gpus:`")
    gpus_per_replica: int = Field(1, ge=1)
    tensor_parallel: int | None = Field(None, ge=1, description="default: gpus_per_replica")
    replicas: int | None = Field(None, ge=0, description="billed replicas; unset: counted from the targets scraped")
    gpu_hour_usd: float | None = Field(None, ge=0)
    node_hour_usd: float | None = Field(None, ge=0, description="or: a node's price, split over gpus_per_node")
    gpus_per_node: int = Field(8, ge=1)
    fixed_monthly_usd: float = Field(0.0, ge=0, description="storage, network, licences: spread per hour")
    model_config_path: str | None = Field(None, description="the model's Hugging Face config.json (or its directory)")
    parameters: float | None = Field(None, gt=0, description="parameter count, when no checkpoint index gives the size")
    weight_bits: float | None = Field(None, gt=0, le=32, description="bits per weight if quantised (GPTQ g128: 4.156)")
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = Field(None, ge=1)
    gpu_memory_utilization: float = Field(0.92, gt=0, le=1)  # vLLM 0.32's default
    api_prices: ApiPricesConfig | None = None

    @property
    def hourly_gpu_price(self) -> float:
        if self.gpu_hour_usd is not None:
            return self.gpu_hour_usd
        assert self.node_hour_usd is not None
        return self.node_hour_usd / self.gpus_per_node

    @property
    def tp(self) -> int:
        return self.tensor_parallel or self.gpus_per_replica


class CostConfig(_Strict):
    # idle cost (allocated GPU time with no request running) shared over the work pro rata, as
    # OpenCost's "share idle"; false: reported per deployment as idle, owned by nobody's requests
    share_idle: bool = True
    # weight of a prefix-cache hit token relative to an uncached prompt token (hits skip prefill)
    cached_token_weight: float = Field(0.0, ge=0, le=1)
    # when vLLM exposes no prefill/decode time histograms: an output token costs this many input tokens
    output_token_multiplier: float = Field(2.5, gt=0)
    activation_headroom: float = Field(1.2, ge=1.0, le=2.0)  # the seeds' 1.1-1.3
    capacity_headroom: float = Field(0.2, ge=0, lt=1, description="spare share kept when sizing replicas")


class DriftConfig(_Strict):
    """Workload drift (collector/drift): the current window of each signal against a reference."""

    enabled: bool = True
    window: Duration = 300.0  # the current window (the running minute included)
    # how often the current window is judged (a Prometheus rule group's usual minute); until
    # session 13 every derive pass (15 s), ~5 % of the collector's CPU at 1,000 targets
    interval: Duration = 60.0
    # pinned: the baseline `llmslo drift pin --name NAME` stored (drift.baseline names it)
    reference: Literal["trailing", "hour_of_week", "pinned"] = "trailing"
    baseline: str = Field("default", max_length=128)
    reference_length: Duration = 86400.0  # trailing: this long before the current window
    weeks: int = Field(4, ge=1, le=12)  # hour_of_week: the same hours of this many previous weeks
    min_events: int = Field(100, ge=1, description="requests in the window (and the reference) to judge it")
    refresh: Duration = 600.0  # the reference and its thresholds are rebuilt this often
    severity: Literal["ticket", "page", "none"] = "ticket"  # of the LLMSLOWorkloadDrift alert
    signals: list[str] = Field(
        default_factory=lambda: [
            "prompt_length",
            "generation_length",
            "queue_time",
            "prefill_time",
            "decode_time",
            "finish_reason",
            "prefix_cache",
            "model_mix",
        ]
    )
    tenants: bool = True  # per tenant too, from gateway spans (only tenants with min_events)

    @field_validator("signals")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        from collector.drift.engine import SIGNALS

        unknown = sorted(set(v) - set(SIGNALS))
        if unknown:
            raise ValueError(f"unknown signal(s) {', '.join(unknown)} (known: {', '.join(SIGNALS)})")
        return v


class CompareConfig(_Strict):
    """The canary gate's tolerances (`llmslo compare`, `/api/v1/compare`): how much worse the
    candidate may be before the verdict is rollback, and how many requests each side needs."""

    latency_p95: float = Field(0.10, ge=0, description="p95 of TTFT/TPOT/e2e may be this much slower (0.10: 10 %)")
    latency_p50: float = Field(0.10, ge=0, description="p50 likewise")
    error_ratio: float = Field(0.005, ge=0, le=1, description="error ratio may rise by this much (0.005: 0.5 points)")
    min_requests: int = Field(100, ge=1, description="requests on each side before any verdict but hold")


class SmtpConfig(_Strict):
    """Where the weekly report is mailed (HTML body with the charts inline, Markdown alternative)."""

    host: str = Field(..., min_length=1)
    port: int = Field(587, ge=1, le=65535)
    security: Literal["starttls", "tls", "none"] = "starttls"  # tls: SMTPS (port 465)
    username: str | None = None
    password: str | None = None  # better from LLMSLO_REPORT__SMTP__PASSWORD than from the file
    sender: str = Field(..., min_length=3, alias="from")
    to: list[str] = Field(..., min_length=1)
    timeout: Duration = 30.0

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ReportConfig(_Strict):
    """The weekly capacity and cost report (collector/report): built on a schedule, stored in
    the database, delivered by webhook and e-mail."""

    enabled: bool = True  # the scheduled job; `llmslo report` works either way
    timezone: str = "UTC"  # weeks and days start at midnight here (IANA name, e.g. Europe/Berlin)
    schedule_day: Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"] = "mon"
    schedule_time: str = Field("08:00", pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")  # in `timezone`
    # the address readers reach llmslo at, for links in the webhook and the mail (/reports/<id>)
    public_url: str | None = None
    webhook_url: str | None = None
    smtp: SmtpConfig | None = None
    attempts: int = Field(5, ge=1, le=20)  # per delivery channel
    backoff: Duration = 30.0  # first retry after this long, doubling
    top_tenants: int = Field(10, ge=1, le=100)

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r} (an IANA name such as UTC or Europe/Berlin)") from None
        return v

    @field_validator("webhook_url", "public_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"expected an http:// or https:// URL, got {redact_url(v)!r}")
        return v


class ClusterConfig(_Strict):
    """Several collectors on one PostgreSQL database, each scraping its own shard of the targets
    (collector/cluster.py). Setting `name` turns it on."""

    # this collector's name, unique among the collectors sharing the database (it labels the
    # alerts of its own targets: `collector`)
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]+$", min_length=1, max_length=128)
    # the targets are split into `shards` by a hash of their name, as Prometheus' hashmod does:
    # every collector reads the same target list (the fleet map, the cost inventory need all of
    # it) and scrapes the targets of its own `shard` (0 to shards - 1)
    shards: int = Field(1, ge=1)
    shard: int = Field(0, ge=0)
    # a throughput or cost slice is judged this long after it ends, when the other collectors'
    # part of it has been published (each publishes on its SLO pass)
    settle: DurationOrZero = Field(120.0, ge=0)

    def scrapes(self, target: str) -> bool:
        """Whether this collector's shard holds `target` (md5 of the name, modulo `shards`)."""
        if self.shards == 1:
            return True
        return int.from_bytes(hashlib.md5(target.encode()).digest()[8:], "big") % self.shards == self.shard


class Settings(_Strict):
    data_dir: str = "./data"
    database_url: str | None = None
    # how long `serve` keeps retrying a database that does not answer at start-up (PostgreSQL
    # started beside llmslo) before giving up
    database_wait: Duration = 600.0
    rules: str | None = None  # SLO rules file or directory (rules/); None = no SLO evaluation
    server: ServerConfig = ServerConfig()
    scrape: ScrapeConfig = ScrapeConfig()
    retention: RetentionConfig = RetentionConfig()
    traces: TracesConfig = TracesConfig()
    windows: list[Duration] = Field(default_factory=lambda: [60.0, 300.0, 3600.0], min_length=1)
    derive_interval: Duration = 15.0
    # Windows up to this long slide over the last scrapes' deltas kept in memory (a `1m` window is
    # the last 60 s, never empty at the start of a minute); longer ones merge minute rollups. Memory
    # grows with it: every target keeps horizon / interval scrapes of cells.
    sliding_horizon: Duration = 60.0
    business_types: list[str] = Field(default_factory=lambda: list(DEFAULT_BUSINESS_TYPES))
    targets: list[TargetConfig] = Field(default_factory=list)
    deployments: list[DeploymentConfig] = Field(default_factory=list)
    gpus: dict[str, GpuSpecConfig] = Field(default_factory=dict, description="GPU types added to the table")
    cost: CostConfig = CostConfig()
    drift: DriftConfig = DriftConfig()
    compare: CompareConfig = CompareConfig()
    report: ReportConfig = ReportConfig()
    cluster: ClusterConfig = ClusterConfig()

    @field_validator("windows")
    @classmethod
    def _whole_minutes(cls, v: list[float]) -> list[float]:
        for w in v:
            if w % 60:
                raise ValueError(f"windows are merges of minute rollups: {w:g}s is not whole minutes")
        return v

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{Path(self.data_dir) / 'llmslo.db'}"

    def target_interval(self, target: TargetConfig) -> float:
        return target.interval if target.interval is not None else self.scrape.interval

    def target_timeout(self, target: TargetConfig) -> float:
        return target.timeout if target.timeout is not None else self.scrape.timeout


class ConfigError(Exception):
    """Every problem found in the configuration, each naming its location."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def load_settings(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read YAML (if given), apply LLMSLO_* overrides, validate. Raises ConfigError."""
    environ = os.environ if environ is None else environ
    source = str(path) if path is not None else "<defaults>"
    data: dict[str, Any] = {}
    root: yaml.Node | None = None
    problems: list[str] = []
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError([f"{source}: cannot read: {exc}"]) from None
        try:
            data, root = parse_yaml_mapping(text, source)
        except YamlProblem as exc:
            raise ConfigError([str(exc)]) from None
    env_paths: dict[tuple[str, ...], str] = {}
    for var, raw in sorted(environ.items()):
        if not var.startswith(ENV_PREFIX) or var == ENV_PREFIX + "CONFIG":
            continue
        keys = tuple(part.lower() for part in var[len(ENV_PREFIX) :].split("__"))
        if keys[0] not in Settings.model_fields:
            continue  # LLMSLO_* variables of other tools (LLMSLO_VLLM_ENV, ...) are not settings
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            value = raw
        if keys[-1] in ("database_url", "data_dir", "host", "url", "name"):
            value = raw  # strings that YAML would mangle (a URL with a colon stays a string)
        node: dict[str, Any] = data
        for part in keys[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"env {var}: {'.'.join(keys[:-1])} is not a mapping")
                break
            node = child
        else:
            node[keys[-1]] = value
            env_paths[keys] = var
    if problems:
        raise ConfigError(problems)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        # the checks across fields too, on what could be read, so that one pass names everything
        raise ConfigError(describe_errors(exc, source, root, env_paths) + _raw_checks(data, source, root)) from None
    problems = _cross_checks(settings, source, root)
    if problems:
        raise ConfigError(problems)
    return settings


def _rules_check(rules: object, source: str, root: yaml.Node | None) -> list[str]:
    if isinstance(rules, str) and rules and not Path(rules).exists():
        where = f"{source}:{line_of(root, ('rules',)) or '?'}"
        return [f"{where}: rules: {rules!r} does not exist (an SLO rules file or directory, relative to {Path.cwd()})"]
    return []


def _raw_checks(data: dict[str, Any], source: str, root: yaml.Node | None) -> list[str]:
    """The cross-field checks of `_cross_checks` that can run on the raw YAML when some field
    failed validation: duplicate target names, unknown business types, a rules path that is not there."""
    problems = _rules_check(data.get("rules"), source, root)
    types = data.get("business_types")
    known = set(types) if isinstance(types, list) and all(isinstance(t, str) for t in types) else None
    known = known if known is not None else set(DEFAULT_BUSINESS_TYPES)
    seen: dict[str, int] = {}
    targets = data.get("targets")
    for i, target in enumerate(targets if isinstance(targets, list) else []):
        if not isinstance(target, dict):
            continue
        where = f"{source}:{line_of(root, ('targets', i)) or '?'}"
        name = target.get("name")
        if isinstance(name, str):
            if name in seen:
                problems.append(
                    f"{where}: targets[{i}].name: duplicate target name {name!r} (also targets[{seen[name]}])"
                )
            seen.setdefault(name, i)
        btype = target.get("business_type")
        if isinstance(btype, str) and btype not in known:
            names = ", ".join(sorted(known))
            problems.append(f"{where}: targets[{i}].business_type: unknown business type {btype!r} (known: {names})")
    return problems


def _cross_checks(settings: Settings, source: str, root: yaml.Node | None) -> list[str]:
    problems: list[str] = _rules_check(settings.rules, source, root)
    seen: dict[str, int] = {}
    known = set(settings.business_types)
    for i, target in enumerate(settings.targets):
        where = f"{source}:{line_of(root, ('targets', i)) or '?'}"
        if target.name in seen:
            problems.append(
                f"{where}: targets[{i}].name: duplicate target name {target.name!r} (also targets[{seen[target.name]}])"
            )
        seen.setdefault(target.name, i)
        if target.kind == "dcgm" and (target.business_type is not None or target.models):
            problems.append(
                f"{where}: targets[{i}]: a DCGM exporter serves no requests: give it no business_type or "
                "models; list it in a deployment's `targets:` instead"
            )
        if target.business_type is not None and target.business_type not in known:
            problems.append(
                f"{where}: targets[{i}].business_type: unknown business type "
                f"{target.business_type!r} (known: {', '.join(sorted(known))})"
            )
        for model, btype in target.models.items():
            if btype not in known:
                problems.append(
                    f"{where}: targets[{i}].models.{model}: unknown business type {btype!r} "
                    f"(known: {', '.join(sorted(known))})"
                )
        timeout = settings.target_timeout(target)
        interval = settings.target_interval(target)
        if timeout > interval:
            problems.append(
                f"{where}: targets[{i}].timeout: {timeout:g}s is longer than the scrape interval {interval:g}s"
            )
    problems += _deployment_checks(settings, source, root)
    if settings.cluster.shard >= settings.cluster.shards:
        where = f"{source}:{line_of(root, ('cluster', 'shard')) or '?'}"
        problems.append(
            f"{where}: cluster.shard: {settings.cluster.shard} is not below cluster.shards "
            f"({settings.cluster.shards}); shards are numbered from 0"
        )
    if settings.cluster.shards > 1 and settings.cluster.name is None:
        where = f"{source}:{line_of(root, ('cluster', 'shards')) or '?'}"
        problems.append(f"{where}: cluster.shards: name this collector (cluster.name) to shard the targets")
    if settings.cluster.name is not None and not settings.resolved_database_url.startswith("postgresql"):
        where = f"{source}:{line_of(root, ('cluster', 'name')) or '?'}"
        problems.append(
            f"{where}: cluster.name: sharded collectors share one PostgreSQL database (database_url: "
            "postgresql+psycopg://...); the embedded SQLite database belongs to one collector"
        )
    return problems


def _deployment_checks(settings: Settings, source: str, root: yaml.Node | None) -> list[str]:
    """Each deployment: a known GPU type, a price, targets that exist and belong to no other
    deployment, a readable model config."""
    from collector.cost.arch import ArchError, read_arch
    from collector.cost.inventory import gpu_table

    problems: list[str] = []
    gpus = gpu_table(settings)
    owner: dict[str, str] = {}
    names: set[str] = set()
    by_name = {t.name: t for t in settings.targets}
    for i, d in enumerate(settings.deployments):
        where = f"{source}:{line_of(root, ('deployments', i)) or '?'}: deployments[{i}]"
        if d.name in names:
            problems.append(f"{where}.name: duplicate deployment name {d.name!r}")
        names.add(d.name)
        if d.gpu not in gpus:
            known = ", ".join(sorted(gpus))
            problems.append(f"{where}.gpu: unknown GPU type {d.gpu!r} (known: {known}; add it under `gpus:`)")
        if (d.gpu_hour_usd is None) == (d.node_hour_usd is None):
            problems.append(f"{where}: set exactly one of gpu_hour_usd and node_hour_usd")
        if not d.targets and not d.match_labels:
            problems.append(f"{where}: name its targets (`targets:`) or select them (`match_labels:`)")
        members = [by_name[n] for n in d.targets if n in by_name]
        for n in d.targets:
            if n not in by_name:
                problems.append(f"{where}.targets: no target named {n!r}")
        if d.match_labels:
            members += [t for t in settings.targets if all(t.labels.get(k) == v for k, v in d.match_labels.items())]
        for t in members:
            if owner.get(t.name, d.name) != d.name:
                problems.append(f"{where}: target {t.name!r} is already in deployment {owner[t.name]!r}")
            owner[t.name] = d.name
        if d.model_config_path is not None:
            try:
                read_arch(d.model_config_path, d.kv_cache_dtype, d.parameters)
            except ArchError as exc:
                problems.append(f"{where}.model_config_path: {exc}")
    return problems
