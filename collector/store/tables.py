"""SQLAlchemy 2 table definitions: targets, series, their last cumulative state, and rollups."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

targets = Table(
    "llmslo_targets",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("url", Text, nullable=False),
    # Time of the last scrape whose deltas were committed; None before the first one.
    Column("baseline_unix", Float, nullable=True),
    Column("process_start_unix", Float, nullable=True),  # the server's, at that scrape (restart detection)
    Column("created_unix", Float, nullable=False),
)

series = Table(
    "llmslo_series",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("target_id", Integer, ForeignKey("llmslo_targets.id", ondelete="CASCADE"), nullable=False),
    Column("model", String(512), nullable=False),
    Column("metric", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("labels", Text, nullable=False),  # JSON list of [name, value] pairs, sorted
    Column("bounds", Text, nullable=False),  # JSON list of finite bucket bounds ("[]" if none)
    Column("unit", String(16), nullable=False, default=""),
    UniqueConstraint("target_id", "model", "metric", "kind", "labels", "bounds", name="uq_llmslo_series"),
)

series_state = Table(
    "llmslo_series_state",
    metadata,
    Column("series_id", Integer, ForeignKey("llmslo_series.id", ondelete="CASCADE"), primary_key=True),
    Column("value", Float, nullable=False),
    Column("sum", Float, nullable=False),
    Column("buckets", Text, nullable=True),
)

rollups = Table(
    "llmslo_rollups",
    metadata,
    Column("series_id", Integer, ForeignKey("llmslo_series.id", ondelete="CASCADE"), primary_key=True),
    Column("period_seconds", Integer, primary_key=True),  # 60 (minute) or 3600 (hour)
    Column("start_unix", BigInteger, primary_key=True),  # 64-bit: past 2038 on PostgreSQL too
    Column("value", Float, nullable=False),
    Column("sum", Float, nullable=False),
    Column("buckets", Text, nullable=True),
    Column("gmin", Float, nullable=True),
    Column("gmax", Float, nullable=True),
    Column("glast", Float, nullable=True),
    Column("n", Integer, nullable=False),
    Column("observed_seconds", Float, nullable=False),
    Column("last_unix", Float, nullable=False),
)

Index("ix_llmslo_rollups_window", rollups.c.period_seconds, rollups.c.start_unix)

# Alert instances of the SLO evaluator (collector/slo/alerts.py): lifecycle and delivery state.
alerts = Table(
    "llmslo_alerts",
    metadata,
    Column("fingerprint", String(256), primary_key=True),
    Column("labels", Text, nullable=False),
    Column("annotations", Text, nullable=False),
    Column("state", String(16), nullable=False),  # pending | firing | resolved
    Column("active_since_unix", Float, nullable=False),
    Column("starts_at_unix", Float, nullable=True),  # when it started firing
    Column("ends_at_unix", Float, nullable=True),  # when it resolved
    Column("updated_unix", Float, nullable=False),
    Column("sent_unix", Float, nullable=True),  # last successful delivery of the current state
    Column("delivered_state", String(16), nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_unix", Float, nullable=False, default=0.0),
    # who keeps it (collector/cluster.py): "" unsharded; a sharded collector's name for its own
    # targets' alerts; "fleet" for the SLO and business-type alerts of the elected collector
    Column("owner", String(128), nullable=False, server_default=""),
)

# SLO events counted by each sharded collector's own commits, published for the others
# (collector/cluster.py): appended once per publish, read by sequence, pruned after two hours.
slo_deltas = Table(
    "llmslo_slo_deltas",
    metadata,
    Column("publisher", String(160), primary_key=True),  # collector name / process incarnation
    Column("seq", BigInteger, primary_key=True),  # the publisher's publish number, from 1
    Column("key", String(300), primary_key=True),  # an objective, cache:<type>, slice:<slo>, cost:<size>
    Column("start_unix", BigInteger, primary_key=True),  # the minute (or slice) counted
    Column("good", Float, nullable=False),
    Column("total", Float, nullable=False),
    Column("exact", Boolean, nullable=False),
    Column("data", Text, nullable=True),  # cost slices: the per-(target, model) work, as JSON
    Column("published_unix", Float, nullable=False),  # the database's clock
)

Index("ix_llmslo_slo_deltas_published", slo_deltas.c.published_unix)

# The SLO ledger's counts (collector/slo/saved.py): each objective's good and total events per
# closed minute and hour as the ledger counted them, so that a restart reads these instead of
# every stored rollup of the SLO period (what grew with the fleet and its history).
slo_counts = Table(
    "llmslo_slo_counts",
    metadata,
    # "" unsharded; sharded, the collector's name: each one's ledger holds the whole fleet's counts
    Column("owner", String(128), primary_key=True),
    # the key in this order so that forgetting old slots is a range of it
    Column("period_seconds", Integer, primary_key=True),  # 60 or 3600
    Column("start_unix", BigInteger, primary_key=True),
    # an objective's slo, or cache:<business type>; an open slice's part: slice:<slo> (tokens as
    # good, requests as total) or cost:<slice seconds> (`data`: the per-(target, model) work)
    Column("key", String(300), primary_key=True),
    Column("good", Float, nullable=False),
    Column("total", Float, nullable=False),
    Column("data", Text, nullable=True),
)

# One row per key of llmslo_slo_counts: what its counts were counted for, and how far.
slo_count_keys = Table(
    "llmslo_slo_count_keys",
    metadata,
    Column("owner", String(128), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("fingerprint", String(64), nullable=False),  # of the objective's definition (saved.py)
    Column("exact", Boolean, nullable=False),  # no latency threshold fell between bucket bounds
    Column("through_unix", BigInteger, nullable=False),  # every closed minute before this is saved
)

# Trace ingestion: the span ids already counted (deduplication of retried batches) ...
span_keys = Table(
    "llmslo_span_keys",
    metadata,
    # the span's end in milliseconds (8 bytes, big-endian) + trace id (16) + span id (8): a retried span
    # has the same key, new spans land at the end of the index, and expiry is a range delete
    Column("id", LargeBinary(32), primary_key=True),
    sqlite_with_rowid=False,
)

# ... and per-minute request rollups (collector/traces/rollup.py, stored as JSON).
request_rollups = Table(
    "llmslo_request_rollups",
    metadata,
    Column("start_unix", BigInteger, primary_key=True),  # 64-bit: past 2038 on PostgreSQL too
    Column("period_seconds", Integer, primary_key=True),  # 60, or 3600 after compaction
    Column("business_type", String(128), primary_key=True),
    Column("model", String(512), primary_key=True),
    Column("tenant", String(256), primary_key=True),
    Column("measured_at", String(16), primary_key=True),
    Column("track", String(64), primary_key=True, server_default=""),  # "" when no span named one
    Column("data", Text, nullable=False),
)

# Pinned drift baselines (collector/drift): a reference frozen by `llmslo drift pin`, as JSON.
drift_baselines = Table(
    "llmslo_drift_baselines",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("created_unix", Float, nullable=False),
    Column("start_unix", BigInteger, nullable=False),
    Column("end_unix", BigInteger, nullable=False),
    Column("window_seconds", Integer, nullable=False),
    Column("data", Text, nullable=False),
)

# The drift reference's engine minutes, saved as they settle (collector/drift/saved.py): per
# business type and minute, each signal's population, so that a restart reads these instead of a
# day of every target's rollups. A row with business_type "" marks its minute as saved whole.
drift_minutes = Table(
    "llmslo_drift_minutes",
    metadata,
    Column("owner", String(128), primary_key=True),  # "" unsharded; sharded, the collector's name
    Column("start_unix", BigInteger, primary_key=True),
    Column("business_type", String(128), primary_key=True),
    Column("fingerprint", String(64), nullable=False),  # of the business-type mapping (saved.py)
    Column("data", Text, nullable=False),
)

# Alert episodes (collector/slo/alerts.py): one row per firing of an alert instance, kept after
# it resolves (llmslo_alerts holds only each instance's latest state). The weekly report's
# incidents section reads them.
alert_history = Table(
    "llmslo_alert_history",
    metadata,
    Column("fingerprint", String(256), primary_key=True),
    Column("starts_at_unix", Float, primary_key=True),
    Column("alertname", String(256), nullable=False),
    Column("business_type", String(128), nullable=False),
    Column("severity", String(32), nullable=False),
    Column("labels", Text, nullable=False),
    Column("summary", Text, nullable=False),
    Column("ends_at_unix", Float, nullable=True),  # null while firing
)

# Weekly reports (collector/report): what was built, and how its deliveries went.
reports = Table(
    "llmslo_reports",
    metadata,
    Column("id", String(64), primary_key=True),  # e.g. 2026-W48 or 20261123T0000-20261130T0000
    Column("start_unix", BigInteger, nullable=False),
    Column("end_unix", BigInteger, nullable=False),
    Column("created_unix", Float, nullable=False),
    Column("title", String(256), nullable=False),
    Column("data", Text, nullable=False),  # the report as JSON
    Column("html", Text, nullable=False),
    Column("markdown", Text, nullable=False),
    Column("deliveries", Text, nullable=False),  # JSON: per channel, status, attempts, last error
)
