#!/usr/bin/env bash
# The README's test command: install everything the tests need, then lint, type-check and test.
# Works on a fresh machine with Python 3.11+; as root it also starts the local PostgreSQL if it is
# installed but stopped (CI=true makes the PostgreSQL tests mandatory instead of skipped).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# a C compiler builds the two scanners (collector/sources/_expscan.c, collector/traces/_otlpscan.c)
# at install; the tests hold them to the Python paths and, under CI=true, need them built
if ! command -v cc >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq >/dev/null || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null 2>&1 \
    || echo "could not install Debian's gcc (the C scanners will not be built)"
fi
.venv/bin/python -m pip install -q -e ".[test]"

# Debian's prometheus (promtool) and prometheus-alertmanager (amtool) for the rules tests,
# chromium for the weekly report's rendering test (headless screenshot), docker-compose to
# validate docker-compose.yml (it parses and checks the file without a Docker engine), and npm
# for the dashboards' type check (the test installs @grafana/schema and TypeScript with it).
PACKAGES=""
command -v promtool >/dev/null 2>&1 || PACKAGES="$PACKAGES prometheus"
command -v prometheus-alertmanager >/dev/null 2>&1 || PACKAGES="$PACKAGES prometheus-alertmanager"
command -v chromium >/dev/null 2>&1 || PACKAGES="$PACKAGES chromium"
command -v docker-compose >/dev/null 2>&1 || PACKAGES="$PACKAGES docker-compose"
command -v npm >/dev/null 2>&1 || PACKAGES="$PACKAGES nodejs npm"
command -v openssl >/dev/null 2>&1 || PACKAGES="$PACKAGES openssl"  # a certificate for the HTTPS scrape test
if [ -n "$PACKAGES" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian's$PACKAGES"
  apt-get update -qq >/dev/null || true
  # one at a time: a package that cannot be installed here (npm conflicts with a nodejs that
  # bundles its own npm) must not stop the others
  for package in $PACKAGES; do
    if [ "$package" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null 2>&1 \
      || echo "could not install Debian's $package (the tests that need it will say so)"
  done
fi

if [ "$(id -u)" = "0" ] && command -v pg_ctlcluster >/dev/null 2>&1; then
  if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
    echo "starting the local PostgreSQL cluster"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  fi
fi

echo "== ruff"
.venv/bin/ruff check collector tests
.venv/bin/ruff format --check collector tests
echo "== mypy (strict on collector/)"
.venv/bin/mypy
echo "== generated files up to date"
.venv/bin/llmslo generate --check
echo "== pytest"
# two workers, each test module whole on one of them (tests/conftest.py schedules them); most
# of the slow tests wait on clocks, servers and subprocesses rather than on this interpreter
.venv/bin/python -m pytest --ignore=tests/benchmarks --durations=15 -n "${LLMSLO_TEST_WORKERS:-2}" "$@"
