//! The dashboard's "new wait" form on a URL of one's own, the list's target and id
//! columns, the id search, and a wait's webhooks and their deliveries with
//! Redeliver, in a real Chromium.

use super::*;
use support::receiver::{Answer, Receiver};

/// A valid webhook secret (whsec_ and the base64 of 32 bytes).
const SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// The row of wait `id` as {id, target, title}, or null.
const ROW_TEXTS: &str = "const r = document.querySelector(`[data-testid=\"wait-row\"][data-wait-id=\"${arguments[0]}\"]`); \
    if (!r) return null; \
    return {id: r.querySelector('.id-link').textContent, \
            target: r.querySelector('[data-testid=\"wait-target\"]').textContent, \
            fits: Array.from(r.querySelectorAll('.cell')).filter((c) => c.scrollWidth > c.clientWidth + 1 && !c.matches('.c-labels, .c-state, .c-target')).map((c) => c.className)};";

/// The open detail's deliveries as [{status, attempts}], or null.
const DELIVERIES: &str = "const d = document.querySelector('[data-testid=\"deliveries\"]'); \
    if (!d || d.hidden) return null; \
    return Array.from(d.querySelectorAll('[data-testid=\"delivery\"]')).map((r) => ({ \
        status: r.dataset.status, \
        attempts: Number(r.querySelector('[data-testid=\"delivery-attempts\"]').textContent)}));";

impl Browser {
    /// Types `text` into the input `css`.
    async fn type_into(&self, css: &str, text: &str) {
        self.click(css).await;
        self.c
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("typing into {css}: {e}"));
    }

    /// The wait the detail view shows, once it shows one.
    async fn detail_id(&self) -> String {
        let v = self
            .shows("a wait's detail", PATIENCE, DETAIL, vec![], |v| {
                v["id"].as_str().is_some_and(|id| !id.is_empty())
            })
            .await;
        v["id"].as_str().unwrap().to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_creates_a_wait_from_a_url_and_shows_its_target_and_webhooks() {
    let _serial = SERIAL.lock().await;
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--tokens", TOKENS]).await;
    let up = Upstream::start().await;
    let hooks = Receiver::start().await;
    let browser = Browser::start().await;
    let b = &browser;
    let scenario = async {
        let api = Api::new(&app.base);
        b.c.goto(&format!("{}/", app.base)).await.unwrap();
        b.enter_token().await;

        // A wait on a URL, its state and the wanted state, from the form.
        let url = up.script(
            "/servers/form",
            vec![Reply::status("deploying"), Reply::status("on")],
        );
        b.click("[data-testid=\"new-wait\"]").await;
        b.type_into("[data-testid=\"own-target-url\"]", &url).await;
        b.type_into("[data-testid=\"own-state\"]", "/data/attributes/status")
            .await;
        b.type_into("[data-testid=\"own-want\"]", "on").await;
        b.click("[data-testid=\"create-submit\"]").await;
        let id = b.detail_id().await;
        let w = api.get(&format!("/waits/{id}")).await;
        assert_eq!(w["spec"]["target"]["url"], url, "{w}");
        assert_eq!(w["spec"]["want"], json!(["on"]), "{w}");
        b.shows("the wait succeeding", PATIENCE, DETAIL, vec![], |v| {
            v["status"] == "succeeded"
        })
        .await;

        // Its row: the id's head, as the CLI prints the id first, and the target.
        let row = b
            .shows(
                "the new wait's row",
                PATIENCE,
                ROW_TEXTS,
                vec![json!(id)],
                |v| !v.is_null(),
            )
            .await;
        assert_eq!(row["id"], format!("{}…", &id[..18]), "{row}");
        let target = url.trim_start_matches("http://");
        assert_eq!(row["target"], target, "{row}");
        assert_eq!(row["fits"], json!([]), "columns cut their text: {row}");

        // A condition instead of a state: a 404 means done.
        b.click("[data-testid=\"close-detail\"]").await;
        let gone = up.script("/volumes/v9", vec![Reply::json(404, json!({}))]);
        b.click("[data-testid=\"new-wait\"]").await;
        b.type_into("[data-testid=\"own-target-url\"]", &gone).await;
        b.type_into("[data-testid=\"own-success_condition\"]", "status == 404")
            .await;
        b.click("[data-testid=\"create-submit\"]").await;
        let cond = b.detail_id().await;
        assert_ne!(cond, id);
        b.shows("the condition holding", PATIENCE, DETAIL, vec![], |v| {
            v["status"] == "succeeded"
        })
        .await;

        // A wait with a webhook: its delivery, and Redeliver, in the detail view.
        let hook = hooks.script("/hook", vec![Answer::code(204)]);
        let mut s = wait_spec(
            &up.script("/servers/hooked", vec![Reply::status("on")]),
            json!({}),
        );
        s["notify"] = json!([{"url": hook, "secret": SECRET}]);
        let hooked = api.create(s).await;
        // Found by its full id, though the list has it anyway.
        b.click("[data-testid=\"close-detail\"]").await;
        b.type_into("[data-testid=\"id-filter\"]", &hooked).await;
        b.click("[data-testid=\"apply-filters\"]").await;
        assert_eq!(b.detail_id().await, hooked);
        let text = b
            .shows("the webhook", PATIENCE, DETAIL, vec![], |v| {
                v["text"].as_str().unwrap_or_default().contains(&hook)
            })
            .await;
        assert!(
            !text["text"].as_str().unwrap().contains(SECRET),
            "the secret never shows"
        );
        b.shows(
            "the delivery delivered",
            PATIENCE,
            DELIVERIES,
            vec![],
            |v| v[0]["status"] == "delivered" && v[0]["attempts"] == 1,
        )
        .await;
        b.click("[data-testid=\"redeliver\"]").await;
        b.shows(
            "the delivery delivered again",
            PATIENCE,
            DELIVERIES,
            vec![],
            |v| v[0]["status"] == "delivered" && v[0]["attempts"] == 2,
        )
        .await;
        assert_eq!(hooks.got("/hook").len(), 2);
        b.save_screenshot("dashboard-deliveries.png").await;
    };
    let outcome = browser.run("forms", scenario).await;
    browser.finish(outcome).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}
