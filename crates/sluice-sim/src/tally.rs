//! The simulator's true counts: each key's admitted and offered requests in its current
//! window, and, as windows close, the over-admission figures and every key-window's counts
//! (for the figures per class).

use std::collections::BTreeMap;

use crate::classes::WindowCount;

/// The true count of one key in its current window.
#[derive(Clone, Copy, Default)]
pub(crate) struct KeyCount {
    pub(crate) window: u64,
    pub(crate) current: u64,
    /// Asked for in the window (admitted or not).
    pub(crate) offered: u64,
    pub(crate) previous: u64,
    pub(crate) seen: bool,
    /// The key's first window: it had no request in the window before (a new key, a returning
    /// one, a new user): every instance starts without news of the others.
    pub(crate) first: bool,
}

pub(crate) struct Tally<'a> {
    pub(crate) limit: u64,
    pub(crate) busiest: u32,
    pub(crate) over: Vec<f64>,
    /// Over-admission of first windows (a subset of `over`) and of the others.
    pub(crate) over_first: Vec<f64>,
    pub(crate) over_warm: Vec<f64>,
    pub(crate) over_by_window: BTreeMap<u64, f64>,
    /// Admitted per window, all keys together.
    pub(crate) admitted_by_window: BTreeMap<u64, u64>,
    pub(crate) busiest_series: BTreeMap<u64, u64>,
    pub(crate) counts: Vec<KeyCount>,
    /// Every key-window's counts, for the figures per class: (key, counts).
    pub(crate) closed: Vec<(u32, WindowCount)>,
    pub(crate) first_window: u64,
    pub(crate) attacks: &'a [(u32, u64)],
    /// Per attack: when an admission first put the attacker's key over the limit, and how long
    /// until its first denial after that (0 when it was denied before going over).
    pub(crate) full_at: Vec<Option<u64>>,
    pub(crate) reactions: Vec<Option<u64>>,
}

impl Tally<'_> {
    pub(crate) fn close(&mut self, key: u32, c: KeyCount) {
        if !c.seen {
            return;
        }
        let pct = c.current.saturating_sub(self.limit) as f64 * 100.0 / self.limit as f64;
        self.over.push(pct);
        self.closed.push((
            key,
            WindowCount {
                offered: c.offered,
                admitted: c.current,
            },
        ));
        if c.first {
            self.over_first.push(pct);
        } else {
            self.over_warm.push(pct);
        }
        let rel = c.window - self.first_window;
        let slot = self.over_by_window.entry(rel).or_default();
        *slot = slot.max(pct);
        if key == self.busiest {
            self.busiest_series.insert(rel, c.current);
        }
    }

    /// The key's count moved to `window`.
    pub(crate) fn at(&mut self, key: u32, window: u64) -> &mut KeyCount {
        let c = self.counts[key as usize];
        if !c.seen || c.window != window {
            self.close(key, c);
            let follows = c.seen && c.window + 1 == window;
            self.counts[key as usize] = KeyCount {
                window,
                current: 0,
                offered: 0,
                previous: if follows { c.current } else { 0 },
                seen: true,
                first: !follows,
            };
        }
        &mut self.counts[key as usize]
    }
}
