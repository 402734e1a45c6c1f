//! Creating a group through `POST /waits`: the body's `all` or `any` list makes it
//! one (design §2.14). Every other route serves a group as the wait it is.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use chrono::Utc;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::{ApiError, ApiResult};
use super::extract::Hold;
use super::guard::guard;
use super::hold::{Held, block, blocked_response, with_location};
use super::{AppState, json_response};
use crate::groups::{MemberRequest, Refusal, request};
use crate::store::GroupRefused;

/// Creates a group and answers as a create of a wait does (held with `?wait=`).
pub(super) async fn create(
    s: AppState,
    tenant: String,
    headers: &HeaderMap,
    hold: Option<Hold>,
    key: Option<String>,
    body: Value,
    trace: Option<String>,
) -> ApiResult<Response> {
    let (presets, limits) = (s.presets.clone(), s.limits.clone());
    let (body, parsed) = crate::cpu::pool()
        .run(crate::cpu::Lane::Quick, &tenant, move || {
            let parsed = request::parse_with_presets(&body, &limits, &presets);
            (body, parsed)
        })
        .await
        .map_err(|lost| {
            tracing::error!(error = %lost, "a group create request's validation was lost");
            ApiError::internal()
        })?;
    let req = parsed.map_err(|r| match r {
        Refusal::Invalid(errors) => ApiError::validation(errors),
        Refusal::Expand { at, refused } => super::presets::refused(refused).within(&at),
    })?;
    let name = req.mode.as_str();
    let callbacks = req.members.iter().any(
        |m| matches!(m, MemberRequest::Spec { spec, .. } if spec.callback.is_some() || spec.nudge),
    );
    if req
        .members
        .iter()
        .any(|m| matches!(m, MemberRequest::Spec { spec, .. } if spec.on_event.is_some()))
    {
        return Err(ApiError::bad_request(
            "a group's members cannot have on_event: create each listening wait on its own with POST /waits, then make a group of their ids",
        ));
    }
    if hold.is_some() && callbacks {
        return Err(ApiError::bad_request(
            "a group with callback members or members with \"nudge\": true cannot be created with ?wait=: the answer would be held until the group ends, and no one would see the members' callback_url or nudge_url; create it without ?wait=, then block on GET /waits/{id}?wait=true",
        ));
    }
    for (i, m) in req.members.iter().enumerate() {
        if let MemberRequest::Spec { spec, .. } = m {
            guard(&s, &tenant, spec, &format!("{name}[{i}]."), true)?;
        }
    }
    guard(&s, &tenant, &req.shell, "", false)?;
    let hash = key
        .as_ref()
        .map(|_| hex::encode(Sha256::digest(body.to_string().as_bytes())));
    let idem = key.as_deref().zip(hash.as_deref());
    let slot = hold.map(|_| s.streams.acquire(&tenant)).transpose()?;
    let created = s
        .store
        .groups()
        .create(
            &tenant,
            &req,
            Utc::now(),
            idem,
            Some(s.max_active_waits),
            trace.as_deref(),
        )
        .await
        .map_err(|e| match e {
            GroupRefused::Store(e) => ApiError::from(e),
            GroupRefused::NoSuchMember { id, .. } => {
                ApiError::not_found(format!("there is no wait {id}"))
            }
            refused @ GroupRefused::MemberIsGroup { .. } => {
                ApiError::bad_request(refused.to_string())
            }
        })?;
    let id = created.wait.id;
    let mut wait = created.wait;
    if !created.existing {
        // The group and each member it made are waits created.
        let made = req
            .members
            .iter()
            .filter(|m| matches!(m, MemberRequest::Spec { .. }))
            .count();
        s.metrics
            .created
            .fetch_add(1 + made as u64, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(wait_id = %id, members = req.members.len(), "group created");
        // A member given by id may have ended already: decide before answering.
        if req
            .members
            .iter()
            .any(|m| matches!(m, MemberRequest::Id { .. }))
        {
            if let Err(e) = crate::groups::watch::settle(s.store.groups(), &s.metrics, id).await {
                tracing::warn!(group_id = %id, error = %e, "could not decide a new group; the sweep will");
            }
            if let Some(again) = s.store.waits().get(&tenant, id).await? {
                wait = again;
            }
        }
    }
    if wait.grouping.members.is_none() {
        s.store
            .groups()
            .annotate(std::slice::from_mut(&mut wait))
            .await?;
    }
    if callbacks && !created.existing {
        return answer_callbacks(&s, &tenant, headers, &req.members, &wait).await;
    }
    let mut res = match hold.zip(slot) {
        Some((hold, slot)) if wait.is_running() => {
            let (wait, why) = block(&s, &tenant, id, hold, slot).await?;
            blocked_response(&wait, why, true)
        }
        Some(_) => blocked_response(&wait, Held::Ended, true),
        None => with_location(json_response(StatusCode::CREATED, &wait), id),
    };
    if created.existing {
        res.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(res)
}

/// The answer to a group's create whose members include callback waits or
/// nudged waits: each such member, in the group's `members`, carries its
/// `callback_url` or `nudge_url`, shown only here.
async fn answer_callbacks(
    s: &AppState,
    tenant: &str,
    headers: &HeaderMap,
    members: &[MemberRequest],
    group: &crate::model::Wait,
) -> ApiResult<Response> {
    let ids: Vec<uuid::Uuid> = group
        .grouping
        .members
        .iter()
        .flatten()
        .map(|m| m.id)
        .collect();
    let mut shown = serde_json::to_value(group).map_err(|_| ApiError::internal())?;
    for (i, m) in members.iter().enumerate() {
        let MemberRequest::Spec { spec, .. } = m else {
            continue;
        };
        let Some(id) = ids.get(i) else {
            continue;
        };
        if spec.callback.is_none() && !spec.nudge {
            continue;
        }
        let Some(member) = s.store.waits().get(tenant, *id).await? else {
            continue;
        };
        let (field, url) = match &spec.callback {
            Some(cb) => (
                "callback_url",
                super::waits::register_callback(s, tenant, &member, cb, spec, headers).await?,
            ),
            None => (
                "nudge_url",
                super::waits::register_nudge(s, tenant, &member, headers).await?,
            ),
        };
        shown["members"][i][field] = Value::String(url);
    }
    Ok(with_location(
        json_response(StatusCode::CREATED, shown),
        group.id,
    ))
}
