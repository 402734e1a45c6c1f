//! The integration tests, in one binary: the harness in `support` and the
//! dependencies' generic code are compiled once for all of them, rather than once a
//! file. Run one file's tests with `cargo test --test integration <file>::`.
//!
//! The tests that time whole processes (replicas and their leases, the browser, a
//! target's memory bound, start-up) stay binaries of their own, so that what runs
//! beside them is only their own file's tests: see `[[test]]` in Cargo.toml.

mod support;

mod api_errors;
mod api_events;
mod api_smoke;
mod api_sqlite;
mod api_waits;
mod approvals;
mod callback_hostile;
mod callbacks;
mod cel_api;
mod cel_conformance;
mod cel_differential;
mod cel_library;
mod cert_targets;
mod client;
mod client_callback;
mod client_flags;
mod client_probes;
mod client_wait;
mod conditions;
mod conditions_props;
mod connections;
mod credentials;
mod current_reads;
mod dashboard_http;
mod deploy;
mod dns_targets;
mod engine_props;
mod engine_seeds;
mod event_sources;
mod fuzz_spec;
mod group_deadlines;
mod group_props;
mod groups;
mod grpc_targets;
mod hostile_tenants;
mod jsonpath_props;
mod large_bodies;
mod methods;
mod nudges;
mod oauth2;
mod openapi;
mod openapi_answers;
mod operator_files;
mod outputs;
mod presets;
mod probe;
mod readme;
mod retention;
mod security;
mod shared_polls;
mod shutdown;
mod store_conformance;
mod tcp_targets;
mod tenant_pauses;
mod timestamps;
mod tls_targets;
mod tokens;
mod traces;
mod webhook_wake;
mod webhooks;
