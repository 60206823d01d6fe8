"""Secrets never leave llmslo: URLs and configuration values are redacted wherever they are shown
(start-up lines, /api/v1/targets, scrape errors, logs, configuration errors)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"
# words in key or query-parameter names whose values are secrets (`api_token`, `ingest_keys`, `X-Api-Key`)
_SECRET_WORDS = frozenset(
    "pass passwd password pw secret token tokens key keys apikey auth authorization credential credentials "
    "signature sig session".split()
)


def is_secret_name(name: str) -> bool:
    if name.lower() == "database_url":  # holds the password
        return True
    return any(word in _SECRET_WORDS for word in re.split(r"[^a-z0-9]+", name.lower()))


def redact_url(url: str) -> str:
    """`http://user:pw@host/metrics?token=abc&x=1` -> `http://user:***@host/metrics?token=***&x=1`;
    a database URL's password likewise. Anything unparsable is returned fully redacted."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{REDACTED}@{host}" if ":" in userinfo else f"{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, REDACTED if is_secret_name(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub(text: str, *urls: str) -> str:
    """`text` with every occurrence of the given URLs replaced by their redacted form (an HTTP
    client's error message quotes the URL it failed on)."""
    for url in urls:
        if url and url in text:
            text = text.replace(url, redact_url(url))
    return text
