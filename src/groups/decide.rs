//! The rule that decides a group from its members. Pure: no I/O, no clock.

use chrono::{DateTime, Utc};

use crate::engine::bound;
use crate::model::{GroupMode, Status};
pub use crate::store::MemberState;

/// How a group ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub status: Status,
    pub reason: String,
}

fn label(mode: GroupMode, i: usize, m: &MemberState) -> String {
    format!("{}[{i}] {}", mode.as_str(), m.id)
}

/// Each member and how it stands, for a reason.
fn standings(mode: GroupMode, members: &[MemberState]) -> String {
    members
        .iter()
        .enumerate()
        .map(|(i, m)| format!("{} {}", label(mode, i, m), m.status))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The decision, or `None` while the group is still open.
///
/// `all`: succeeded when every member has ended and every required one succeeded;
/// failed as soon as a required member ends otherwise. `any`: succeeded at the
/// first success; failed when every member has ended without one. At or after the
/// group's deadline an open group is `timed_out`, and so is an `all` group whose
/// failing member timed out at the group's deadline (the group's timeout capped
/// it).
pub fn decide(
    mode: GroupMode,
    members: &[MemberState],
    deadline: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<Decision> {
    let timed_out = || Decision {
        status: Status::TimedOut,
        reason: bound::text(
            &format!("the group's deadline passed: {}", standings(mode, members)),
            bound::MAX_REASON,
        )
        .into_owned(),
    };
    let decided = match mode {
        GroupMode::All => {
            if let Some((i, m)) = members
                .iter()
                .enumerate()
                .find(|(_, m)| m.required && m.status.is_end() && m.status != Status::Succeeded)
            {
                if m.status == Status::TimedOut && m.deadline >= deadline {
                    Some(timed_out())
                } else {
                    Some(Decision {
                        status: Status::Failed,
                        reason: format!("member {} ended {}", label(mode, i, m), m.status),
                    })
                }
            } else if members.iter().all(|m| m.status.is_end()) {
                Some(Decision {
                    status: Status::Succeeded,
                    reason: if members.iter().all(|m| m.status == Status::Succeeded) {
                        "every member succeeded".into()
                    } else {
                        "every required member succeeded".into()
                    },
                })
            } else {
                None
            }
        }
        GroupMode::Any => {
            if let Some((i, m)) = members
                .iter()
                .enumerate()
                .find(|(_, m)| m.status == Status::Succeeded)
            {
                Some(Decision {
                    status: Status::Succeeded,
                    reason: format!("member {} succeeded", label(mode, i, m)),
                })
            } else if members.iter().all(|m| m.status.is_end()) {
                if members
                    .iter()
                    .all(|m| m.status == Status::TimedOut && m.deadline >= deadline)
                {
                    Some(timed_out())
                } else {
                    Some(Decision {
                        status: Status::Failed,
                        reason: bound::text(
                            &format!(
                                "every member ended without success: {}",
                                standings(mode, members)
                            ),
                            bound::MAX_REASON,
                        )
                        .into_owned(),
                    })
                }
            } else {
                None
            }
        }
    };
    match decided {
        None if now >= deadline => Some(timed_out()),
        d => d,
    }
}

/// How far a group is, as its `state` says: `2 of 3 succeeded`, and how many
/// ended otherwise when any did.
pub fn progress(members: &[MemberState]) -> String {
    let n = members.len();
    let ok = members
        .iter()
        .filter(|m| m.status == Status::Succeeded)
        .count();
    let other = members
        .iter()
        .filter(|m| m.status.is_end() && m.status != Status::Succeeded)
        .count();
    if other == 0 {
        format!("{ok} of {n} succeeded")
    } else {
        format!("{ok} of {n} succeeded, {other} ended otherwise")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;
    use uuid::Uuid;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn m(status: Status, required: bool) -> MemberState {
        MemberState {
            id: Uuid::nil(),
            status,
            required,
            deadline: at(100),
        }
    }

    use Status::*;

    #[test]
    fn all_waits_for_every_member_and_fails_at_the_first_other_end() {
        let dl = at(100);
        assert_eq!(
            decide(
                GroupMode::All,
                &[m(Succeeded, true), m(Running, true)],
                dl,
                at(1)
            ),
            None
        );
        let d = decide(
            GroupMode::All,
            &[m(Succeeded, true), m(Succeeded, true)],
            dl,
            at(1),
        )
        .unwrap();
        assert_eq!(d.status, Succeeded);
        let d = decide(
            GroupMode::All,
            &[m(Running, true), m(Failed, true)],
            dl,
            at(1),
        )
        .unwrap();
        assert_eq!(d.status, Failed);
        assert!(
            d.reason.contains("all[1]") && d.reason.contains("failed"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn an_optional_member_may_fail_without_failing_the_group() {
        let dl = at(100);
        let ms = [m(Succeeded, true), m(Failed, false)];
        assert_eq!(
            decide(GroupMode::All, &ms, dl, at(1)).unwrap().status,
            Succeeded
        );
        assert_eq!(
            decide(
                GroupMode::All,
                &[m(Running, false), m(Succeeded, true)],
                dl,
                at(1)
            ),
            None
        );
    }

    #[test]
    fn any_succeeds_at_the_first_success_and_fails_when_all_failed() {
        let dl = at(100);
        assert_eq!(
            decide(
                GroupMode::Any,
                &[m(Failed, true), m(Running, true)],
                dl,
                at(1)
            ),
            None
        );
        let d = decide(
            GroupMode::Any,
            &[m(Running, true), m(Succeeded, true)],
            dl,
            at(1),
        )
        .unwrap();
        assert_eq!((d.status, d.reason.contains("any[1]")), (Succeeded, true));
        let d = decide(
            GroupMode::Any,
            &[m(Failed, true), m(Error, true)],
            dl,
            at(1),
        )
        .unwrap();
        assert_eq!(d.status, Failed);
    }

    #[test]
    fn the_deadline_ends_an_open_group_timed_out_with_the_members_states() {
        let d = decide(
            GroupMode::All,
            &[m(Succeeded, true), m(Running, true)],
            at(100),
            at(100),
        )
        .unwrap();
        assert_eq!(d.status, TimedOut);
        assert!(
            d.reason.contains("succeeded") && d.reason.contains("running"),
            "{}",
            d.reason
        );
        // A member the group's deadline capped times out as the group does.
        let mut capped = m(TimedOut, true);
        capped.deadline = at(100);
        let d = decide(
            GroupMode::All,
            &[capped.clone(), m(Running, true)],
            at(100),
            at(99),
        )
        .unwrap();
        assert_eq!(d.status, TimedOut);
        capped.deadline = at(50);
        let d = decide(GroupMode::All, &[capped, m(Running, true)], at(100), at(99)).unwrap();
        assert_eq!(d.status, Failed);
        let _ = Duration::zero();
    }

    #[test]
    fn progress_counts_successes_and_other_ends() {
        assert_eq!(
            progress(&[m(Succeeded, true), m(Running, true), m(Succeeded, true)]),
            "2 of 3 succeeded"
        );
        assert_eq!(
            progress(&[m(Failed, true), m(Running, true)]),
            "0 of 2 succeeded, 1 ended otherwise"
        );
    }
}
