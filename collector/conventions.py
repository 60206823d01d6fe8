"""Every metric name, label name and unit that llmslo emits, in one place.

Names follow Prometheus conventions: the `llmslo_` prefix, base units in the name
(`_seconds`, `_ratio`, `_per_second`), counters end in `_total`.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "llmslo_"

# --- labels -----------------------------------------------------------------------------------
LABEL_TARGET: Final = "target"
LABEL_MODEL: Final = "model"
LABEL_BUSINESS_TYPE: Final = "business_type"
LABEL_WINDOW: Final = "window"
LABEL_QUANTILE: Final = "quantile"
LABEL_REASON: Final = "reason"
LABEL_FINISHED_REASON: Final = "finished_reason"
LABEL_ESTIMATED: Final = "estimated"

# --- self-metrics: one series per configured scrape target ------------------------------------
TARGET_UP: Final = PREFIX + "target_up"
SCRAPE_DURATION_SECONDS: Final = PREFIX + "scrape_duration_seconds"
SCRAPE_SAMPLES: Final = PREFIX + "scrape_samples_scraped"
SCRAPE_BODY_BYTES: Final = PREFIX + "scrape_body_bytes"
SCRAPES_TOTAL: Final = PREFIX + "scrapes_total"
SCRAPE_SLOTS_SKIPPED_TOTAL: Final = PREFIX + "scrape_slots_skipped_total"
SCRAPE_ERRORS_TOTAL: Final = PREFIX + "scrape_errors_total"
# the scrapes' group commits (collector/store/committer.py): writes per transaction
STORE_TRANSACTIONS_TOTAL: Final = PREFIX + "store_transactions_total"
STORE_WRITES_TOTAL: Final = PREFIX + "store_writes_total"
LAST_SCRAPE_TIMESTAMP_SECONDS: Final = PREFIX + "last_scrape_timestamp_seconds"
COUNTER_RESETS_TOTAL: Final = PREFIX + "counter_resets_total"
TARGET_RESTARTS_TOTAL: Final = PREFIX + "target_restarts_total"
TARGET_LAST_RESTART_SECONDS: Final = PREFIX + "target_last_restart_timestamp_seconds"
TARGET_PROCESS_START_SECONDS: Final = PREFIX + "target_process_start_time_seconds"
BUILD_INFO: Final = PREFIX + "build_info"
# sharded collectors (collector/cluster.py)
CLUSTER_LEADER: Final = PREFIX + "cluster_leader"
CLUSTER_PEERS: Final = PREFIX + "cluster_peers"
CLUSTER_COUNTS_PUBLISHED_TOTAL: Final = PREFIX + "cluster_counts_published_total"
CLUSTER_COUNTS_RECEIVED_TOTAL: Final = PREFIX + "cluster_counts_received_total"
CLUSTER_COUNTS_LATE_TOTAL: Final = PREFIX + "cluster_counts_late_total"
CLUSTER_EXCHANGE_FAILURES_TOTAL: Final = PREFIX + "cluster_exchange_failures_total"
# each periodic job (derive, drift, slo, report, ...): like Prometheus' rule-group timings
# labelled `periodic_job` (derive, drift, evaluate, ...), not `job`: a Prometheus scraping llmslo
# sets `job` itself and would rename llmslo's to `exported_job`
LABEL_PERIODIC_JOB: Final = "periodic_job"
JOB_LAST_DURATION: Final = PREFIX + "job_last_duration_seconds"
JOB_DURATION_TOTAL: Final = PREFIX + "job_duration_seconds_total"
JOB_RUNS_TOTAL: Final = PREFIX + "job_runs_total"
JOB_LAST_RUN: Final = PREFIX + "job_last_run_timestamp_seconds"
# the fleet view's encodes (/api/v1/serving without a selector), `when`: ahead (by a derive pass,
# collector/api/readahead.py) or on_request (a read that found no recent body waited for it)
FLEET_VIEW_ENCODES_TOTAL: Final = PREFIX + "fleet_view_encodes_total"
FLEET_VIEW_ENCODE_SECONDS_TOTAL: Final = PREFIX + "fleet_view_encode_seconds_total"
# the fleet map: engine series no business type claims, and those the two views disagree on
UNASSIGNED_MODELS: Final = PREFIX + "unassigned_models"
BUSINESS_TYPE_CONFLICTS: Final = PREFIX + "business_type_conflicts"

# Reasons for SCRAPE_ERRORS_TOTAL; the detailed message (with the line number) is in the API.
REASON_TIMEOUT: Final = "timeout"
REASON_CONNECT: Final = "connect"
REASON_HTTP_STATUS: Final = "http_status"
REASON_CONTENT_TYPE: Final = "content_type"
REASON_TOO_LARGE: Final = "too_large"
REASON_ENCODING: Final = "encoding"
REASON_PARSE: Final = "parse"
REASON_STORE: Final = "store"
REASON_SAMPLE_LIMIT: Final = "sample_limit"
REASON_MODEL_LIMIT: Final = "model_limit"
REASON_LABEL_LIMIT: Final = "label_limit"
SCRAPE_ERROR_REASONS: Final = (
    REASON_TIMEOUT,
    REASON_CONNECT,
    REASON_HTTP_STATUS,
    REASON_CONTENT_TYPE,
    REASON_TOO_LARGE,
    REASON_ENCODING,
    REASON_PARSE,
    REASON_STORE,
    REASON_SAMPLE_LIMIT,
    REASON_MODEL_LIMIT,
    REASON_LABEL_LIMIT,
)

# Every interpolated quantile is published with the bucket it fell in:
# llmslo_serving_ttft_seconds{quantile="0.95"} 2.2 beside
# llmslo_serving_ttft_bucket_lower_seconds{...} 1 and llmslo_serving_ttft_bucket_upper_seconds{...} 2.5
BOUND_LOWER: Final = "bucket_lower"
BOUND_UPPER: Final = "bucket_upper"


def bound_name(suffix: str, which: str) -> str:
    """`ttft_seconds` -> `ttft_bucket_lower_seconds`."""
    return suffix.removesuffix("_seconds") + f"_{which}_seconds"


# --- derived serving metrics ------------------------------------------------------------------
# Two scopes: per (target, model) under `llmslo_serving_`, per business type under
# `llmslo_business_`. They are distinct names so that a PromQL sum() never mixes the two.
SCOPE_SERVING: Final = PREFIX + "serving_"
SERVING_GROUPS_OMITTED: Final = PREFIX + "serving_groups_omitted"
SCOPE_BUSINESS: Final = PREFIX + "business_"

# latency histograms: logical name -> metric suffix (seconds)
LATENCY_SUFFIX: Final = {
    "ttft": "ttft_seconds",
    "itl": "inter_token_latency_seconds",
    "tpot": "tpot_seconds",
    "e2e": "e2e_latency_seconds",
    "queue": "queue_time_seconds",
    "prefill": "prefill_time_seconds",
    "decode": "decode_time_seconds",
}
# token-length histograms (drift): logical name -> metric suffix (tokens)
LENGTH_SUFFIX: Final = {
    "prompt_length": "prompt_length_tokens",
    "generation_length": "generation_length_tokens",
}
REQUESTS_PER_SECOND: Final = "requests_per_second"
FINISHED_RATIO: Final = "finished_ratio"
ERROR_RATIO: Final = "error_ratio"
PROMPT_TOKENS_PER_SECOND: Final = "prompt_tokens_per_second"
GENERATION_TOKENS_PER_SECOND: Final = "generation_tokens_per_second"
PREFIX_CACHE_HIT_RATIO: Final = "prefix_cache_hit_ratio"
KV_CACHE_USAGE_RATIO: Final = "kv_cache_usage_ratio"
REQUESTS_RUNNING: Final = "requests_running"
REQUESTS_WAITING: Final = "requests_waiting"
PREEMPTIONS_PER_SECOND: Final = "preemptions_per_second"

QUANTILES: Final = (0.5, 0.9, 0.95, 0.99)


def quantile_label(q: float) -> str:
    """Format a quantile for the `quantile` label without float noise ("0.95", never "0.950000001")."""
    return f"{q:.4f}".rstrip("0").rstrip(".")


# --- trace ingestion and per-request series (bounded tenant cardinality) ---------------------
LABEL_TENANT: Final = "tenant"
LABEL_RESULT: Final = "result"
LABEL_SOURCE: Final = "source"
LABEL_STATUS: Final = "status"
LABEL_TRANSPORT: Final = "transport"  # http | grpc
LABEL_MEASURED_AT: Final = "measured_at"
OTHER_TENANTS: Final = "other"
TRACE_VALUES_FOLDED: Final = PREFIX + "trace_values_folded_total"
TRACE_SPANS_TOTAL: Final = PREFIX + "trace_spans_total"
TRACE_REQUESTS_TOTAL: Final = PREFIX + "trace_export_requests_total"
TRACE_STORE_SECONDS: Final = PREFIX + "trace_batch_store_seconds"  # histogram, label `thread`
LABEL_THREAD: Final = "thread"  # event_loop | worker
TRACE_STORE_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
REQUESTS_SEEN: Final = PREFIX + "requests"  # per window, from traces
REQUESTS_TTFT: Final = PREFIX + "requests_ttft_seconds"
REQUESTS_GOODPUT: Final = PREFIX + "requests_goodput_ratio"

# --- SLOs -----------------------------------------------------------------------------------
LABEL_METRIC: Final = "metric"
LABEL_SLO: Final = "slo"
LABEL_SEVERITY: Final = "severity"
LABEL_LONG_WINDOW: Final = "long_window"
LABEL_SHORT_WINDOW: Final = "short_window"
SLO_OBJECTIVE: Final = PREFIX + "slo_objective_ratio"
SLO_SLI: Final = PREFIX + "slo_sli_ratio"
SLO_THRESHOLD_SECONDS: Final = PREFIX + "slo_threshold_seconds"
SLO_BURN_RATE: Final = PREFIX + "slo_burn_rate"
SLO_BUDGET_REMAINING: Final = PREFIX + "slo_error_budget_remaining_ratio"
SLO_GOOD_EVENTS: Final = PREFIX + "slo_good_events_total"
SLO_EVENTS: Final = PREFIX + "slo_events_total"
SLO_ALERT_FIRING: Final = PREFIX + "slo_alert_firing"
SLO_COUNTS_SAVED_THROUGH: Final = PREFIX + "slo_counts_saved_through_timestamp_seconds"
SLO_LEDGER_FILL_SECONDS: Final = PREFIX + "slo_ledger_fill_seconds"
SLO_LEDGER_FILL_ROWS: Final = PREFIX + "slo_ledger_fill_rollup_rows"
SLO_LEDGER_RECOUNTING: Final = PREFIX + "slo_ledger_recounting_keys"
SLO_LEDGER_RECOUNT_SECONDS: Final = PREFIX + "slo_ledger_recount_seconds"
SLO_LEDGER_RECOUNT_ROWS: Final = PREFIX + "slo_ledger_recount_rollup_rows"

# cost model (collector/cost): dollar counters Prometheus can rate() and sum()
COST_ALLOCATED_USD: Final = PREFIX + "cost_allocated_usd"  # counter: exposed with _total
COST_BUSY_USD: Final = PREFIX + "cost_busy_usd"
COST_ATTRIBUTED_USD: Final = PREFIX + "cost_attributed_usd"
COST_GPU_HOUR_USD: Final = PREFIX + "cost_gpu_hour_usd"

# workload drift (collector/drift)
DRIFT_STATISTIC: Final = PREFIX + "drift_statistic"
DRIFT_THRESHOLD: Final = PREFIX + "drift_threshold_psi"
DRIFT_DETECTED: Final = PREFIX + "drift_detected"
DRIFT_REFERENCE_MINUTES_TOTAL: Final = PREFIX + "drift_reference_minutes_total"  # label source: saved | rollups
