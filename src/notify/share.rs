//! How one replica shares its attempts between receivers: at most [`PER_HOST`] in
//! flight to one host and port, the rest waiting their turn or given back.

use std::time::Duration;

use crate::store::Due;

/// Most attempts in flight to one receiver (host and port) from one replica: one
/// receiver that hangs cannot take every slot from the others. Claimed deliveries
/// beyond it wait their turn, as many as that receiver answers in about a second;
/// one claimed beyond that is given back, due after about as long as what is ahead
/// of it takes that receiver (50 ms to 10 min).
pub const PER_HOST: usize = 16;

/// The receiver a webhook URL names, as the per-host limit counts them: host and
/// port.
pub fn receiver(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .map(|u| {
            format!(
                "{}:{}",
                u.host_str().unwrap_or(""),
                u.port_or_known_default().unwrap_or(0)
            )
        })
        .unwrap_or_default()
}

/// Where a claimed delivery goes.
pub enum Admit {
    /// Sent now.
    Send(Due),
    /// Waits for a slot of its receiver.
    Queued,
    /// Given back, due this long from now.
    PutBack(Due, Duration),
}

/// Per receiver: attempts in flight (at most [`PER_HOST`]), claimed deliveries
/// waiting for a slot, and how long its attempts take.
#[derive(Default)]
pub struct Receivers {
    slots: std::collections::HashMap<String, Slots>,
    /// Deliveries waiting, over every receiver (at most [`MAX_WAITING`]).
    waiting: usize,
}

/// Most claimed deliveries waiting for a slot on one replica (each holds its wait).
const MAX_WAITING: usize = 1024;

#[derive(Default)]
struct Slots {
    flying: usize,
    waiting: std::collections::VecDeque<(tokio::time::Instant, Due)>,
    /// Recent attempts' duration, smoothed.
    took: Duration,
}

impl Receivers {
    pub fn admit(&mut self, host: &str, d: Due) -> Admit {
        let slots = self.slots.entry(host.to_string()).or_default();
        if slots.flying < PER_HOST {
            slots.flying += 1;
            return Admit::Send(d);
        }
        // As many wait as this receiver answers in about a second (and never fewer
        // than PER_HOST): a fast one takes a burst at once, one that hangs does not
        // hold more leases than it can use.
        let per_second = if slots.took.is_zero() {
            1000
        } else {
            (1_000_000 / slots.took.as_micros().max(1)).clamp(1, 1000) as usize
        };
        if slots.waiting.len() < PER_HOST * per_second && self.waiting < MAX_WAITING {
            slots.waiting.push_back((tokio::time::Instant::now(), d));
            self.waiting += 1;
            return Admit::Queued;
        }
        // Back for about as long as what is ahead of it takes this receiver.
        let ahead = (slots.flying + slots.waiting.len()) as u32 / PER_HOST as u32;
        let after = (slots.took * ahead).clamp(Duration::from_millis(50), Duration::from_secs(600));
        Admit::PutBack(d, after)
    }

    /// An attempt to `host` finished after `took`: what goes next in its slot.
    pub fn finished(&mut self, host: &str, took: Duration, stale: Duration) -> Vec<Admit> {
        let Some(slots) = self.slots.get_mut(host) else {
            return Vec::new();
        };
        slots.flying = slots.flying.saturating_sub(1);
        slots.took = (slots.took * 3 + took) / 4;
        let mut out = Vec::new();
        while let Some((since, d)) = slots.waiting.pop_front() {
            self.waiting -= 1;
            if since.elapsed() > stale {
                out.push(Admit::PutBack(d, Duration::from_secs(1)));
                continue;
            }
            slots.flying += 1;
            out.push(Admit::Send(d));
            break;
        }
        if slots.flying == 0 && slots.waiting.is_empty() {
            self.slots.remove(host);
        }
        out
    }
}
