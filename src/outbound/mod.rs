//! The one way out: every request waitd makes to a host it does not run (a wait's
//! target, a webhook's receiver) goes through here.
//!
//! - [`KeyedSlots`]: the bound on how many at once per key (a host, a tenant's
//!   receiver, a tenant), which the API's stream caps use as well.
//!
//! It knows nothing of waits, deliveries or storage: what an answer means is the
//! caller's.

mod slots;

pub use slots::{Full, KeyedSlots, Slot};
