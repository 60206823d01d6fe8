# llmslo's image: `docker build -t llmslo .` (docker-compose.yml builds it). The C scanner of the
# OTLP decoder is compiled in a build stage; the runtime image has no compiler and runs as a
# non-root user.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY collector ./collector
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[postgres,grpc]"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/llmslo --create-home llmslo
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /app
COPY rules ./rules
COPY examples ./examples
USER llmslo
ENV LLMSLO_DATA_DIR=/var/lib/llmslo
EXPOSE 9464 4317
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9464/readyz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["llmslo"]
CMD ["serve", "--config", "/etc/llmslo/llmslo.yaml"]
