"""The hot paths in C: trace ingestion (collector/traces/_otlpscan.c) and the steady-state scrape
parse (collector/sources/_expscan.c). Optional: without a compiler the install still succeeds
and collector/traces/otlp.py and collector/sources/expfmt.py use their pure-Python paths. Everything
else about the package is in pyproject.toml; this file exists because setuptools still calls
its pyproject `ext-modules` table experimental (and says so on every install)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "collector.traces._otlpscan",
            sources=["collector/traces/_otlpscan.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "collector.sources._expscan",
            sources=["collector/sources/_expscan.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
    ]
)
