//! One poll of a wait's target: refused by the guard, a connection target's
//! probe, held while its requests are paused, or the response of a request (its
//! own, or the one it shares with the waits that send the identical request),
//! read by the wait's own conditions.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::SystemTime;

use super::share::{self, Fetched, Turn};
use super::{Memo, Polled, Prober, Target, abandoned, auth, connection, refusal};
use crate::engine::{Spec, ValuePath};
use crate::model::LastPoll;

impl Prober {
    /// [`Prober::probe`] of a target made already ([`Prober::target`]), with what
    /// the wait's conditions decided on the last response ([`Memo`]), updated; or
    /// nothing sent, while the target's requests are paused.
    pub async fn probe_memo(
        &self,
        wait: uuid::Uuid,
        spec: &Spec,
        target: &Target,
        memo: &mut Option<Memo>,
    ) -> Polled {
        if let Some(refused) = &target.refused {
            return Polled::Observed(refusal(wait, target.log_host(), refused.to_string()), None);
        }
        if connection::SCHEMES.contains(&target.uri.scheme_str().unwrap_or_default()) {
            let observed = self.poll_connection(wait, spec, target).await;
            return Polled::Observed(observed, None);
        }
        if let Some(pause) = self.inner.pauses.paused(&target.pause, SystemTime::now) {
            target.came.set(LastPoll::Paused);
            return Polled::Held(pause);
        }
        let (fetched, came) = match &target.group {
            Some(group) => self.shared(wait, target, group).await,
            None => {
                let read_body = spec.success_condition.is_some()
                    || spec.failure_condition.is_some()
                    || !spec.output.is_empty()
                    || matches!(&spec.state, Some(p) if !matches!(p, ValuePath::HttpStatus));
                let request = self.request(target);
                let via = auth::Via {
                    client: self.client_of(target),
                    auth: target.auth.as_ref(),
                    minting: Some(&target.minting),
                };
                self.fetch_authed(wait, via, target.whose(), request, read_body, &target.kept)
                    .await
            }
        };
        target.came.set(came);
        let (obs, output) = self.read(wait, target, spec, memo, &fetched).await;
        Polled::Observed(obs, output)
    }

    /// The response a wait of a shared request reads: that of a request begun
    /// since its last poll, in flight or within the share window, or of one it
    /// sends now. The request runs on its own, so a wait cut at its deadline does
    /// not cut it for the others.
    async fn shared(
        &self,
        wait: uuid::Uuid,
        target: &Target,
        group: &Arc<share::Group>,
    ) -> share::Delivered {
        let now = tokio::time::Instant::now();
        let previous = target.last.replace(now);
        if Arc::strong_count(group) == 1 && target.auth.is_none() {
            // Only this wait sends the request, and no request of the group is in
            // flight (each holds the group): there is nobody to share with, so the
            // request is sent here, without a task and a channel of its own. A wait
            // taken up meanwhile sends its own first request. (A request with a
            // credential runs on its own as below, so that a token endpoint still
            // minting at the wait's deadline is what the wait names.)
            let via = auth::Via {
                client: self.client_of(target),
                auth: None,
                minting: None,
            };
            let request = self.request(target);
            return self
                .fetch_authed(wait, via, target.whose(), request, true, &group.kept)
                .await;
        }
        let (mut rx, joined) = match group.turn(previous, now, self.inner.share_window) {
            Turn::Join(rx) => {
                self.inner.shares.counts.shared.fetch_add(1, Relaxed);
                (rx, true)
            }
            Turn::Send(tx, began) => {
                let rx = tx.subscribe();
                let prober = self.clone();
                let request = self.request(target);
                let client = self.client_of(target).clone();
                let whose = target.whose();
                let held = share::Sending::new(group.clone());
                let group = Arc::downgrade(group);
                let window = self.inner.share_window;
                let auth = target.auth.clone();
                let traced = self.inner.client.traces().is_on();
                let send = async move {
                    // The waits that hold the request hold its group: when only
                    // requests in flight hold it, every one was let go, and the
                    // request is not sent, or is given up while in flight.
                    let fetch = prober.fetch_authed(
                        wait,
                        auth::Via {
                            client: &client,
                            auth: auth.as_ref(),
                            minting: Some(&held.0.minting),
                        },
                        whose,
                        request,
                        true,
                        &held.0.kept,
                    );
                    // Looked at first: a request whose host place comes just as
                    // its last wait goes is not sent.
                    let fetched = tokio::select! {
                        biased;
                        () = share::Group::unwanted(&held) => {
                            (Arc::new(Fetched::Failed(abandoned())), LastPoll::Sent)
                        }
                        fetched = fetch => fetched,
                    };
                    drop(held);
                    tx.send_replace(Some(fetched));
                    // A request only this wait sends is not kept; another's is
                    // kept for the rest of the window, then let go.
                    let alone = group.upgrade().is_none_or(|g| Arc::strong_count(&g) <= 2);
                    if !alone {
                        tokio::time::sleep_until(began + window).await;
                    }
                    if let Some(g) = group.upgrade() {
                        g.forget(began);
                    }
                };
                // The request is the span of the poll that sends it.
                if traced {
                    use opentelemetry::context::FutureExt as _;
                    tokio::spawn(send.with_current_context());
                } else {
                    tokio::spawn(send);
                }
                (rx, false)
            }
        };
        let (fetched, came) = match rx.wait_for(Option::is_some).await {
            Ok(delivered) => delivered
                .clone()
                .unwrap_or_else(|| (Arc::new(Fetched::Failed(abandoned())), LastPoll::Sent)),
            Err(_) => (Arc::new(Fetched::Failed(abandoned())), LastPoll::Sent),
        };
        // A wait that joined another's request read a shared response, whether
        // that request was answered in full or by a `304`.
        (fetched, if joined { LastPoll::Shared } else { came })
    }
}
