# waitd's container image: a release build in Rust's image, then an image of
# nothing but what the binary needs (FROM scratch): the binary, the C libraries it
# links, a CA bundle, a user and the directories it writes. .ci/image builds both
# stages on every CI run, without pulling anything (docs/operations.md, "The
# image").

FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src
# Dependencies first, in their own layer: rebuilt only when Cargo.toml/Cargo.lock
# change. Cargo reads a manifest only when every target it names exists, so each
# one is stubbed: the binary and the library, and the tests and the benchmark,
# which the image never builds.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src tests benches \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && awk '/^\[\[(test|bench)\]\]/ { dir = ($0 ~ /test/) ? "tests" : "benches" } \
         dir && /^name *=/ { gsub(/^name *= *"|".*$/, ""); print dir "/" $0 ".rs"; dir = "" }' Cargo.toml \
    | while read -r stub; do echo 'fn main() {}' > "$stub"; done \
 && cargo build --release --locked --bin waitd \
 && rm -rf src
COPY migrations migrations
COPY presets presets
COPY ui ui
COPY src src
# Make sure cargo sees the real sources as newer than the stub build.
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin waitd
COPY deploy/rootfs.sh deploy/rootfs.sh
RUN sh deploy/rootfs.sh target/release/waitd image

FROM scratch
COPY --from=build /src/image/root/ /
COPY --from=build --chown=10001:10001 /src/image/home/ /var/lib/waitd/
USER 10001:10001
WORKDIR /var/lib/waitd
ENV WAITD_LISTEN=0.0.0.0:8080 \
    WAITD_LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/waitd", "healthcheck", "--server", "http://127.0.0.1:8080"]
ENTRYPOINT ["/usr/local/bin/waitd"]
CMD ["serve"]
