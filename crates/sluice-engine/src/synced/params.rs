//! A synced rule's settings, and the window and span arithmetic on them.

use std::time::Duration;

use sluice_config::Policy;
use sluice_core::Nanos;

use super::time::Timeline;

/// A rule's synced settings.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SyncedParams {
    /// At most `u32::MAX` (the config refuses more): counts are 32-bit.
    pub limit: u64,
    pub window_ns: u64,
    pub spans: u64,
    pub span_ns: u64,
    /// Zero: blocked until the window ends.
    pub cooldown_ns: u64,
    pub policy: Policy,
    /// Add the previous window's weighted total (sliding window counter estimate).
    pub sliding: bool,
    /// Instances the deployment expects (`EngineOptions::expected_instances`).
    pub expected_instances: u64,
}

impl SyncedParams {
    /// How long a window's keys live in the store: two windows.
    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_nanos(self.window_ns.saturating_mul(2))
    }

    /// The number of the window `now` falls in.
    pub(crate) fn window_of(&self, now: Nanos) -> u64 {
        now / self.window_ns
    }

    pub(crate) fn window_start(&self, window: u64) -> Nanos {
        window.saturating_mul(self.window_ns)
    }

    /// The number of the span `now` falls in.
    pub(crate) fn span_of(&self, now: Nanos) -> u64 {
        now / self.span_ns
    }

    /// How long after a span boundary every instance's flush of that boundary has landed, as
    /// far as clock sync lets anyone know: [`super::READ_AHEAD_MARGIN`], at most a twentieth
    /// of a span.
    pub(crate) fn read_ahead_margin(&self) -> Nanos {
        (super::READ_AHEAD_MARGIN.as_nanos() as u64).min(self.span_ns / 20)
    }

    /// How long after a span boundary every instance's flush of the boundary has landed, chunked
    /// flushes of many keys included (a flush loop slower than that is behind anyway): a
    /// quarter span. What a budget set this long after a boundary read was complete.
    pub(crate) fn settle_margin(&self) -> Nanos {
        self.span_ns / 4
    }

    /// Whether a limit leaves each of `parties` instances at least two requests a span: below
    /// that it is too small to share (see `small`), and one instance's cold share is a large
    /// part of it.
    pub(crate) fn shareable(&self, parties: u64) -> bool {
        self.limit >= 2 * parties * self.spans
    }

    /// Whether the rule exchanges per-instance entries and budgets (`predictive`), rather
    /// than scaling its own count by the node estimate (`reactive`).
    pub(crate) fn predictive(&self) -> bool {
        self.policy != Policy::Reactive
    }

    /// Whether a key's first flush in a window reads the previous window's total: the
    /// reactive policy's node estimate, a sliding window's weight and a penalty earned in the
    /// last window need it; a predictive fixed window does not (one command less per key and
    /// instance in each window).
    pub(crate) fn reads_previous(&self) -> bool {
        !self.predictive() || self.sliding || self.cooldown_ns > self.window_ns
    }

    /// How the key's times are kept: offsets from its window start in `window / 2^28` (at
    /// least 1 ns), so 32 bits reach sixteen windows ahead (a cooldown is at most ten windows).
    pub(crate) fn timeline(&self) -> Timeline {
        Timeline::new((self.window_ns >> 28).max(1))
    }
}
