# memest service: API, dashboard and /metrics. SQLite in /data by default; set MEMEST_DATABASE_URL
# (postgresql+psycopg://...) for a shared database. Writes need a bearer token: MEMEST_WRITE_TOKEN,
# or else one made on the first start and kept in /data/write-token (read back on every restart,
# never printed to the log). Behind a TLS proxy add --forwarded-allow-ips PROXY_IPS.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY memest ./memest
COPY instrumentation ./instrumentation
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[service,postgres]'

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 memest && mkdir /data && chown memest /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels 'vllm-memest[service,postgres]' && rm -rf /wheels
USER memest
WORKDIR /data
VOLUME /data
ENV MEMEST_DATABASE_URL=sqlite:////data/memest.db \
    MEMEST_WRITE_TOKEN_FILE=/data/write-token
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status == 200 else 1)"
ENTRYPOINT ["memest", "serve", "--host", "0.0.0.0", "--port", "8000"]
