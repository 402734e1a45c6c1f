//! The committed OpenAPI document must be the one the code generates.
//! Regenerate with `WAITD_UPDATE_OPENAPI=1 cargo test --test openapi`.

#[test]
fn the_committed_openapi_document_matches_the_code() {
    let generated = waitd::api::openapi::document();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");
    if std::env::var_os("WAITD_UPDATE_OPENAPI").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json is out of date; run `WAITD_UPDATE_OPENAPI=1 cargo test --test openapi` and commit it"
    );
}

#[test]
fn the_document_is_openapi_3_1_and_names_every_route() {
    let doc: serde_json::Value = serde_json::from_str(&waitd::api::openapi::document()).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    for path in [
        "/waits",
        "/waits/{id}",
        "/waits/{id}/cancel",
        "/waits/{id}/events",
        "/events",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} missing");
    }
}
