# waitd container image: a cached dependency layer, a release build, and a small
# non-root runtime image with a health check.

FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src
# Dependencies first, in their own layer: rebuilt only when Cargo.toml/Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
# (Every target the manifest names must exist for cargo to read it: stub them.)
RUN mkdir -p src benches && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && echo 'fn main() {}' > benches/load.rs \
 && cargo build --release --locked --bin waitd \
 && rm -rf src
COPY migrations migrations
COPY presets presets
COPY src src
# Make sure cargo sees the real sources as newer than the stub build.
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin waitd

FROM debian:12.12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/waitd --create-home waitd
COPY --from=build /src/target/release/waitd /usr/local/bin/waitd
USER 10001:10001
WORKDIR /var/lib/waitd
ENV WAITD_LISTEN=0.0.0.0:8080 \
    WAITD_LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/waitd", "healthcheck", "--server", "http://127.0.0.1:8080"]
ENTRYPOINT ["/usr/local/bin/waitd"]
CMD ["serve"]
