//! Requests admitted elsewhere, recorded without a decision (a client that enforces its own
//! assignment reports what it let through: see `synced/part.rs`).

use sluice_core::Nanos;

use super::super::flags::Activity;
use super::super::params::SyncedParams;
use super::super::shared::Shared;
use super::{KeyState, sat32};

impl KeyState {
    /// Counts `count` requests admitted elsewhere at `now`, whatever the room: in the window,
    /// the span, the demand and the next flush, as admitted requests are (saturating, as every
    /// count of the key).
    pub(crate) fn record(
        &mut self,
        p: &SyncedParams,
        shared: Option<&mut Shared>,
        now: Nanos,
        count: u64,
    ) {
        let w = p.window_of(now);
        self.roll(p, shared, w, now);
        self.enter_span(p, now);
        self.activity.mark();
        self.activity.insert(Activity::RECORDED);
        let count = sat32(count);
        self.offered = self.offered.saturating_add(count);
        self.local = self.local.saturating_add(count);
        self.unflushed = self.unflushed.saturating_add(count);
        self.span_count = self.span_count.saturating_add(count);
    }
}
