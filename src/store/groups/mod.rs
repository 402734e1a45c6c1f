//! Groups in the store: creating one with its members ([`create`]), reading how
//! its members stand, and ending it once, through the [`Groups`] handle, which the
//! group watcher (`src/groups/watch.rs`) holds.
//!
//! On SQLite a batch of ends or of progress is written one group at a time (its
//! one writer makes a transaction a group no slower than one for all), and a
//! batch of reads reads one group's row at a time; Postgres writes and reads a
//! batch in one statement.
//!
//! A group is a `waits` row with no next poll (no claim ever takes it), its spec
//! and its events like any wait's, and two tables: `wait_groups` (its mode) and
//! `group_members` (its members, in order). Its end is the same conditional update
//! as any wait's end (`status = 'running'`), so two replicas deciding it at once
//! write one end and one terminal event.

mod create;
mod postgres;
mod sqlite;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::columns::{Time, from_row};
use super::{Core, Dialect, EventBody, NewWait, Status, StoreError, Wait, Waits};
use crate::engine::Spec;
use crate::model::{Ending, GroupMember, GroupMode};

/// A member as it stands, as the rule that decides its group sees it
/// (`src/groups/decide.rs`).
#[derive(Clone, Debug, PartialEq)]
pub struct MemberState {
    pub id: Uuid,
    pub status: Status,
    pub required: bool,
    /// The member's own deadline: one that the group's deadline capped ends
    /// `timed_out` when the group's does, which is the group's timeout too.
    pub deadline: DateTime<Utc>,
}

/// One member, as the request gives it.
#[derive(Clone, Debug)]
pub enum MemberRequest {
    /// A wait of the same tenant, already created.
    Id { id: Uuid, required: bool },
    /// A new wait, its deadline capped by the group's.
    Spec { spec: Box<Spec>, required: bool },
}

impl MemberRequest {
    pub fn required(&self) -> bool {
        match self {
            MemberRequest::Id { required, .. } | MemberRequest::Spec { required, .. } => *required,
        }
    }
}

/// A group's create request, read (`src/groups/request.rs`).
#[derive(Clone, Debug)]
pub struct GroupRequest {
    pub mode: GroupMode,
    pub keep_running: bool,
    pub members: Vec<MemberRequest>,
    /// The group's own `timeout`, `labels` and `notify`, read as a wait's.
    pub shell: Spec,
    /// The group's spec as stored and shown.
    pub spec: Value,
}

from_row! {
/// A group's row, as deciding it needs.
pub(crate) struct GroupHead {
    group_id: Uuid,
    tenant: String,
    status: String,
    deadline: Time,
    state: Option<String>,
    mode: String,
    keep_running: bool,
}
}

from_row! {
/// One member of a group, joined to its wait.
pub(crate) struct LinkRow {
    group_id: Uuid,
    mode: String,
    position: i32,
    member_id: Uuid,
    required: bool,
    status: String,
    deadline: Time,
}
}

/// A group as the decider reads it.
#[derive(Clone, Debug)]
pub struct Group {
    pub id: Uuid,
    pub tenant: String,
    pub mode: GroupMode,
    pub keep_running: bool,
    pub status: Status,
    pub deadline: DateTime<Utc>,
    pub state: Option<String>,
    pub members: Vec<MemberState>,
}

/// Why a group cannot be created.
#[derive(Debug, thiserror::Error)]
pub enum GroupRefused {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A member names a wait the tenant does not have.
    #[error("{field}: there is no wait {id}")]
    NoSuchMember { field: String, id: Uuid },
    /// A member names a group.
    #[error(
        "{field}: wait {id} is a group; a group cannot be a member of a group: list its members instead"
    )]
    MemberIsGroup { field: String, id: Uuid },
}

fn mode_of(s: &str) -> Result<GroupMode, StoreError> {
    match s {
        "all" => Ok(GroupMode::All),
        "any" => Ok(GroupMode::Any),
        other => Err(StoreError::Decode {
            what: "group mode",
            why: format!("\"{other}\" is neither all nor any"),
        }),
    }
}

fn status_of(s: &str) -> Result<Status, StoreError> {
    s.parse().map_err(|e| StoreError::Decode {
        what: "status",
        why: format!("{e}"),
    })
}

/// One group's write in a batch: its end (`status` and `reason`) or its
/// progress (`state` only), with the event that records it.
pub(crate) struct GroupWrite<'a> {
    pub id: Uuid,
    pub tenant: &'a str,
    pub status: &'static str,
    pub reason: &'a str,
    pub state: &'a str,
    pub output: Option<Value>,
    pub event: (&'static str, Value),
}

/// A group's end as [`Groups::end_many`] takes it.
pub struct GroupEnd<'a> {
    pub group: &'a Group,
    pub status: Status,
    pub reason: &'a str,
    pub state: &'a str,
}

/// What a dialect writes for a new group, beyond a wait's own rows.
pub(crate) struct NewGroup<'a> {
    pub wait: &'a NewWait,
    pub mode: &'static str,
    pub keep_running: bool,
    pub state: String,
    pub members: Vec<(Uuid, bool)>,
    /// The members given by id, whose deadlines the group's caps.
    pub by_id: Vec<Uuid>,
}

/// A group from its row and its member rows (in position order).
fn group_of(head: GroupHead, links: Vec<LinkRow>) -> Result<Group, StoreError> {
    let members = links
        .into_iter()
        .map(|l| {
            Ok(MemberState {
                id: l.member_id,
                status: status_of(&l.status)?,
                required: l.required,
                deadline: l.deadline.0,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Group {
        id: head.group_id,
        tenant: head.tenant,
        mode: mode_of(&head.mode)?,
        keep_running: head.keep_running,
        status: status_of(&head.status)?,
        deadline: head.deadline.0,
        state: head.state,
        members,
    })
}

/// The terminal event of a group's end.
fn end_event(
    status: Status,
    reason: &str,
    state: &str,
    output: Option<&Value>,
) -> (&'static str, Value) {
    EventBody::end(
        status,
        Ending {
            reason: reason.to_string(),
            state: Some(state.to_string()),
            error_detail: None,
            last_error: None,
            output: output.cloned(),
        },
    )
    .to_parts()
}

/// A group's output: each member that ended with an output, under its id, cut
/// as any output is past 64 KiB; `None` when no member has one.
fn group_output(group: &Group, outputs: &HashMap<Uuid, Value>) -> Option<Value> {
    let of: serde_json::Map<String, Value> = group
        .members
        .iter()
        .filter_map(|m| Some((m.id.to_string(), outputs.get(&m.id)?.clone())))
        .collect();
    (!of.is_empty()).then(|| crate::engine::bound::output(&Value::Object(of)))
}

/// The `state` event of a group's progress.
fn state_event(group: &Group, state: &str) -> (&'static str, Value) {
    EventBody::State {
        from: group.state.clone(),
        to: state.to_string(),
    }
    .to_parts()
}

/// Groups: their creates, reads, ends and progress, and how a wait stands in
/// them. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Groups {
    pub(super) core: Arc<Core>,
    /// A group's new members are waits, created as any other.
    pub(super) waits: Waits,
}

impl Groups {
    /// The memberships that name any of `ids`, as group or as member.
    async fn group_links(&self, ids: &[Uuid]) -> Result<Vec<LinkRow>, StoreError> {
        self.core.group_links(ids).await
    }

    /// The groups an end of the waits `ids` may concern: the groups they are
    /// members of, and those of them that are groups.
    pub async fn touching(&self, ids: &[Uuid]) -> Result<Vec<Uuid>, StoreError> {
        let mut out: Vec<Uuid> = self
            .group_links(ids)
            .await?
            .into_iter()
            .map(|l| l.group_id)
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// A group and its members as they stand; `None` when `id` is no group.
    pub async fn read(&self, id: Uuid) -> Result<Option<Group>, StoreError> {
        let Some(head) = sql!(self.group_head(id))? else {
            return Ok(None);
        };
        let mut links: Vec<LinkRow> = self
            .group_links(&[id])
            .await?
            .into_iter()
            .filter(|l| l.group_id == id)
            .collect();
        links.sort_by_key(|l| l.position);
        group_of(head, links).map(Some)
    }

    /// The groups among `ids` with their members as they stand, read at once (a
    /// burst of ends is a burst of groups); ids that are no group are left out.
    pub async fn read_many(&self, ids: &[Uuid]) -> Result<Vec<Group>, StoreError> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        let heads = match &self.core.db {
            Dialect::Postgres(d) => d.group_heads(ids).await?,
            Dialect::Sqlite(d) => {
                let mut heads = Vec::with_capacity(ids.len());
                for id in ids {
                    heads.extend(d.group_head(*id).await?);
                }
                heads
            }
        };
        let mut links: HashMap<Uuid, Vec<LinkRow>> = HashMap::new();
        for l in self.group_links(ids).await? {
            links.entry(l.group_id).or_default().push(l);
        }
        heads
            .into_iter()
            .map(|head| {
                let mut ls = links.remove(&head.group_id).unwrap_or_default();
                ls.sort_by_key(|l| l.position);
                group_of(head, ls)
            })
            .collect()
    }

    /// Ends each running group of `ends` with its terminal event, in one
    /// transaction where the store allows; the ids of the groups this call ended
    /// (one that had ended already, on this replica or another, keeps its end).
    pub async fn end_many(
        &self,
        ends: &[GroupEnd<'_>],
        now: DateTime<Utc>,
    ) -> Result<Vec<Uuid>, StoreError> {
        if ends.is_empty() {
            return Ok(vec![]);
        }
        let members: Vec<Uuid> = ends
            .iter()
            .flat_map(|e| e.group.members.iter().map(|m| m.id))
            .collect();
        let outputs: HashMap<Uuid, Value> = sql!(self.outputs(&members))?
            .into_iter()
            .map(|(id, j)| (id, j.0))
            .collect();
        match &self.core.db {
            Dialect::Postgres(d) => {
                let writes: Vec<GroupWrite<'_>> = ends
                    .iter()
                    .map(|e| {
                        let output = group_output(e.group, &outputs);
                        GroupWrite {
                            id: e.group.id,
                            tenant: &e.group.tenant,
                            status: e.status.as_str(),
                            reason: e.reason,
                            state: e.state,
                            event: end_event(e.status, e.reason, e.state, output.as_ref()),
                            output,
                        }
                    })
                    .collect();
                d.end_groups(&writes, now).await
            }
            Dialect::Sqlite(_) => {
                let mut ended = Vec::new();
                for e in ends {
                    let output = group_output(e.group, &outputs);
                    if self
                        .end_one(e.group, e.status, e.reason, e.state, output.as_ref(), now)
                        .await?
                    {
                        ended.push(e.group.id);
                    }
                }
                Ok(ended)
            }
        }
    }

    /// [`Groups::progress_one`] for many groups, in one transaction where the
    /// store allows.
    pub async fn progress_many(
        &self,
        progress: &[(&Group, String)],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if progress.is_empty() {
            return Ok(());
        }
        match &self.core.db {
            Dialect::Postgres(d) => {
                let writes: Vec<GroupWrite<'_>> = progress
                    .iter()
                    .map(|(g, state)| GroupWrite {
                        id: g.id,
                        tenant: &g.tenant,
                        status: "running",
                        reason: "",
                        state,
                        output: None,
                        event: state_event(g, state),
                    })
                    .collect();
                d.groups_progress(&writes, now).await?;
            }
            Dialect::Sqlite(_) => {
                for (g, state) in progress {
                    self.progress_one(g, state, now).await?;
                }
            }
        }
        Ok(())
    }

    /// Ends a running group with its terminal event; true when this call ended it
    /// (false when it had ended already, on this replica or another).
    async fn end_one(
        &self,
        group: &Group,
        status: Status,
        reason: &str,
        state: &str,
        output: Option<&Value>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let event = end_event(status, reason, state, output);
        sql!(self.end_group(
            group.id,
            &group.tenant,
            status.as_str(),
            reason,
            state,
            output,
            now,
            &event
        ))
    }

    /// Records how far a running group is (`2 of 3 succeeded`) with a `state`
    /// event, unless it says so already.
    async fn progress_one(
        &self,
        group: &Group,
        state: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let event = state_event(group, state);
        sql!(self.group_progress(group.id, &group.tenant, state, now, &event))
    }

    /// Ends a running member `canceled` (or, past its group's deadline, which caps
    /// its own, `timed_out`) with `reason`; true when this call ended it.
    pub async fn end_member(
        &self,
        tenant: &str,
        id: Uuid,
        now: DateTime<Utc>,
        status: Status,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let ended = |state: Option<String>| {
            EventBody::end(
                status,
                Ending {
                    reason: reason.to_string(),
                    state,
                    error_detail: None,
                    last_error: None,
                    output: None,
                },
            )
            .to_parts()
        };
        sql!(self.end_running(tenant, id, now, reason, status.as_str(), None, None, &ended))
    }

    /// Groups to look at again: running ones past their deadline, and ended ones
    /// that keep their members running whose deadline (which caps their members')
    /// passed within `recent` and that still have running members; with `all`,
    /// every running group and every ended one that still has running members to
    /// cancel or to end at its deadline; at most `limit`.
    pub async fn to_settle(
        &self,
        now: DateTime<Utc>,
        all: bool,
        recent: chrono::Duration,
        limit: i64,
    ) -> Result<Vec<Uuid>, StoreError> {
        sql!(self.groups_to_settle(now, all, recent, limit))
    }

    /// The ids of the waits each of this process's progress writes ended, as the
    /// write commits, on Postgres (SQLite publishes every notice on the bus at
    /// commit already). Early word for this replica's group watcher: the same
    /// ends reach every replica as notices once the sequencer numbers them, which
    /// in a burst of ends takes a sequencer run or two. A receiver that falls
    /// behind misses some; the notices still come.
    pub fn local_ends(&self) -> tokio::sync::broadcast::Receiver<Arc<[Uuid]>> {
        self.core.ends.subscribe()
    }

    /// Fills in how each wait stands in a group: a group's mode and members, a
    /// member's group.
    pub async fn annotate(&self, waits: &mut [Wait]) -> Result<(), StoreError> {
        self.core.annotate_groups_of(waits.iter_mut()).await
    }
}

/// What the groups' reads share with the outbox's, which shows a delivery's
/// wait as it stands in its groups.
impl Core {
    /// The memberships that name any of `ids`, as group or as member.
    async fn group_links(&self, ids: &[Uuid]) -> Result<Vec<LinkRow>, StoreError> {
        if ids.is_empty() {
            return Ok(vec![]);
        }
        match &self.db {
            Dialect::Postgres(d) => d.group_links(ids).await,
            Dialect::Sqlite(d) => d.group_links(ids).await,
        }
    }

    /// [`Groups::annotate`] over waits held elsewhere (a delivery's wait).
    pub(super) async fn annotate_groups_of<'a>(
        &self,
        waits: impl IntoIterator<Item = &'a mut Wait>,
    ) -> Result<(), StoreError> {
        let mut waits: Vec<&mut Wait> = waits.into_iter().collect();
        let ids: Vec<Uuid> = waits.iter().map(|w| w.id).collect();
        let links = self.group_links(&ids).await?;
        if links.is_empty() {
            return Ok(());
        }
        let mut groups: HashMap<Uuid, (GroupMode, BTreeMap<i32, GroupMember>)> = HashMap::new();
        let mut group_of: HashMap<Uuid, Uuid> = HashMap::new();
        for l in links {
            let entry = groups
                .entry(l.group_id)
                .or_insert_with(|| (mode_of(&l.mode).unwrap_or(GroupMode::All), BTreeMap::new()));
            entry.1.insert(
                l.position,
                GroupMember {
                    id: l.member_id,
                    status: status_of(&l.status)?,
                    required: l.required,
                },
            );
            // UUIDv7 order: the first group that named it.
            group_of
                .entry(l.member_id)
                .and_modify(|g| *g = (*g).min(l.group_id))
                .or_insert(l.group_id);
        }
        for w in waits.iter_mut() {
            if let Some((mode, members)) = groups.get(&w.id) {
                w.grouping.mode = Some(*mode);
                w.grouping.members = Some(members.values().cloned().collect());
            }
            w.grouping.group = group_of.get(&w.id).copied();
        }
        Ok(())
    }
}
