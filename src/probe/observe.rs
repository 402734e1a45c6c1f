//! What one wait observes of a response its poll fetched (its own or one it
//! shares): the status's class, then, when the state or a condition needs it, the
//! body read by [`super::read`], on the CPU pool in the tenant's turn when it is
//! large or the conditions must be evaluated.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::read::{Answer, Memo, header_map};
use super::share::Fetched;
use super::{Prober, StatusClass, Target, abandoned, classify_status, status_text};
use crate::engine::{Observation, Spec, ValuePath};
use crate::outbound::retry_after;

impl Prober {
    /// What one wait makes of a response: its own observation, judged by its own
    /// conditions (and memo), and the `output` it would end with on it.
    pub(super) async fn read(
        &self,
        _wait: uuid::Uuid,
        target: &Target,
        spec: &Spec,
        memo: &mut Option<Memo>,
        fetched: &Fetched,
    ) -> (Observation, Option<serde_json::Value>) {
        let response = match fetched {
            Fetched::Failed(obs) => return (obs.clone(), None),
            Fetched::NotModified => return (abandoned(), None),
            // Only connection targets read a probe, and they never come here.
            Fetched::Probed(p) => return (p.base.clone(), None),
            Fetched::Answered(r) => r,
        };
        let status = response.status;
        let judged = spec.success_condition.is_some() || spec.failure_condition.is_some();
        let base = match classify_status(status.as_u16()) {
            StatusClass::NotFound => Observation::NotFound {
                status: status.as_u16(),
            },
            StatusClass::Transient => Observation::Transient {
                error: format!("the target answered {}", status_text(status)),
                retry_after: retry_after(&response.headers, SystemTime::now()),
            },
            StatusClass::Permanent => {
                let error = if status.is_redirection() {
                    format!(
                        "the target answered {}; waitd does not follow redirects, so point the wait at the final URL (the Location header names it)",
                        status_text(status)
                    )
                } else {
                    format!("the target answered {}", status_text(status))
                };
                Observation::Permanent { error }
            }
            // A status-only wait: the 2xx code is the state, whatever the body says
            // (JSON or not), so the body is not read for it.
            StatusClass::Success if matches!(spec.state, Some(ValuePath::HttpStatus)) => {
                Observation::State {
                    values: vec![status.as_u16().to_string()],
                    detail: None,
                }
            }
            StatusClass::Success if spec.state.is_none() => Observation::Answered {
                status: status.as_u16(),
            },
            // The state is in the body.
            StatusClass::Success => Observation::Missing {
                reason: String::new(),
            },
        };
        let needs_body = matches!(&base, Observation::Missing { .. });
        if !judged && !needs_body && spec.output.is_empty() {
            return (base, None);
        }
        // Conditions see every response's headers and body, whatever its status.
        let conditions = spec.conditions();
        let headers = judged.then(|| {
            if conditions.iter().any(|c| c.reads_headers()) {
                header_map(&response.headers)
            } else {
                BTreeMap::new()
            }
        });
        let body = match &response.body {
            Some(Ok(body)) => body.clone(),
            Some(Err(obs)) => return (obs.clone(), None),
            None => return (abandoned(), None),
        };
        let all_headers = spec
            .output
            .values()
            .any(|p| matches!(p, crate::engine::spec::Pick::Cel(_)))
            .then(|| header_map(&response.headers));
        let status = status.as_u16();
        let key = (judged || needs_body)
            .then(|| Memo::key_of(status, &body, headers.as_ref().unwrap_or(&BTreeMap::new())));
        let hit = memo.filter(|m| Some(m.key) == key);
        let answer = Answer {
            status,
            headers,
            body,
            base,
            needs_body,
            key,
            hit,
            elapsed: response.elapsed,
            all_headers,
        };
        // What a stranger's answer costs to read grows with its size and with the
        // wait's expressions: that goes to the CPU pool, in the tenant's turn; a
        // small body read at a JSON Pointer stays here (a few microseconds).
        let (obs, read_memo, output) = if answer.heavy(spec) {
            let spec = spec.clone();
            match crate::cpu::pool()
                .run(crate::cpu::Lane::Long, &target.tenant, move || {
                    answer.read(&spec)
                })
                .await
            {
                Ok(read) => read,
                Err(lost) => (
                    Observation::Permanent {
                        error: format!("the response could not be read: {lost}"),
                    },
                    None,
                    None,
                ),
            }
        } else {
            answer.read(spec)
        };
        *memo = read_memo;
        (obs, output)
    }
}
