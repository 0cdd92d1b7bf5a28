# syntax=docker/dockerfile:1
#
# The service images, one target each, all from one build:
#
#   docker build --target watcher    -t ghcr.io/switchyard/watcher:0.1.0 .
#   docker build --target queue      -t ghcr.io/switchyard/queue:0.1.0 .
#   docker build --target reconciler -t ghcr.io/switchyard/reconciler:0.1.0 .
#   docker build --target elector    -t ghcr.io/switchyard/elector:0.1.0 .
#
# Set the names and tags the manifests use with kustomize `images:` (docs/deploy.md).

# The toolchain pinned in rust-toolchain.toml.
ARG RUST_VERSION=1.95.0

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# protoc comes from the protoc-bin-vendored crate (tools/protoc), so nothing else is installed.
# The caches keep downloaded crates and compiled dependencies between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
      --bin switchyard-watcher --bin switchyard-queue \
      --bin switchyard-reconciler --bin switchyard-elector --bin switchyard-etcd-access \
 && mkdir -p /out \
 && cp target/release/switchyard-watcher target/release/switchyard-queue \
       target/release/switchyard-reconciler target/release/switchyard-elector \
       target/release/switchyard-etcd-access /out/

# glibc and libgcc only, no shell, no package manager; runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
USER 65532:65532
# admin (/livez, /readyz, /metrics) and gRPC; the queue also serves the external metrics API.
EXPOSE 9990 8443

FROM runtime AS watcher
COPY --from=build /out/switchyard-watcher /usr/local/bin/switchyard-watcher
ENTRYPOINT ["/usr/local/bin/switchyard-watcher"]

FROM runtime AS queue
COPY --from=build /out/switchyard-queue /usr/local/bin/switchyard-queue
EXPOSE 6443
ENTRYPOINT ["/usr/local/bin/switchyard-queue"]

FROM runtime AS reconciler
COPY --from=build /out/switchyard-reconciler /usr/local/bin/switchyard-reconciler
ENTRYPOINT ["/usr/local/bin/switchyard-reconciler"]

FROM runtime AS elector
COPY --from=build /out/switchyard-elector /usr/local/bin/switchyard-elector
# components/etcd's Job runs it (etcd's users and roles) from this image.
COPY --from=build /out/switchyard-etcd-access /usr/local/bin/switchyard-etcd-access
ENTRYPOINT ["/usr/local/bin/switchyard-elector"]
