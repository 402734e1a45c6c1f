//! A notice: the word that a wait has news, as it travels between replicas (a
//! Postgres `NOTIFY` payload) and inside one (a [`super::BusMsg`]).
//!
//! On the wire a notice is one line: `wait_id seq gid flag`, then, when they fit,
//! the events themselves as JSON, so a stream that has seen everything before them
//! sends them on without reading the table. The flag is the notice's
//! [`NoticeKind`]: `c` created, `t` ended, `-` otherwise.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::model::{Event, EventBody};

/// What the newest event of a notice means for its listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeKind {
    /// The wait was created (worth a claim).
    Created,
    /// The wait ended (blocked requests answer; its owner stops polling it).
    Ended,
    /// Anything else.
    Other,
}

impl NoticeKind {
    fn flag(self) -> char {
        match self {
            NoticeKind::Created => 'c',
            NoticeKind::Ended => 't',
            NoticeKind::Other => '-',
        }
    }

    fn from_flag(c: char) -> Option<NoticeKind> {
        Some(match c {
            'c' => NoticeKind::Created,
            't' => NoticeKind::Ended,
            '-' => NoticeKind::Other,
            _ => return None,
        })
    }

    /// The kind of a notice announcing `events` (oldest first).
    pub fn of(events: &[Event]) -> NoticeKind {
        if events.iter().any(Event::is_terminal) {
            NoticeKind::Ended
        } else if events
            .iter()
            .any(|e| matches!(e.body, EventBody::Created { .. }))
        {
            NoticeKind::Created
        } else {
            NoticeKind::Other
        }
    }
}

/// A wait, its newest seq, the newest global event id, what they mean, and the
/// events themselves when they fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub wait_id: Uuid,
    pub seq: i32,
    pub gid: i64,
    pub kind: NoticeKind,
    /// The events the notice announces, oldest first, when they fit in it.
    pub events: Option<Arc<[Event]>>,
}

/// An event inside a notice: global id, seq, kind, time, the kind's fields.
type Packed = (i64, i32, String, DateTime<Utc>, Value);

/// The longest notice line that carries its events (Postgres allows 8,000 bytes a
/// payload; several notices share one).
pub const MAX_LINE: usize = 2000;

impl Notice {
    /// The notice announcing `events` of `wait_id` (sequenced, oldest first).
    pub fn announcing(wait_id: Uuid, events: Vec<Event>) -> Notice {
        let (seq, gid) = events
            .last()
            .map(|e| (e.seq, e.id.unwrap_or_default()))
            .unwrap_or_default();
        Notice {
            wait_id,
            seq,
            gid,
            kind: NoticeKind::of(&events),
            events: Some(events.into()),
        }
    }

    pub fn is_terminal(&self) -> bool {
        self.kind == NoticeKind::Ended
    }

    /// One line; the events go along when the line stays within [`MAX_LINE`].
    pub fn encode(&self) -> String {
        let head = format!(
            "{} {} {} {}",
            self.wait_id,
            self.seq,
            self.gid,
            self.kind.flag()
        );
        let Some(events) = &self.events else {
            return head;
        };
        let packed: Vec<Packed> = events
            .iter()
            .map(|e| {
                let (kind, data) = e.body.to_parts();
                (
                    e.id.unwrap_or_default(),
                    e.seq,
                    kind.to_string(),
                    e.at,
                    data,
                )
            })
            .collect();
        match serde_json::to_string(&packed) {
            Ok(json) if head.len() + 1 + json.len() <= MAX_LINE => format!("{head} {json}"),
            _ => head,
        }
    }

    pub fn decode(line: &str) -> Option<Notice> {
        let mut parts = line.splitn(5, ' ');
        let wait_id = parts.next()?.parse().ok()?;
        let seq = parts.next()?.parse().ok()?;
        let gid = parts.next()?.parse().ok()?;
        let kind = NoticeKind::from_flag(parts.next()?.chars().next()?)?;
        // Events that do not parse are left out: the subscriber reads them instead.
        let events = parts.next().and_then(|json| {
            let packed: Vec<Packed> = serde_json::from_str(json).ok()?;
            packed
                .into_iter()
                .map(|(gid, seq, kind, at, data)| {
                    Some(Event {
                        id: Some(gid),
                        seq,
                        wait_id,
                        at,
                        body: EventBody::from_parts(&kind, data).ok()?,
                    })
                })
                .collect::<Option<Vec<Event>>>()
                .map(Arc::from)
        });
        Some(Notice {
            wait_id,
            seq,
            gid,
            kind,
            events,
        })
    }
}

/// Notice lines packed into payloads under Postgres's 8,000-byte limit.
pub fn payloads(lines: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut payloads = Vec::new();
    let mut current = String::new();
    for line in lines {
        if !current.is_empty() && current.len() + line.len() + 1 > 7000 {
            payloads.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push('\n');
        }
        current.push_str(&line);
    }
    if !current.is_empty() {
        payloads.push(current);
    }
    payloads
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Ending, Status};

    #[test]
    fn a_notice_round_trips_with_and_without_its_events() {
        let wait_id = Uuid::now_v7();
        let at = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.123Z")
            .unwrap()
            .with_timezone(&Utc);
        let events = vec![
            Event {
                id: Some(16),
                seq: 2,
                wait_id,
                at,
                body: EventBody::State {
                    from: Some("a b".into()),
                    to: "on\nx".into(),
                },
            },
            Event {
                id: Some(17),
                seq: 3,
                wait_id,
                at,
                body: EventBody::end(
                    Status::Succeeded,
                    Ending {
                        reason: "reached on".into(),
                        state: Some("on".into()),
                        error_detail: None,
                        last_error: None,
                        output: None,
                    },
                ),
            },
        ];
        let full = Notice::announcing(wait_id, events);
        assert_eq!((full.seq, full.gid, full.kind), (3, 17, NoticeKind::Ended));
        let line = full.encode();
        assert!(!line.contains('\n'), "one notice is one line: {line}");
        assert_eq!(Notice::decode(&line), Some(full.clone()));
        let bare = Notice {
            events: None,
            ..full
        };
        assert_eq!(Notice::decode(&bare.encode()), Some(bare.clone()));
        // Unreadable events are dropped, the notice itself kept.
        let broken = format!("{} [[1,", bare.encode());
        assert_eq!(Notice::decode(&broken), Some(bare));
        assert_eq!(Notice::decode("not a notice"), None);
    }

    #[test]
    fn payloads_stay_under_the_limit_and_keep_every_line() {
        let lines: Vec<String> = (0..100)
            .map(|i| format!("{i}:{}", "x".repeat(190)))
            .collect();
        let p = payloads(lines.clone());
        assert!(p.len() > 1);
        assert!(p.iter().all(|x| x.len() <= 7000));
        let back: Vec<String> = p
            .iter()
            .flat_map(|x| x.lines().map(str::to_string))
            .collect();
        assert_eq!(back, lines);
    }
}
