//! What a synced key knows about itself, in one byte of named flags, and its recent activity.

bitflags::bitflags! {
    /// A synced key's flags.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(crate) struct KeyFlags: u8 {
        /// The key has been checked once: its window and first sight are set.
        const INIT = 1;
        /// A reply for the key carried entries: its cold start is over.
        const SEEN_ENTRIES = 1 << 1;
        /// Whether the key is shared is settled: a reply showed another instance (its entry,
        /// or counts no entry accounts for), or two replies with entries showed this instance
        /// alone (so `SEEN_ENTRIES` without `SETTLED` means one such reply so far). One reply
        /// cannot tell: instances that flush at the same span boundary right after this one
        /// are not in it yet, so until then the key keeps exchanging entries (alone, it would
        /// send only its count and learn of the others as one unlisted group, from a total a
        /// span old).
        const SETTLED = 1 << 2;
        /// The previous window's total has been read in this window.
        const PREV_KNOWN = 1 << 3;
        /// A flush of this key failed (the store was unreachable) and none has succeeded since.
        const CUT_OFF = 1 << 4;
        /// Counts of the key are in the flush in progress (the flush holds them).
        const IN_FLIGHT = 1 << 5;
        /// The key has shared state in the rule's second map.
        const HAS_SHARED = 1 << 6;
        /// The key's span is set.
        const SPAN_SET = 1 << 7;
    }
}

/// Whether the key was checked in its window, the one before, the one before that (bits 0,
/// 1, 2): an idle key is evicted once all three are clear.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Activity(u8);

impl Activity {
    /// The key was checked in its current window.
    pub(crate) fn mark(&mut self) {
        self.0 |= 1;
    }

    /// `gap` windows have passed.
    pub(crate) fn shift(&mut self, gap: u64) {
        self.0 = if gap >= 3 { 0 } else { (self.0 << gap) & 0b111 };
    }

    /// Not checked in any of the last three windows.
    pub(crate) fn idle(self) -> bool {
        self.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_ages_out_after_three_windows() {
        let mut a = Activity::default();
        assert!(a.idle());
        a.mark();
        a.shift(2);
        assert!(!a.idle());
        a.shift(1);
        assert!(a.idle());
        a.mark();
        a.shift(1_000_000);
        assert!(a.idle());
    }
}
