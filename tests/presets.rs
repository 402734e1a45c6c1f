//! Presets end to end: each built-in preset against a scripted upstream answering
//! with the real API's JSON shape, pointed there with `params.base_url`; the
//! `/presets` routes; `--presets-dir`; and the 422s for bad preset requests.
//!
//! The presets poll every few seconds; the requests here override `poll` and `retry`
//! (objects merge key by key with the preset's) so the tests run in milliseconds.

use crate::support;

use serde_json::{Value, json};
use support::in_process::InProcess;
use support::*;

/// Millisecond timings, laid over a preset's own.
fn fast() -> Value {
    json!({
        "poll": {"initial": "5ms", "max": "20ms", "jitter": 0},
        "retry": {"delay": "5ms", "max_delay": "20ms"}
    })
}

/// A create request naming `preset` with `params`, fast timings, and `extra` over it.
fn with_preset(preset: &str, params: Value, extra: Value) -> Value {
    let mut req = fast();
    req["preset"] = json!(preset);
    req["params"] = params;
    if let Value::Object(m) = extra {
        for (k, v) in m {
            req[k] = v;
        }
    }
    req
}

/// `GET /servers/{id}` of the Latitude.sh API.
fn latitude_server(status: &str) -> Reply {
    Reply::json(
        200,
        json!({
            "data": {
                "id": "sv_VLMmAD8EOwop2",
                "type": "servers",
                "attributes": {
                    "hostname": "ci-runner-1",
                    "label": "ci-runner-1",
                    "role": "Bare Metal",
                    "status": status,
                    "primary_ipv4": "203.0.113.10",
                    "plan": {"id": "plan_2X6KG5mA5yPBM", "name": "c2.small.x86", "slug": "c2-small-x86"},
                    "operating_system": {"name": "Ubuntu 24.04 LTS", "slug": "ubuntu_24_04_x64_lts"},
                    "region": {"city": "São Paulo", "country": "Brazil", "site": {"slug": "SAO"}},
                    "project": {"id": "proj_6059EqYkOQj8p", "name": "ci"},
                    "created_at": "2025-06-01T12:00:00+00:00"
                }
            },
            "meta": {}
        }),
    )
}

/// `GET /virtual_machines/{id}` of the Latitude.sh API.
fn latitude_vm(status: &str) -> Reply {
    Reply::json(
        200,
        json!({
            "data": {
                "id": "vm_W6Q2D93dyvLjz",
                "type": "virtual_machines",
                "attributes": {
                    "name": "gpu-runner",
                    "status": status,
                    "plan": {"id": "plan_VE1Wd3aXDXnZJ", "name": "vm.h100.small"},
                    "operating_system": "ubuntu_24_04_x64_lts",
                    "project": {"id": "proj_6059EqYkOQj8p", "name": "ci"},
                    "created_at": "2025-06-01T12:00:00+00:00"
                }
            },
            "meta": {}
        }),
    )
}

/// `GET /kubernetes_clusters/{id}` of the Latitude.sh API.
fn latitude_cluster(phase: &str) -> Reply {
    Reply::json(
        200,
        json!({
            "data": {
                "id": "kc_7ZPqrzBNyZpL1",
                "type": "kubernetes_clusters",
                "attributes": {
                    "name": "ci-cluster",
                    "phase": phase,
                    "kubernetes_version": "v1.31.4",
                    "region": {"site": {"slug": "SAO"}},
                    "created_at": "2025-06-01T12:00:00+00:00"
                }
            },
            "meta": {}
        }),
    )
}

/// `GET …/agentPools/{pool}/machines/{machine}` of Azure Resource Manager (the shape
/// of MachineGet.json in the AKS REST specification, with the provisioning state the
/// machine poller reads).
fn aks_machine(state: &str, error: Option<Value>) -> Reply {
    let mut props = json!({
        "provisioningState": state,
        "network": {"ipAddresses": [{"ip": "10.224.0.5", "family": "IPv4"}]},
        "resourceId": "/subscriptions/26fe00f8-9173-4872-9134-bb1d2e00343a/resourceGroups/MC_rg1_clustername1_eastus/providers/Microsoft.Compute/virtualMachines/aks-agentpool1-12345678-vm0"
    });
    if let Some(e) = error {
        props["status"] = json!({"provisioningError": e});
    }
    Reply::json(
        200,
        json!({
            "id": "/subscriptions/26fe00f8-9173-4872-9134-bb1d2e00343a/resourceGroups/rg1/providers/Microsoft.ContainerService/managedClusters/clustername1/agentPools/agentpool1/machines/m1",
            "name": "m1",
            "type": "Microsoft.ContainerService/managedClusters/agentPools/machines",
            "zones": ["1"],
            "properties": props
        }),
    )
}

const AKS_PATH: &str = "/subscriptions/26fe00f8-9173-4872-9134-bb1d2e00343a/resourceGroups/rg1/providers/Microsoft.ContainerService/managedClusters/clustername1/agentPools/agentpool1/machines/m1";

fn aks_params(base: &str) -> Value {
    json!({
        "base_url": base,
        "subscription_id": "26fe00f8-9173-4872-9134-bb1d2e00343a",
        "resource_group": "rg1",
        "cluster": "clustername1",
        "agent_pool": "agentpool1",
        "machine": "m1"
    })
}

/// `GET /apis/apps/v1/namespaces/{ns}/deployments/{name}` of the Kubernetes API.
fn deployment(available: &str) -> Reply {
    Reply::json(
        200,
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "generation": 2},
            "spec": {"replicas": 3},
            "status": {
                "observedGeneration": 2,
                "replicas": 3,
                "updatedReplicas": 3,
                "readyReplicas": if available == "True" { 3 } else { 1 },
                "conditions": [
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                     "message": "ReplicaSet \"web-7d4b9c\" has successfully progressed.",
                     "lastUpdateTime": "2025-06-01T12:00:00Z", "lastTransitionTime": "2025-06-01T12:00:00Z"},
                    {"type": "Available", "status": available,
                     "reason": if available == "True" { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
                     "message": "Deployment has minimum availability.",
                     "lastUpdateTime": "2025-06-01T12:00:00Z", "lastTransitionTime": "2025-06-01T12:00:00Z"}
                ]
            }
        }),
    )
}

/// `GET /repos/{owner}/{repo}/actions/runs/{run_id}` of the GitHub REST API.
fn workflow_run(status: &str, conclusion: Option<&str>) -> Reply {
    Reply::json(
        200,
        json!({
            "id": 30433642,
            "name": "Build",
            "node_id": "MDEyOldvcmtmbG93IFJ1bjI2OTI4OQ==",
            "head_branch": "main",
            "head_sha": "acb5820ced9479c074f688cc328bf03f341a511d",
            "path": ".github/workflows/build.yml@main",
            "run_number": 562,
            "event": "push",
            "status": status,
            "conclusion": conclusion,
            "workflow_id": 159038,
            "url": "https://api.github.com/repos/octo-org/octo-repo/actions/runs/30433642",
            "html_url": "https://github.com/octo-org/octo-repo/actions/runs/30433642",
            "created_at": "2025-06-01T12:00:00Z",
            "updated_at": "2025-06-01T12:05:00Z",
            "run_attempt": 1,
            "run_started_at": "2025-06-01T12:00:00Z"
        }),
    )
}

async fn created_id(app: &App, req: Value) -> String {
    let (status, w) = app.create(req).await;
    assert_eq!(status, 201, "{w}");
    w["id"].as_str().unwrap().to_string()
}

async fn finish(app: App, db: TestDb) {
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn the_presets_route_lists_every_built_in_preset_with_its_params_and_defaults() {
    let app = InProcess::start().await;
    let (status, list) = app.get("/presets").answer().await;
    assert_eq!(status, 200, "{list}");
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "azure.aks_machine",
            "dns.resolves_to",
            "github.workflow_run",
            "grpc.serving",
            "http.ok",
            "http.status",
            "kubernetes.condition",
            "kubernetes.deleted",
            "kubernetes.job",
            "kubernetes.rollout",
            "latitude.kubernetes_cluster",
            "latitude.server",
            "latitude.server_off",
            "latitude.virtual_machine",
            "tcp.open",
            "tls.valid_for"
        ]
    );
    let lat = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "latitude.server")
        .unwrap();
    assert_eq!(
        lat["params"]["base_url"]["default"],
        "https://api.latitude.sh"
    );
    assert_eq!(lat["params"]["base_url"]["required"], false);
    assert_eq!(lat["params"]["server_id"]["required"], true);
    assert!(
        lat["description"]
            .as_str()
            .unwrap()
            .contains("require_transition")
    );
    assert!(
        lat.get("request").is_none(),
        "the list leaves templates out"
    );
    let aks = &list["items"][0];
    assert_eq!(aks["params"]["api_version"]["default"], "2025-10-01");
    app.stop().await;
}

#[tokio::test]
async fn one_preset_shows_the_request_it_stands_for_and_an_unknown_one_is_404() {
    let app = InProcess::start().await;
    let (status, p) = app.get("/presets/latitude.server").answer().await;
    assert_eq!(status, 200, "{p}");
    assert_eq!(
        p["request"]["target"]["url"],
        "{base_url}/servers/{server_id}"
    );
    assert_eq!(p["request"]["state"], "/data/attributes/status");
    assert_eq!(p["request"]["want"], json!(["on"]));
    assert_eq!(p["request"]["fail"], json!(["failed_deployment"]));
    assert_eq!(p["request"]["require_transition"], true);
    assert_eq!(
        p["request"]["poll"],
        json!({"initial": "2s", "factor": 1.5, "max": "15s"})
    );
    let (status, e) = app.get("/presets/latitude.sever").answer().await;
    assert_eq!(status, 404, "{e}");
    assert!(e["detail"].as_str().unwrap().contains("GET /presets"));
    app.stop().await;
}

#[tokio::test]
async fn latitude_server_succeeds_on_on_only_after_a_transition() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script(
        "/servers/sv_1",
        vec![
            latitude_server("on"),
            latitude_server("deploying"),
            latitude_server("on"),
        ],
    );
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset(
            "latitude.server",
            json!({"base_url": up.base, "server_id": "sv_1"}),
            json!({"target": {"headers": {"Authorization": "Bearer lat-token"}}}),
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(
        up.hits("/servers/sv_1"),
        3,
        "the first \"on\" did not count"
    );
    assert_eq!(
        up.headers_seen("/servers/sv_1")[0]["authorization"],
        "Bearer lat-token"
    );
    assert_eq!(
        end["spec"]["target"]["url"],
        format!("{}/servers/sv_1", up.base)
    );
    assert_eq!(
        end["spec"]["target"]["headers"]["Authorization"],
        "<redacted>"
    );
    finish(app, db).await;
}

#[tokio::test]
async fn latitude_server_fails_at_once_on_failed_deployment() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script(
        "/servers/sv_2",
        vec![
            latitude_server("deploying"),
            latitude_server("failed_deployment"),
        ],
    );
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset(
            "latitude.server",
            json!({"base_url": up.base, "server_id": "sv_2"}),
            json!({}),
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "failed", "{end}");
    assert_eq!(end["state"], "failed_deployment");
    finish(app, db).await;
}

#[tokio::test]
async fn latitude_server_off_succeeds_when_the_server_powers_off() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script(
        "/servers/sv_3",
        vec![latitude_server("on"), latitude_server("off")],
    );
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset(
            "latitude.server_off",
            json!({"base_url": up.base, "server_id": "sv_3"}),
            json!({}),
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["state"], "off");
    finish(app, db).await;
}

#[tokio::test]
async fn latitude_virtual_machine_succeeds_on_running_in_any_letter_case() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script(
        "/virtual_machines/vm_1",
        vec![
            latitude_vm("Scheduling"),
            latitude_vm("Starting"),
            latitude_vm("running"),
        ],
    );
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset(
            "latitude.virtual_machine",
            json!({"base_url": up.base, "vm_id": "vm_1"}),
            json!({}),
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(up.hits("/virtual_machines/vm_1"), 3);
    finish(app, db).await;
}

#[tokio::test]
async fn latitude_kubernetes_cluster_succeeds_when_provisioned_and_fails_on_failed() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script(
        "/kubernetes_clusters/kc_ok",
        vec![
            latitude_cluster("Pending"),
            latitude_cluster("Provisioning"),
            latitude_cluster("Provisioned"),
        ],
    );
    up.script(
        "/kubernetes_clusters/kc_bad",
        vec![latitude_cluster("Provisioning"), latitude_cluster("Failed")],
    );
    let app = App::start(&db).await;
    let ok = created_id(
        &app,
        with_preset(
            "latitude.kubernetes_cluster",
            json!({"base_url": up.base, "cluster_id": "kc_ok"}),
            json!({}),
        ),
    )
    .await;
    let bad = created_id(
        &app,
        with_preset(
            "latitude.kubernetes_cluster",
            json!({"base_url": up.base, "cluster_id": "kc_bad"}),
            json!({}),
        ),
    )
    .await;
    let end = app.wait_end(&ok).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["state"], "Provisioned");
    let end = app.wait_end(&bad).await;
    assert_eq!(end["status"], "failed", "{end}");
    assert_eq!(end["state"], "Failed");
    finish(app, db).await;
}

#[tokio::test]
async fn azure_aks_machine_succeeds_after_creating_and_updating() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script(
        AKS_PATH,
        vec![
            aks_machine("Creating", None),
            aks_machine("Updating", None),
            aks_machine("Succeeded", None),
        ],
    );
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset("azure.aks_machine", aks_params(&up.base), json!({})),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(up.hits(AKS_PATH), 3);
    assert_eq!(
        end["spec"]["target"]["url"],
        format!("{}{AKS_PATH}?api-version=2025-10-01", up.base)
    );
    // The preset's fixed interval survives the override of initial and max.
    assert_eq!(end["spec"]["poll"]["factor"], 1.0);
    assert_eq!(end["spec"]["retry"]["max_retries"], 10);
    assert_eq!(end["spec"]["ignore_case"], true);
    finish(app, db).await;
}

#[tokio::test]
async fn azure_aks_machine_fails_with_the_provisioning_error_as_detail() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let error = json!({
        "code": "SkuNotAvailable",
        "message": "The requested VM size Standard_D2s_v3 is currently not available in location eastus.",
        "target": "vmSize",
        "details": []
    });
    up.script(
        AKS_PATH,
        vec![
            aks_machine("Creating", None),
            aks_machine("Failed", Some(error.clone())),
        ],
    );
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset("azure.aks_machine", aks_params(&up.base), json!({})),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "failed", "{end}");
    assert_eq!(end["error_detail"], error);
    finish(app, db).await;
}

#[tokio::test]
async fn azure_aks_machine_fails_on_deleting() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script(
        AKS_PATH,
        vec![aks_machine("Creating", None), aks_machine("Deleting", None)],
    );
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset("azure.aks_machine", aks_params(&up.base), json!({})),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "failed", "{end}");
    assert_eq!(end["state"], "Deleting");
    finish(app, db).await;
}

#[tokio::test]
async fn azure_aks_machine_gives_up_after_eleven_unrecognised_states_in_a_row() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script(AKS_PATH, vec![aks_machine("Migrating", None)]);
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset("azure.aks_machine", aks_params(&up.base), json!({})),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "error", "{end}");
    assert_eq!(end["retries"], 10, "{end}");
    assert_eq!(up.hits(AKS_PATH), 11);
    assert!(
        end["reason"]
            .as_str()
            .unwrap()
            .contains("unrecognised state"),
        "{end}"
    );
    finish(app, db).await;
}

#[tokio::test]
async fn kubernetes_condition_succeeds_when_the_condition_turns_true() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let path = "/apis/apps/v1/namespaces/default/deployments/web";
    up.script(
        path,
        vec![deployment("False"), deployment("False"), deployment("True")],
    );
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset(
            "kubernetes.condition",
            json!({"base_url": up.base, "path": path, "condition": "Available"}),
            json!({"target": {"headers": {"Authorization": "Bearer sa-token"}}}),
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(up.hits(path), 3);
    assert_eq!(
        end["spec"]["state"],
        "$.status.conditions[?@.type=='Available'].status"
    );
    finish(app, db).await;
}

/// A `duration` parameter is refused past what CEL's `duration()` holds (an `i64`
/// of nanoseconds), and one at the bound is evaluated without an error.
#[tokio::test]
async fn a_duration_parameter_is_held_to_what_cel_can_hold() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let path = "/apis/apps/v1/namespaces/default/deployments/held";
    up.script(path, vec![deployment("True")]);
    let app = App::start(&db).await;
    let req = |held_for: &str| {
        let params = json!({"base_url": up.base, "path": path, "condition": "Available", "held_for": held_for});
        with_preset("kubernetes.condition", params, json!({"timeout": "300ms"}))
    };
    for over in ["2562048h", "2562047h47m17s", "9223372037s"] {
        let (status, p) = app.create(req(over)).await;
        assert_eq!(status, 422, "{over}: {p}");
        assert!(p.to_string().contains("held_for"), "{p}");
    }
    // At the bound: never held that long, so the deadline ends it. A poll may be
    // in flight when the deadline comes (its error is the deadline's), so the
    // expanded condition is also judged on the target's answer directly: it
    // evaluates to "not yet", not to an error.
    let id = created_id(&app, req("2562047h47m16s")).await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "timed_out", "{end}");
    let deadline = "the target had not answered by the wait's deadline";
    assert!(
        end["last_error"].is_null() || end["last_error"] == deadline,
        "{end}"
    );
    let limits = waitd::engine::Limits {
        min_poll_interval: std::time::Duration::from_millis(1),
        ..Default::default()
    };
    let spec = waitd::engine::Spec::from_request(&end["spec"], &limits).expect("the stored spec");
    let body: Value = serde_json::from_str(&deployment("True").body).unwrap();
    let obs = waitd::probe::judge(
        &spec,
        200,
        &Default::default(),
        Some(&body),
        waitd::engine::Observation::Answered { status: 200 },
    );
    assert!(
        matches!(
            obs,
            waitd::engine::Observation::Judged {
                success: Some(false),
                failure: false,
                ..
            }
        ),
        "{obs:?}"
    );
    finish(app, db).await;
}

#[tokio::test]
async fn github_workflow_run_succeeds_only_when_completed_with_success() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let path = "/repos/octo-org/octo-repo/actions/runs/30433642";
    up.script(
        path,
        vec![
            workflow_run("queued", None),
            workflow_run("in_progress", None),
            workflow_run("completed", Some("success")),
        ],
    );
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset(
            "github.workflow_run",
            json!({"base_url": up.base, "owner": "octo-org", "repo": "octo-repo", "run_id": 30433642}),
            json!({}),
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["state"], "completed, success");
    assert_eq!(up.hits(path), 3);
    let seen = &up.headers_seen(path)[0];
    assert_eq!(seen["accept"], "application/vnd.github+json");
    assert_eq!(seen["x-github-api-version"], "2022-11-28");
    finish(app, db).await;
}

#[tokio::test]
async fn github_workflow_run_fails_on_another_conclusion_with_the_run_url_as_detail() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let path = "/repos/octo-org/octo-repo/actions/runs/7";
    up.script(
        path,
        vec![
            workflow_run("in_progress", None),
            workflow_run("completed", Some("failure")),
        ],
    );
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset(
            "github.workflow_run",
            json!({"base_url": up.base, "owner": "octo-org", "repo": "octo-repo", "run_id": "7"}),
            json!({}),
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "failed", "{end}");
    assert_eq!(end["state"], "completed, failure");
    assert_eq!(
        end["error_detail"],
        "https://github.com/octo-org/octo-repo/actions/runs/30433642"
    );
    finish(app, db).await;
}

#[tokio::test]
async fn http_ok_succeeds_once_the_url_answers_2xx() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/healthz",
        vec![
            Reply::json(503, json!({"error": "starting"})),
            Reply {
                status: 404,
                body: "not yet".into(),
                headers: vec![],
                delay: std::time::Duration::ZERO,
            },
            Reply {
                status: 200,
                body: "ok".into(),
                headers: vec![("content-type".into(), "text/plain".into())],
                delay: std::time::Duration::ZERO,
            },
        ],
    );
    let app = App::start(&db).await;
    let id = created_id(&app, with_preset("http.ok", json!({"url": url}), json!({}))).await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["state"], "200");
    assert_eq!(up.hits("/healthz"), 3);
    finish(app, db).await;
}

#[tokio::test]
async fn tcp_open_succeeds_once_the_port_accepts() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let addr = support::replica::closed_addr();
    let mut heard = app.heard();
    let id = created_id(
        &app,
        with_preset("tcp.open", json!({"address": addr.to_string()}), json!({})),
    )
    .await;
    // Refused while nothing listens: progress, polled on.
    heard.recorded(&id).await;
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "running", "{w}");
    assert_eq!(w["state"], "refused", "{w}");
    let _open = tokio::net::TcpListener::bind(addr).await.unwrap();
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["state"], "connected", "{end}");
    assert_eq!(end["spec"]["target"]["url"], format!("tcp://{addr}"));

    for bad in [
        "db.internal",
        "db.internal:5432/x",
        "user@db:5432",
        "http://db:80",
    ] {
        let (status, p) = app
            .create(with_preset("tcp.open", json!({"address": bad}), json!({})))
            .await;
        assert_eq!(status, 422, "{bad}: {p}");
        assert_eq!(p["errors"][0]["field"], "params.address", "{bad}: {p}");
        assert!(
            p["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("host and a port"),
            "{bad}: {p}"
        );
    }
    finish(app, db).await;
}

#[tokio::test]
async fn tls_valid_for_succeeds_when_the_chain_verifies_with_days_enough_left() {
    use crate::cert_targets::{served, valid_for};
    use crate::tls_targets::pki::authority;
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let ca = authority("Preset CA");
    let ca_pem = ca.pem();
    let good = served(&valid_for(&ca, &["127.0.0.1"], 90)).await;
    let soon = served(&valid_for(&ca, &["127.0.0.1"], 3)).await;
    let elsewhere = served(&valid_for(&ca, &["svc.example"], 90)).await;
    let with_ca = json!({"target": {"tls": {"ca": ca_pem}}});

    let id = created_id(
        &app,
        with_preset(
            "tls.valid_for",
            json!({"address": good, "days": 30}),
            with_ca.clone(),
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(
        end["spec"]["success_condition"],
        "tls.verified && tls.days_left >= 30"
    );

    // Verified, but with 3 days left of the default 14: polled on, not ended.
    let id = created_id(
        &app,
        with_preset("tls.valid_for", json!({"address": soon}), with_ca.clone()),
    )
    .await;
    let seen = support::poll_for(std::time::Duration::from_secs(20), || async {
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        (w["state"] == "verified").then_some(w)
    })
    .await
    .expect("the certificate was verified");
    assert_eq!(seen["status"], "running", "{seen}");
    let (status, _) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!(status, 200);

    // Served for another name: verified once asked for it.
    let mut named = with_ca.clone();
    named["target"]["tls"]["server_name"] = json!("svc.example");
    let id = created_id(
        &app,
        with_preset(
            "tls.valid_for",
            json!({"address": elsewhere, "days": "7"}),
            named,
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");

    for days in [json!("-1"), json!("14 || true"), json!(1_000_001)] {
        let (status, p) = app
            .create(with_preset(
                "tls.valid_for",
                json!({"address": good, "days": days}),
                json!({}),
            ))
            .await;
        assert_eq!(status, 422, "{days}: {p}");
        assert_eq!(p["errors"][0]["field"], "params.days", "{days}: {p}");
    }
    finish(app, db).await;
}

#[tokio::test]
async fn a_request_may_override_any_field_of_its_preset() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script("/servers/sv_4", vec![latitude_server("off")]);
    let app = App::start(&db).await;
    let id = created_id(
        &app,
        with_preset(
            "latitude.server",
            json!({"base_url": up.base, "server_id": "sv_4"}),
            json!({
                "want": ["on", "off"],
                "require_transition": false,
                "timeout": "1m",
                "labels": {"pipeline": "42"}
            }),
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(up.hits("/servers/sv_4"), 1);
    assert_eq!(end["spec"]["want"], json!(["on", "off"]));
    assert_eq!(end["spec"]["fail"], json!(["failed_deployment"]));
    assert_eq!(end["spec"]["timeout"], "1m");
    assert_eq!(end["labels"]["pipeline"], "42");
    finish(app, db).await;
}

#[tokio::test]
async fn missing_unknown_and_malformed_params_are_a_422_naming_each() {
    let app = InProcess::start().await;
    let (status, p) = app
        .create(json!({
            "preset": "azure.aks_machine",
            "params": {
                "subscription_id": "s", "resource_group": "rg", "cluster": "c",
                "agentpool": "p", "machine": "",
                "base_url": "https://management.azure.com/?x=1"
            }
        }))
        .await;
    assert_eq!(status, 422, "{p}");
    assert_eq!(p["title"], "Invalid preset request");
    let fields: Vec<&str> = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    for f in [
        "params.agentpool",
        "params.machine",
        "params.base_url",
        "params.agent_pool",
    ] {
        assert!(fields.contains(&f), "{f} missing from {p}");
    }
    let typo = p["errors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["field"] == "params.agentpool")
        .unwrap();
    assert!(
        typo["message"]
            .as_str()
            .unwrap()
            .contains("did you mean \"agent_pool\""),
        "{typo}"
    );
    let (status, p) = app
        .create(json!({"preset": "latitude.server", "params": {"server_id": {"id": 1}}}))
        .await;
    assert_eq!(status, 422, "{p}");
    assert_eq!(p["errors"][0]["field"], "params.server_id");
    app.stop().await;
}

#[tokio::test]
async fn an_unknown_preset_or_params_without_one_is_a_422() {
    let app = InProcess::start().await;
    let (status, p) = app
        .create(json!({"preset": "latitude.servr", "params": {"server_id": "1"}}))
        .await;
    assert_eq!(status, 422, "{p}");
    assert_eq!(p["errors"][0]["field"], "preset");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("did you mean \"latitude.server\""),
        "{p}"
    );
    let (status, p) = app.create(json!({"preset": 7})).await;
    assert_eq!(status, 422, "{p}");
    assert_eq!(p["errors"][0]["field"], "preset");
    let (status, p) = app
        .create(json!({"params": {"server_id": "1"}, "target": {"url": "http://127.0.0.1:1/"}}))
        .await;
    assert_eq!(status, 422, "{p}");
    assert_eq!(p["errors"][0]["field"], "params");
    app.stop().await;
}

#[tokio::test]
async fn a_mistyped_request_field_is_still_a_400_with_a_preset() {
    let app = InProcess::start().await;
    let (status, p) = app
        .create(json!({
            "preset": "latitude.server",
            "params": {"server_id": "1", "base_url": "http://127.0.0.1:1"},
            "wnat": ["on"]
        }))
        .await;
    assert_eq!(status, 400, "{p}");
    assert_eq!(p["errors"][0]["field"], "wnat");
    app.stop().await;
}

#[tokio::test]
async fn the_presets_dir_adds_presets_and_may_replace_a_built_in_one() {
    let dir = std::env::temp_dir().join(format!("waitd-presets-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("acme.job.json"),
        json!({
            "name": "acme.job",
            "description": "Waits for an ACME batch job.",
            "params": {
                "base_url": {"description": "ACME", "kind": "base_url", "default": "https://acme.test"},
                "job": {"description": "The job id"}
            },
            "request": {
                "target": {"url": "{base_url}/jobs/{job}"},
                "state": "/job/state",
                "want": ["done"],
                "fail": ["crashed"]
            }
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("latitude.server.json"),
        json!({
            "name": "latitude.server",
            "description": "Through the company proxy.",
            "params": {
                "base_url": {"description": "proxy", "kind": "base_url", "default": "https://latitude-proxy.test"},
                "server_id": {"description": "id"}
            },
            "request": {
                "target": {"url": "{base_url}/servers/{server_id}"},
                "state": "/data/attributes/status",
                "want": ["on"]
            }
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("README.txt"), "not a preset").unwrap();

    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script(
        "/jobs/j1",
        vec![
            Reply::json(200, json!({"job": {"state": "running"}})),
            Reply::json(200, json!({"job": {"state": "done"}})),
        ],
    );
    let app = App::start_with(&db, &["--presets-dir", dir.to_str().unwrap()]).await;
    let (_, list) = app.get("/presets").await;
    // The built-in presets and acme.job; latitude.server is replaced, not added.
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        waitd::presets::Registry::builtin().iter().count() + 1,
        "{list}"
    );
    let (_, lat) = app.get("/presets/latitude.server").await;
    assert_eq!(lat["description"], "Through the company proxy.");
    let id = created_id(
        &app,
        with_preset(
            "acme.job",
            json!({"base_url": up.base, "job": "j1"}),
            json!({}),
        ),
    )
    .await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    finish(app, db).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_bad_preset_file_stops_the_server_at_start_up_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("waitd-presets-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("broken.json"),
        json!({
            "name": "broken",
            "description": "uses a parameter it does not declare",
            "request": {"target": {"url": "https://h.test/{id}"}, "state": "/s", "want": ["on"]}
        })
        .to_string(),
    )
    .unwrap();
    let db = TestDb::new().await;
    let mut args = test_args(&db.url);
    args.extend(["--presets-dir".to_string(), dir.display().to_string()]);
    let config = waitd::Config::from_args(args).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        waitd::serve(listener, config, std::future::pending()),
    )
    .await
    .expect("serve returns at once")
    .unwrap_err()
    .to_string();
    assert!(err.contains("broken.json"), "{err}");
    assert!(err.contains("declares no parameter \"id\""), "{err}");

    // A well-formed file that cannot make a valid wait is refused too.
    std::fs::write(
        dir.join("broken.json"),
        json!({
            "name": "broken",
            "description": "a want-less preset",
            "request": {"target": {"url": "https://h.test/"}, "state": "/s"}
        })
        .to_string(),
    )
    .unwrap();
    let mut args = test_args(&db.url);
    args.extend(["--presets-dir".to_string(), dir.display().to_string()]);
    let config = waitd::Config::from_args(args).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = waitd::serve(listener, config, std::future::pending())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("broken.json") && err.contains("want"), "{err}");
    db.drop_db().await;
    let _ = std::fs::remove_dir_all(&dir);
}
