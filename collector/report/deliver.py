"""Delivering a report: a webhook (JSON with a link) and e-mail over SMTP (HTML with the charts
as inline parts, the Markdown as the plain-text alternative). Each channel is retried with
exponential backoff; what happened is recorded per channel (status, attempts, last error)."""

from __future__ import annotations

import asyncio
import logging
import smtplib
import ssl
import time
from collections.abc import Awaitable, Callable
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any

import httpx

from collector.config import ReportConfig, SmtpConfig
from collector.report.render import to_html
from collector.secrets import redact_url

log = logging.getLogger(__name__)


def webhook_body(report: dict[str, Any], link: str) -> dict[str, Any]:
    """The webhook's JSON: the headline, each SLO's state, and the links. `text` is a one-line
    summary (what chat tools' incoming webhooks display)."""
    missed = [s["slo"] for s in report["slos"] if s["status"] == "missed"]
    cost = report["cost"]
    parts = [f"{report['title']}: {link}"]
    if cost["available"]:
        parts.append(f"cost ${cost['allocated_usd']:,.2f}")
    parts.append(f"{report['incidents']['count']} incident(s)")
    parts.append(f"SLOs missed: {', '.join(missed)}" if missed else "all SLOs with data met")
    return {
        "text": "; ".join(parts),
        "id": report["id"],
        "title": report["title"],
        "period": report["period"],
        "url": link,
        "markdown_url": link + ".md",
        "headline": report["headline"],
        "slos": [{"slo": s["slo"], "status": s["status"], "attainment": s["attainment"]} for s in report["slos"]],
    }


async def post_webhook(client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout: float = 30.0) -> None:
    resp = await client.post(url, json=body, timeout=timeout)
    if resp.status_code >= 300:
        raise RuntimeError(f"webhook {redact_url(url)} answered {resp.status_code}: {resp.text[:200]}")


def mail(report: dict[str, Any], charts: dict[str, bytes], markdown: str, smtp: SmtpConfig) -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = report["title"]
    msg["From"] = smtp.sender
    msg["To"] = ", ".join(smtp.to)
    msg["Date"] = formatdate(localtime=False)
    msg["Message-ID"] = make_msgid(domain="llmslo")
    msg.set_content(markdown)
    cids = {name: make_msgid(domain="llmslo") for name in charts}
    msg.add_alternative(to_html(report, charts, lambda name: "cid:" + cids[name][1:-1]), subtype="html")
    html_part = msg.get_payload()[1]  # type: ignore[index]
    assert isinstance(html_part, EmailMessage)
    for name, png in charts.items():
        html_part.add_related(png, "image", "png", cid=cids[name], filename=f"{name}.png", disposition="inline")
    return msg


def send_mail(msg: EmailMessage, smtp: SmtpConfig) -> None:
    """Blocking: connect, secure the session as configured, log in when asked, send."""
    context = ssl.create_default_context()
    server: smtplib.SMTP
    if smtp.security == "tls":
        server = smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=smtp.timeout, context=context)
    else:
        server = smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout)
    with server:
        if smtp.security == "starttls":
            server.starttls(context=context)
        if smtp.username:
            server.login(smtp.username, smtp.password or "")
        refused = server.send_message(msg)
        if refused:
            raise RuntimeError(f"the SMTP server refused {', '.join(sorted(refused))}")


async def with_retries(
    name: str,
    attempt: Callable[[], Awaitable[None]],
    record: Callable[[dict[str, Any]], None],
    attempts: int,
    backoff: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> bool:
    """Run `attempt` until it succeeds or `attempts` are used, waiting backoff, 2x, 4x ... between;
    `record` is told the channel's state after every attempt."""
    state: dict[str, Any] = {"status": "pending", "attempts": 0, "last_error": None, "delivered_unix": None}
    for n in range(1, attempts + 1):
        state["attempts"] = n
        try:
            await attempt()
        except Exception as exc:
            state["last_error"] = f"{type(exc).__name__}: {exc}"[:500]
            state["status"] = "failed" if n == attempts else "retrying"
            log.warning("report delivery by %s failed (attempt %d of %d): %s", name, n, attempts, state["last_error"])
            record(dict(state))
            if n < attempts:
                await sleep(backoff * 2 ** (n - 1))
            continue
        state["status"], state["delivered_unix"] = "delivered", time.time()
        record(dict(state))
        return True
    return False


def channels(config: ReportConfig) -> list[str]:
    out = []
    if config.webhook_url:
        out.append("webhook")
    if config.smtp is not None:
        out.append("email")
    return out
