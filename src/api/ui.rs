//! The dashboard: a few static files (plain HTML, CSS and ES modules from `ui/`,
//! compiled into the binary), served at `/ui/`. The page is a client of the API like
//! any other: it reads `/waits` and follows `/events` with `fetch`, sending the
//! API token a person typed in (kept in the tab's `sessionStorage`), so it needs no
//! cookie and no other credential. Nothing is loaded from another origin, and a
//! strict Content-Security-Policy says so to the browser.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::error::ApiError;

/// The page may load only itself: no inline script or style, no other origin, no
/// frames, no forms posting elsewhere.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Every file of the dashboard: name, content type, content.
const FILES: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../ui/index.html"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/style.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/app.js"),
    ),
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/api.js"),
    ),
    (
        "sse.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/sse.js"),
    ),
    (
        "common.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/common.js"),
    ),
    (
        "list.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/list.js"),
    ),
    (
        "panels.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/panels.js"),
    ),
    (
        "create.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/create.js"),
    ),
    (
        "deliveries.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/deliveries.js"),
    ),
];

fn file(name: &str) -> Response {
    let Some((_, content_type, body)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return ApiError::not_found(format!(
            "there is no dashboard file \"{}\"; the dashboard is at /ui/",
            name.chars().take(64).collect::<String>()
        ))
        .into_response();
    };
    let mut res = (StatusCode::OK, *body).into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // The files change with the binary: revalidate rather than cache for a day.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

/// `/` and `/ui`: the dashboard lives at `/ui/`.
pub async fn to_dashboard() -> Redirect {
    Redirect::permanent("/ui/")
}

pub async fn index() -> Response {
    file("index.html")
}

pub async fn asset(
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let name = name.map(|Path(n)| n).unwrap_or_default();
    file(&name)
}
