# syntax=docker/dockerfile:1
# Build stage: the pinned toolchain compiles a release binary, without the drills and benches (the
# `drills` feature): the image serves CAs and holds no test tooling.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# `meshca --version` names the commit: the build context holds no .git, so it is passed in
# (docker build --build-arg MESHCA_COMMIT=$(git rev-parse --short=12 HEAD) .).
ARG MESHCA_COMMIT=unknown
RUN MESHCA_COMMIT=$MESHCA_COMMIT cargo build --release --locked --no-default-features --bin meshca \
 && strip target/release/meshca

# Runtime stage: a small Debian with only CA roots and the binary, running as a non-root user.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 meshca \
 && useradd --system --uid 65532 --gid meshca --home-dir /var/lib/meshca --shell /usr/sbin/nologin meshca \
 && install -d -o meshca -g meshca -m 0700 /var/lib/meshca
COPY --from=build /src/target/release/meshca /usr/local/bin/meshca
USER 65532:65532
ENV MESHCA_DATA_DIR=/var/lib/meshca \
    MESHCA_SDS_LISTEN=unix:///var/lib/meshca/sds.sock,0.0.0.0:5678 \
    MESHCA_ADMIN_LISTEN=0.0.0.0:5681
VOLUME ["/var/lib/meshca"]
EXPOSE 5678 5681
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/meshca"]
CMD ["serve"]
