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

bitflags::bitflags! {
    /// A synced key's recent activity, in one byte: the windows it was checked in (bits 0, 1,
    /// 2: its window, the one before, the one before that; an idle key is evicted once all
    /// three are clear), and its early syncs.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(crate) struct Activity: u8 {
        const CHECKED = 0b111;
        /// An early sync was asked for in the current span (at most one a span).
        const EARLY_ASKED = 1 << 3;
        /// Asked, and not yet handed to the rule's queue of early syncs.
        const EARLY_TO_QUEUE = 1 << 4;
        /// A reply to a span-boundary flush with entries has come (one: while the instances
        /// that flushed at the same boundary may not be in it yet).
        const BOUNDARY_REPLY = 1 << 5;
        /// The key's demand has been sampled (or its opening hit set aside) once: its demand
        /// interval no longer opens with a hit.
        const SAMPLED = 1 << 6;
    }
}

impl Activity {
    /// The key was checked in its current window.
    pub(crate) fn mark(&mut self) {
        self.insert(Self::from_bits_retain(1));
    }

    /// `gap` windows have passed.
    pub(crate) fn shift(&mut self, gap: u64) {
        let checked = self.bits() & Self::CHECKED.bits();
        let shifted = if gap >= 3 {
            0
        } else {
            (checked << gap) & Self::CHECKED.bits()
        };
        *self = Self::from_bits_retain((self.bits() & !Self::CHECKED.bits()) | shifted);
    }

    /// Not checked in any of the last three windows.
    pub(crate) fn idle(self) -> bool {
        !self.intersects(Self::CHECKED)
    }

    /// A new span: its early sync is still to be asked for.
    pub(crate) fn new_span(&mut self) {
        self.remove(Self::EARLY_ASKED | Self::EARLY_TO_QUEUE);
    }

    /// Asks for an early sync of the key, once a span: whether this call asked.
    pub(crate) fn ask_early(&mut self) -> bool {
        if self.contains(Self::EARLY_ASKED) {
            return false;
        }
        self.insert(Self::EARLY_ASKED | Self::EARLY_TO_QUEUE);
        true
    }

    /// Whether an early sync was asked for and not yet queued (and takes it).
    pub(crate) fn take_to_queue(&mut self) -> bool {
        let asked = self.contains(Self::EARLY_TO_QUEUE);
        self.remove(Self::EARLY_TO_QUEUE);
        asked
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

    #[test]
    fn windows_age_apart_from_the_early_sync_marks() {
        let mut a = Activity::default();
        a.mark();
        assert!(a.ask_early());
        assert!(!a.ask_early(), "once a span");
        a.shift(1);
        assert!(!a.idle());
        assert!(a.take_to_queue());
        assert!(!a.take_to_queue());
        a.new_span();
        assert!(a.ask_early());
        a.shift(5);
        assert!(a.idle());
        assert!(a.contains(Activity::EARLY_ASKED));
    }
}
