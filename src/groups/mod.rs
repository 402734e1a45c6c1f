//! Groups: one wait that decides from others, `all` of them or `any` of them, under
//! one deadline.
//!
//! A group is a row of `waits` like any other, so every route that serves a wait
//! serves it; it is never polled (it has no next poll, so no claim takes it).
//! [`request`] reads a create body into members and the group's own fields;
//! [`decide`] is the rule, pure (no I/O, no clock: `now` is passed in); [`watch`]
//! applies it on every replica when a member ends, and sweeps for what a notice
//! may have missed; [`states`] writes how far the open groups are, off the path
//! of the decisions. The store ends a group with a conditional update, as it ends
//! any wait, so however many replicas decide at once, one decision lands.

pub mod decide;
pub mod request;
pub mod states;
pub mod watch;

pub use decide::{Decision, MemberState, decide, progress};
pub use request::{GroupRequest, MemberRequest, Refusal, is_group};

/// Most members a group may have.
pub const MAX_MEMBERS: usize = 100;
