use super::*;
use serde_json::json;

fn reg() -> Registry {
    Registry::builtin()
}

#[test]
fn every_built_in_preset_parses_and_says_where_it_asks() {
    let r = reg();
    assert_eq!(r.iter().count(), BUILTIN.len());
    for p in r.iter() {
        // A DNS preset names the name its resolver is asked about.
        assert!(
            ["base_url", "url", "address", "name"]
                .iter()
                .any(|k| p.params.contains_key(*k)),
            "{} has neither base_url, url, address nor name",
            p.name
        );
    }
}

#[test]
fn every_built_in_preset_makes_a_valid_request_with_its_examples() {
    // http.ok reads the HTTP status (state "@status"), which needs the engine's
    // path form for it; until then it is the one preset that cannot validate.
    let status_form_known = crate::engine::ValuePath::parse("@status").is_ok();
    for p in reg().iter() {
        if p.name == "http.ok" && !status_form_known {
            continue;
        }
        p.check(&Limits::default())
            .unwrap_or_else(|e| panic!("{}: {e:?}", p.name));
    }
}

#[test]
fn a_request_without_a_preset_passes_through_untouched() {
    let req = json!({"target": {"url": "https://x.test"}, "state": "/s", "want": ["on"]});
    assert!(matches!(reg().apply(&req).unwrap(), Cow::Borrowed(_)));
}

#[test]
fn params_fill_the_template_and_request_fields_override_it() {
    let req = json!({
        "preset": "latitude.server",
        "params": {"server_id": "sv_1", "base_url": "http://127.0.0.1:9/"},
        "want": ["on", "off"],
        "poll": {"initial": "5ms"},
        "target": {"headers": {"Authorization": "Bearer t"}}
    });
    let out = reg().apply(&req).unwrap().into_owned();
    assert_eq!(out["target"]["url"], "http://127.0.0.1:9/servers/sv_1");
    assert_eq!(out["target"]["headers"]["Authorization"], "Bearer t");
    assert_eq!(out["want"], json!(["on", "off"]));
    assert_eq!(out["poll"]["initial"], "5ms");
    assert_eq!(out["poll"]["max"], "15s", "objects merge key by key");
    assert_eq!(out["require_transition"], true);
    assert!(out.get("preset").is_none() && out.get("params").is_none());
}

#[test]
fn a_segment_value_cannot_climb_out_of_its_path_segment() {
    let req = json!({"preset": "latitude.server", "params": {"server_id": "../admin?x=1"}});
    let out = reg().apply(&req).unwrap().into_owned();
    assert_eq!(
        out["target"]["url"],
        "https://api.latitude.sh/servers/..%2Fadmin%3Fx%3D1"
    );
}

#[test]
fn a_value_in_a_jsonpath_literal_is_escaped() {
    let req = json!({"preset": "kubernetes.condition",
        "params": {"path": "/api/v1/namespaces/a/pods/b", "condition": "it's"}});
    let out = reg().apply(&req).unwrap().into_owned();
    assert_eq!(
        out["state"],
        "$.status.conditions[?@.type=='it\\'s'].status"
    );
    crate::engine::ValuePath::parse(out["state"].as_str().unwrap()).unwrap();
}

#[test]
fn missing_unknown_and_malformed_params_are_each_named() {
    let req = json!({"preset": "latitude.server",
        "params": {"sever_id": "1", "base_url": "ftp://x"}});
    let errs = reg().apply(&req).unwrap_err();
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert!(fields.contains(&"params.sever_id"), "{errs:?}");
    assert!(fields.contains(&"params.base_url"), "{errs:?}");
    assert!(fields.contains(&"params.server_id"), "{errs:?}");
    let typo = errs.iter().find(|e| e.field == "params.sever_id").unwrap();
    assert!(
        typo.message.contains("did you mean \"server_id\""),
        "{typo:?}"
    );
}

#[test]
fn an_unknown_preset_is_named_with_a_suggestion() {
    let errs = reg()
        .apply(&json!({"preset": "latitude.sever"}))
        .unwrap_err();
    assert_eq!(errs[0].field, "preset");
    assert!(errs[0].message.contains("did you mean \"latitude.server\""));
    let errs = reg().apply(&json!({"params": {"a": "b"}})).unwrap_err();
    assert_eq!(errs[0].field, "params");
}

#[test]
fn a_preset_file_must_use_every_parameter_it_declares_and_declare_every_one_it_uses() {
    let unused = r#"{"name": "a", "description": "d",
        "params": {"x": {"description": "x"}},
        "request": {"target": {"url": "https://h.test/"}, "state": "/s", "want": ["on"]}}"#;
    assert!(
        Preset::parse(unused, "a")
            .unwrap_err()
            .contains("never uses {x}")
    );
    let undeclared = r#"{"name": "a", "description": "d",
        "request": {"target": {"url": "https://h.test/{y}"}, "state": "/s", "want": ["on"]}}"#;
    assert!(
        Preset::parse(undeclared, "a")
            .unwrap_err()
            .contains("declares no parameter \"y\"")
    );
    let misnamed = r#"{"name": "b", "description": "d", "request": {}}"#;
    assert!(
        Preset::parse(misnamed, "a")
            .unwrap_err()
            .contains("file name")
    );
}

#[test]
fn doubled_braces_are_literal() {
    let text = r#"{"name": "a", "description": "d",
        "params": {"x": {"description": "x"}},
        "request": {"target": {"url": "https://h.test/{x}"}, "state": "/s", "want": ["{{{x}}}"]}}"#;
    let p = Preset::parse(text, "a").unwrap();
    let out = p.fill(&HashMap::from([("x".to_string(), "v".to_string())]));
    assert_eq!(out["want"][0], "{v}");
}

#[test]
fn merging_replaces_arrays_and_null_drops_a_field() {
    let mut base = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x"});
    merge(&mut base, &json!({"a": {"c": [3]}, "d": null}));
    assert_eq!(base, json!({"a": {"b": 1, "c": [3]}, "d": null}));
}
