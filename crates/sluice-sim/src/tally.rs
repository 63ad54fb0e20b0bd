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

    /// One request of `key` at `t` (ns since the start; `now` on the true clock) costing
    /// `cost`, admitted or not, in windows of `window_ns` (weighted as a sliding window does
    /// with `sliding`). Returns whether it was a false denial: refused though the key's true
    /// count in the window had room for it.
    pub(crate) fn record(
        &mut self,
        (key, t, now): (u32, u64, u64),
        (cost, allowed): (u64, bool),
        (window_ns, sliding): (u64, bool),
    ) -> bool {
        let window = now / window_ns;
        let limit = self.limit;
        let count = self.at(key, window);
        count.offered += cost;
        if allowed {
            count.current += cost;
            let over = count.current > limit;
            *self
                .admitted_by_window
                .entry(window - self.first_window)
                .or_default() += cost;
            if over {
                for (a, &(attacker, start)) in self.attacks.iter().enumerate() {
                    if attacker == key && t >= start && self.full_at[a].is_none() {
                        self.full_at[a] = Some(t);
                    }
                }
            }
            return false;
        }
        let in_window = if sliding {
            let elapsed = (now % window_ns) as f64 / window_ns as f64;
            count.previous as f64 * (1.0 - elapsed) + count.current as f64
        } else {
            count.current as f64
        };
        for (a, &(attacker, start)) in self.attacks.iter().enumerate() {
            if attacker == key && t >= start && self.reactions[a].is_none() {
                self.reactions[a] = Some(self.full_at[a].map_or(0, |f| t - f));
            }
        }
        in_window + cost as f64 <= limit as f64
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
