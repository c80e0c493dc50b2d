# One image for every luftpause process and the test kit: `docker run IMAGE scheduler|dataplane|
# runtime|fake-engine|fake-mcp ...` (the ENTRYPOINT is the `luftpause` command), configured by the
# compose stack's file baked in below (service names as hosts). `up` is not one of them: it would
# read that file too; `docker run -e LUFTPAUSE_CONFIG= IMAGE up` runs the embedded default, but on
# the container's loopback, unreachable from outside: use compose.yaml for the whole stack.
#
# Stage "build" compiles the Cython hot path (setup.py: luftpause.dataplane._sse_c,
# luftpause.dataplane.apis._facts_c and luftpause.tool_calls._tool_calls_c) into a wheel, beside
# wheels of every dependency, so the runtime stage needs no compiler. setup.py keeps a failed
# extension build quiet (the pure twins serve); an image must not ship without them, so the
# runtime stage imports them all and fails the build if one is missing.
#
# BASE_IMAGE replaces python:3.11-slim in both stages, for a machine that cannot pull it: any Debian
# with python, pip and useradd will do (tools/image.sh builds one with debootstrap and builds this
# file from it).
ARG PYTHON_VERSION=3.11
ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim

FROM ${BASE_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what the wheel is built from: the layer cache survives edits to tests, docs and deploy/.
COPY pyproject.toml setup.py README.md ./
COPY _speedups/ _speedups/
COPY luftpause/ luftpause/
# With the otel extra: compose.otel.yaml exports spans from this image; with the postgresql extra,
# the runtime keeps its runs in PostgreSQL when told to (compose.postgres.yaml, the chart's
# runtime.store). The tui extra, for top and loadgen, stays out: they run on the operator's machine.
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[otel,postgresql]'

FROM ${BASE_IMAGE} AS runtime
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'luftpause[otel,postgresql]' \
    && rm -rf /wheels \
    && python -c "import luftpause.dataplane._sse_c, luftpause.dataplane.apis._facts_c, luftpause.tool_calls._tool_calls_c"
# A fixed uid, so a volume's owner is the same on every host; no login shell, no home to write.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin luftpause \
    && mkdir -p /var/lib/luftpause /etc/luftpause \
    && chown luftpause /var/lib/luftpause
# The default configuration is the compose stack's (service names as hosts); mount another file and
# point LUFTPAUSE_CONFIG at it for any other deployment.
COPY deploy/compose.toml /etc/luftpause/compose.toml
ENV LUFTPAUSE_CONFIG=/etc/luftpause/compose.toml \
    PYTHONUNBUFFERED=1
# The runtime's journal (runs.jsonl, tasks.jsonl) lives here; state_dir in deploy/*.toml names it.
VOLUME /var/lib/luftpause
WORKDIR /var/lib/luftpause
USER luftpause
EXPOSE 5000 5001 7000 8080
# No HEALTHCHECK here: the one image serves five commands on different ports (and fake-mcp has
# no /health), so each compose service declares its own.
ENTRYPOINT ["luftpause"]
CMD ["--help"]
