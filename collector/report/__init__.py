"""The weekly capacity and cost report: what happened, what it cost, what to buy next.

`period` picks the week (calendar weeks in `report.timezone`), `build` reads every figure from
the same functions the API answers with, `charts` draws them with matplotlib, `render` writes
HTML (charts inline, no JavaScript), Markdown and JSON, `deliver` sends them by webhook and
e-mail, and `service` ties it together: built on a schedule, stored, listed at /api/v1/reports.
"""
