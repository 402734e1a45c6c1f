//! The Grafana dashboard and the alert rules in `deploy/`, checked by a real
//! Prometheus (Debian's `prometheus`, which `.ci/run` installs): it scrapes a
//! waitd that has done real work (waits created and ended, polls, a webhook
//! delivered), then every panel's and every rule's expression is evaluated through
//! Prometheus's HTTP API, and each must parse and return data; `promtool check
//! rules` must pass on the rules file.

use crate::support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use support::receiver::{Answer, Receiver};
use support::replica::free_port;
use support::{App, Reply, TempDir, Upstream};

const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/waitd.json");
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/alerts.yml");

fn need(tool: &str) {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "`{tool}` is not installed: this test runs Debian's Prometheus (apt-get install prometheus; .ci/run installs it)"
    );
}

/// Every panel's expressions in the dashboard.
fn panel_exprs() -> Vec<(String, String)> {
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            out.push((
                p["title"].as_str().unwrap().to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// Every rule's `expr` (one line each, as the file's comment asks), with its
/// comparison made a `bool` one: a rule that is not firing returns no series,
/// while `x > bool 5` returns x's series as 0 or 1.
fn rule_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(RULES).unwrap();
    let mut out = Vec::new();
    let mut name = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(n) = line.strip_prefix("- alert:") {
            name = n.trim().to_string();
        } else if let Some(e) = line.strip_prefix("expr:") {
            let e = e.trim();
            let op = [" >= ", " <= ", " == ", " != ", " > ", " < "]
                .iter()
                .filter_map(|op| e.rfind(op).map(|i| (i, *op)))
                .max()
                .unwrap_or_else(|| panic!("rule {name} compares nothing: {e}"));
            let (i, op) = op;
            let as_bool = format!("{}{}bool {}", &e[..i], op, &e[i + op.len()..]);
            out.push((name.clone(), as_bool));
        }
    }
    out
}

struct Prometheus {
    child: Child,
    base: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(dir: &TempDir, target: &str) -> Prometheus {
        let config = dir.path.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {RULES}\n\
                 scrape_configs:\n  - job_name: waitd\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run prometheus");
        Prometheus {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// The result of an instant query, or Prometheus's error.
    async fn query(&self, client: &reqwest::Client, expr: &str) -> Result<Vec<Value>, String> {
        let r = client
            .get(format!(
                "{}/api/v1/query?query={}",
                self.base,
                url::form_urlencoded::byte_serialize(expr.as_bytes()).collect::<String>()
            ))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = r.json().await.map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(body.to_string());
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The first value of an instant query, if it has one.
    async fn value(&self, client: &reqwest::Client, expr: &str) -> Option<f64> {
        let r = self.query(client, expr).await.ok()?;
        r.first()?["value"][1].as_str()?.parse().ok()
    }
}

#[tokio::test]
async fn every_dashboard_panel_and_alert_rule_returns_data_from_a_real_prometheus() {
    need("prometheus");
    need("promtool");
    let check = Command::new("promtool")
        .args(["check", "rules", RULES])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    let dir = TempDir::new("waitd-prometheus");
    let app = App::start_args(support::test_args("sqlite::memory:")).await;
    let prom = Prometheus::start(&dir, app.base.trim_start_matches("http://"));
    let client = support::client();
    assert!(
        support::eventually(Duration::from_secs(30), || async {
            prom.value(&client, "up{job=\"waitd\"}").await == Some(1.0)
        })
        .await,
        "Prometheus did not scrape waitd; its log:\n{}",
        std::fs::read_to_string(dir.path.join("prometheus.log")).unwrap_or_default()
    );

    // Real work after the first scrape, so that every rate has something to rate.
    let up = Upstream::start().await;
    let hooks = Receiver::start().await;
    let hook = hooks.script("/hook", vec![Answer::code(204)]);
    let url = up.script("/s", vec![Reply::status("pending"), Reply::status("on")]);
    let mut ids = Vec::new();
    for _ in 0..5 {
        let mut spec = support::spec(&url);
        spec["notify"] =
            json!([{"url": hook, "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw3aYQ6EHrZ5k="}]);
        let (st, w) = app.create(spec).await;
        assert_eq!(st, 201, "{w}");
        ids.push(w["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        assert_eq!(app.wait_end(id).await["status"], "succeeded");
    }
    assert!(hooks.until_got("/hook", 5, Duration::from_secs(20)).await);
    assert!(
        support::eventually(Duration::from_secs(30), || async {
            prom.value(
                &client,
                "sum(increase(waitd_webhook_delivery_seconds_count[5m]))",
            )
            .await
            .is_some_and(|v| v > 0.0)
        })
        .await,
        "Prometheus did not see the work"
    );

    let mut failures = Vec::new();
    for (what, expr) in panel_exprs()
        .into_iter()
        .map(|(t, e)| (format!("panel \"{t}\""), e))
        .chain(
            rule_exprs()
                .into_iter()
                .map(|(n, e)| (format!("rule {n}"), e)),
        )
    {
        match prom.query(&client, &expr).await {
            Ok(r) if r.is_empty() => failures.push(format!("{what}: no data for {expr}")),
            Ok(r) => eprintln!("{what}: {} series, first {}", r.len(), r[0]["value"]),
            Err(e) => failures.push(format!("{what}: {expr}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    drop(prom);
    app.stop().await.0.unwrap();
}
