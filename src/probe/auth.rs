//! Polls of a target whose spec has `auth`: the credential's token goes on the
//! request, minted first when there is none (the token endpoint's place in the
//! per-host limit is taken before the target's, never while holding it), and a
//! `401` to a token is answered once by minting another and asking again, which
//! costs the wait no retry.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use http::header::AUTHORIZATION;
use http::{Request, StatusCode};

use super::Prober;
use super::conditional;
use super::share::{Delivered, Fetched};
use crate::engine::Observation;
use crate::outbound::credentials::Bearer;
use crate::outbound::token::TokenError;
use crate::outbound::{Body, Client};

/// How a target's request goes out: through which client, with which token.
#[derive(Clone, Copy)]
pub(super) struct Via<'a> {
    pub client: &'a Client,
    pub auth: Option<&'a Bearer>,
    /// Set while the poll waits for a token (the target's own poll, not a
    /// shared request's).
    pub minting: Option<&'a AtomicBool>,
}

impl Prober {
    /// [`Prober::fetch`] with the credential's token, when there is a credential.
    pub(super) async fn fetch_authed(
        &self,
        wait: uuid::Uuid,
        via: Via<'_>,
        whose: super::Whose,
        mut request: Request<Body>,
        read_body: bool,
        kept: &conditional::Slot,
    ) -> Delivered {
        let Via {
            client,
            auth,
            minting,
        } = via;
        let Some(auth) = auth else {
            return self
                .fetch(wait, client, whose, request, read_body, kept)
                .await;
        };
        // The same request again, if the token is refused: its method, body and
        // idempotency key too, as it is the same poll.
        let (method, uri, headers, body) = (
            request.method().clone(),
            request.uri().clone(),
            request.headers().clone(),
            request.body().clone(),
        );
        let bearer = match self.bearer_for(auth, minting).await {
            Ok(b) => b,
            Err(failed) => return failed,
        };
        request.headers_mut().insert(AUTHORIZATION, bearer.clone());
        let delivered = self
            .fetch(wait, client, whose.clone(), request, read_body, kept)
            .await;
        let refused =
            matches!(&*delivered.0, Fetched::Answered(r) if r.status == StatusCode::UNAUTHORIZED);
        // A token read from a file is read again when the file changes, not
        // because a target refused it.
        let Bearer::Minted(minted) = auth else {
            return delivered;
        };
        if !refused {
            return delivered;
        }
        minted.reject(&bearer);
        self.inner.tokens.counts.rejected.fetch_add(1, Relaxed);
        let bearer = match self.bearer_for(auth, minting).await {
            Ok(b) => b,
            Err(failed) => return failed,
        };
        let mut again = Request::new(body);
        *again.method_mut() = method;
        *again.uri_mut() = uri;
        *again.headers_mut() = headers;
        again.headers_mut().insert(AUTHORIZATION, bearer);
        self.fetch(wait, client, whose, again, read_body, kept)
            .await
    }

    /// [`Prober::bearer`], with `minting` set while it runs.
    async fn bearer_for(
        &self,
        auth: &Bearer,
        minting: Option<&AtomicBool>,
    ) -> Result<http::HeaderValue, Delivered> {
        /// Clears the flag however the wait for the token ends (a poll cut at its
        /// deadline is dropped mid-way).
        struct Minting<'a>(&'a AtomicBool);
        impl Drop for Minting<'_> {
            fn drop(&mut self) {
                self.0.store(false, Relaxed);
            }
        }
        let Some(flag) = minting else {
            return self.bearer(auth).await;
        };
        flag.store(true, Relaxed);
        let _minting = Minting(flag);
        self.bearer(auth).await
    }

    /// The credential's `Authorization` value, or the observation a poll makes
    /// without one.
    async fn bearer(&self, auth: &Bearer) -> Result<http::HeaderValue, Delivered> {
        let value = match auth {
            Bearer::Minted(c) => {
                c.bearer(
                    &self.inner.client,
                    &self.inner.hosts,
                    self.inner.timeout,
                    &self.inner.tokens.counts,
                )
                .await
            }
            Bearer::File(f) => f.value().await,
        };
        value.map_err(|e| {
            (
                Arc::new(Fetched::Failed(token_failure(e))),
                crate::model::LastPoll::Sent,
            )
        })
    }
}

/// What a poll observes when there is no token: a failure that may pass is
/// retried within the wait's budget; a refusal ends the wait `error`.
fn token_failure(e: TokenError) -> Observation {
    match e {
        TokenError::Transient(why) => Observation::Transient {
            error: format!("no token for the target: {why}"),
            retry_after: None,
        },
        TokenError::Refused(why) => Observation::Permanent {
            error: format!("no token for the target: {why}"),
        },
    }
}
