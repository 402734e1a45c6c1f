//! Creating a group: its new members first (each a wait, counted against the
//! tenant's limit), then the group's own row with its membership; the members
//! made for a group that could not be stored are canceled.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{GroupRefused, GroupRequest, Groups, MemberRequest, NewGroup};
use crate::engine::EngineState;
use crate::model::{GroupMember, Grouping};
use crate::store::{Created, EventBody, Inserted, NewWait, NotifyRow, Status, StoreError};

/// Why a member made for a group that was not made is canceled.
const UNDONE_REFUSED: &str = "canceled: the group it was created for could not be stored";
const UNDONE_FULL: &str =
    "canceled: the group it was created for would have passed the tenant's running-wait limit";
const UNDONE_RACE: &str =
    "canceled: another request with the same Idempotency-Key made the group first";

impl Groups {
    /// Creates a group: its new members (each a wait, counted against the
    /// tenant's limit), then the group row (a running wait, counted too) with its
    /// membership in one transaction. A member by id must be the tenant's and no group.
    pub async fn create(
        &self,
        tenant: &str,
        req: &GroupRequest,
        now: DateTime<Utc>,
        idempotency: Option<(&str, &str)>,
        max_active: Option<i64>,
        trace: Option<&str>,
    ) -> Result<Created, GroupRefused> {
        if let Some((key, hash)) = idempotency
            && let Some(found) = self.waits.find_idempotent(tenant, key, hash).await?
        {
            return Ok(Created {
                wait: found,
                existing: true,
            });
        }
        let name = req.mode.as_str();
        let by_id: Vec<Uuid> = req
            .members
            .iter()
            .filter_map(|m| match m {
                MemberRequest::Id { id, .. } => Some(*id),
                MemberRequest::Spec { .. } => None,
            })
            .collect();
        let links = self.group_links(&by_id).await?;
        for (i, m) in req.members.iter().enumerate() {
            let MemberRequest::Id { id, .. } = m else {
                continue;
            };
            let field = format!("{name}[{i}].id");
            // Another tenant's wait is unknown here, group or not.
            if self.waits.get(tenant, *id).await?.is_none() {
                return Err(GroupRefused::NoSuchMember { field, id: *id });
            }
            if links.iter().any(|l| l.group_id == *id) {
                return Err(GroupRefused::MemberIsGroup { field, id: *id });
            }
        }
        let mut members = Vec::with_capacity(req.members.len());
        let mut made = Vec::new();
        for m in &req.members {
            let id = match m {
                MemberRequest::Id { id, .. } => *id,
                MemberRequest::Spec { spec, .. } => {
                    match self
                        .waits
                        .create_within(tenant, spec, now, None, max_active, trace)
                        .await
                    {
                        Ok(c) => {
                            made.push(c.wait.id);
                            c.wait.id
                        }
                        Err(StoreError::TooManyActive(n)) => {
                            return self.at_limit(tenant, &made, now, idempotency, n).await;
                        }
                        Err(e) => {
                            self.undo_members(tenant, &made, now, UNDONE_REFUSED).await;
                            return Err(e.into());
                        }
                    }
                }
            };
            members.push((id, m.required()));
        }
        let (engine, _) = EngineState::start(&req.shell, now);
        let to_json = |v: Result<Value, serde_json::Error>, what| {
            v.map_err(|e| StoreError::Decode {
                what,
                why: e.to_string(),
            })
        };
        let nw = NewWait {
            id: Uuid::now_v7(),
            first_poll: engine.deadline,
            spec: req.spec.clone(),
            headers: Value::Object(Default::default()),
            labels: to_json(serde_json::to_value(&req.shell.labels), "labels")?,
            engine_json: to_json(serde_json::to_value(&engine), "engine state")?,
            created: EventBody::Created {
                deadline: engine.deadline,
            }
            .to_parts(),
            notify: NotifyRow::of(&req.shell.notify, &self.core.cipher)?,
            engine,
            trace: trace.map(str::to_owned),
            placement: None,
        };
        let group = NewGroup {
            wait: &nw,
            mode: name,
            keep_running: req.keep_running,
            state: format!("0 of {} succeeded", members.len()),
            members: members.clone(),
            by_id,
        };
        let admission = self.waits.admission(tenant, max_active);
        let inserted = sql!(self.insert_group(tenant, now, &group, idempotency, admission));
        match inserted {
            Ok(Inserted::Yes { counted }) => {
                if let Some(n) = counted {
                    self.waits.counted(tenant, n);
                }
            }
            Ok(Inserted::Full(n)) => {
                self.waits.counted(tenant, n);
                return self.at_limit(tenant, &made, now, idempotency, n).await;
            }
            Ok(Inserted::KeyTaken) => {
                // Another request with this key won the race: answer with its group.
                self.undo_members(tenant, &made, now, UNDONE_RACE).await;
                let (key, hash) = idempotency.expect("only a key can be taken");
                return match self.waits.find_idempotent(tenant, key, hash).await? {
                    Some(found) => Ok(Created {
                        wait: found,
                        existing: true,
                    }),
                    None => Err(StoreError::Decode {
                        what: "idempotency key",
                        why: "the key was taken, then vanished".into(),
                    }
                    .into()),
                };
            }
            Err(e) => {
                self.undo_members(tenant, &made, now, UNDONE_REFUSED).await;
                return Err(e.into());
            }
        }
        let mut wait = nw.wait(now);
        wait.next_poll_at = None;
        wait.state = Some(group.state.clone());
        wait.grouping = Grouping {
            mode: Some(req.mode),
            members: Some(
                members
                    .iter()
                    .map(|&(id, required)| GroupMember {
                        id,
                        status: Status::Running,
                        required,
                    })
                    .collect(),
            ),
            group: None,
            paused: None,
        };
        Ok(Created {
            wait,
            existing: false,
        })
    }

    /// A group create that found the tenant at its running-wait limit: the members
    /// made for it are canceled, and the answer is the limit, unless a request
    /// with the same key made the group meanwhile (its places are what the limit
    /// counted): then the answer is that group.
    async fn at_limit(
        &self,
        tenant: &str,
        made: &[Uuid],
        now: DateTime<Utc>,
        idempotency: Option<(&str, &str)>,
        n: i64,
    ) -> Result<Created, GroupRefused> {
        if let Some((key, hash)) = idempotency
            && let Some(found) = self.waits.find_idempotent(tenant, key, hash).await?
        {
            self.undo_members(tenant, made, now, UNDONE_RACE).await;
            return Ok(Created {
                wait: found,
                existing: true,
            });
        }
        self.undo_members(tenant, made, now, UNDONE_FULL).await;
        Err(StoreError::TooManyActive(n).into())
    }

    /// Cancels the members a group create made before it failed.
    async fn undo_members(&self, tenant: &str, made: &[Uuid], now: DateTime<Utc>, why: &str) {
        for id in made {
            let _ = self
                .end_member(tenant, *id, now, Status::Canceled, why)
                .await;
        }
    }
}
