# attnserve: a multi-head attention inference server, as a container image.
#
#   docker build --network host -t attnserve .
#   docker run -d --name attnserve -p 50051:50051 -p 8000:8000 -p 8002:8002 \
#       --read-only --cap-drop all --security-opt no-new-privileges attnserve   # the demo model
#   docker run -v $PWD/models:/models:ro -p 50051:50051 attnserve --max-queue-delay-us 500
#
# Ports: 50051 gRPC (--grpc-address), 8000 the Open Inference Protocol's REST binding
# (--http-address; `curl localhost:8000/v2/health/ready`), 8002 Prometheus metrics
# (--metrics-address). With the --tls-* files, gRPC and REST both use TLS.
#
# Flags go after the image name (they are attnserve's, see `docker run attnserve --help`), or as
# ATTNSERVE_* environment variables. A model repository mounted at /models is served (and
# re-scanned every 5 s); without one, the embedded demo model is. Give `docker stop` more time than
# the drain may take (`docker stop -t 40`; the server's --shutdown-grace-s is 30 s).
# deploy/container-test.sh builds and tests this image with Docker, then podman (docs/DEPLOY.md).

# --- Build: the project's own install script, then only the two binaries. ---
FROM debian:bookworm AS build
WORKDIR /src
# The packages first, so this layer is reused until the install script changes.
COPY deploy/install-deps.sh deploy/
RUN bash deploy/install-deps.sh build && rm -rf /var/lib/apt/lists/*
# Only what the two binaries are built from, so edits to docs, tests or deployment files reuse
# the compiled layer.
COPY CMakeLists.txt ./
COPY core core
COPY proto proto
COPY server server
COPY client client
COPY tools/cmake tools/cmake
COPY deploy/runtime-packages.sh deploy/
# Compile jobs: two by default, as on the reference machine (`--build-arg JOBS=8` on a bigger one).
ARG JOBS=2
# The git revision `attnserve --version` and attnserve_build_info report: the build context has no
# .git, so pass it in (`--build-arg ATTNSERVE_GIT_REVISION=$(git rev-parse --short=12 HEAD)`);
# "unknown" without it.
ARG ATTNSERVE_GIT_REVISION=
RUN cmake -S . -B /build -G Ninja -DATTNSERVE_BUILD_TESTS=OFF -DATTNSERVE_BUILD_BENCHMARKS=OFF \
        -DATTNSERVE_BUILD_TOOLS=OFF \
    && cmake --build /build -j "$JOBS" --target attnserve attnserve-cli \
    && mkdir -p /out/bin \
    && cp /build/server/attnserve /build/client/cli/attnserve-cli /out/bin/ \
    && strip /out/bin/* \
    && bash deploy/runtime-packages.sh /out/bin/* > /out/runtime-packages

# --- Run: the slim base, the shared libraries those binaries load, and tini. ---
FROM debian:bookworm-slim
COPY --from=build /out/runtime-packages /tmp/runtime-packages
# tini is PID 1: it forwards SIGTERM/SIGINT to attnserve (which then drains) and reaps zombies.
# Documentation is left out except the licences; apt's lists and caches go with the layer.
# A fixed uid/gid, so Kubernetes' runAsNonRoot can check it.
RUN printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
        'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
        > /etc/dpkg/dpkg.cfg.d/attnserve-nodoc \
    && apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tini \
        $(cat /tmp/runtime-packages) \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
        /tmp/runtime-packages \
    && groupadd --system --gid 10001 attnserve \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin attnserve
COPY --from=build /out/bin/ /usr/local/bin/

USER 10001:10001
# /models is not created here: attnserve serves the demo model only while it does not exist.
# OpenMP's idle workers sleep after a short spin; setting it here spares attnserve its re-exec.
ENV ATTNSERVE_MODEL_REPOSITORY=/models \
    OMP_WAIT_POLICY=PASSIVE \
    GOMP_SPINCOUNT=1000
EXPOSE 50051 8000 8002
# The server's own health service; it assumes the default gRPC port (with another
# --grpc-address, run with --health-cmd 'attnserve-cli --target 127.0.0.1:PORT health -q'). With
# TLS on, set ATTNSERVE_CLI_TLS_CA (and for mutual TLS ATTNSERVE_CLI_TLS_CERT_CHAIN and
# ATTNSERVE_CLI_TLS_PRIVATE_KEY) in the container: attnserve-cli reads them (docs/SERVER.md).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["attnserve-cli", "--timeout-s", "3", "--max-attempts", "1", "health", "-q"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "attnserve"]
CMD []
