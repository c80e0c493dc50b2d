# One image for every luftpause process (and the test kit). Not built on the machine this was
# written on (no Docker engine there); the compose issue validates and hardens it.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV LUFTPAUSE_CONFIG=/etc/luftpause/luftpause.toml
VOLUME /var/lib/luftpause
ENTRYPOINT ["luftpause"]
