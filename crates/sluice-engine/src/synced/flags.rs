//! What a synced key knows about itself, in one byte of named flags (its sharing phase a
//! two-bit field of them), and its recent activity.

bitflags::bitflags! {
    /// A synced key's flags.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(crate) struct KeyFlags: u8 {
        /// The key has been checked once: its window and first sight are set.
        const INIT = 1;
        /// Where the key is in learning whether it is shared: a two-bit field, read and
        /// changed only as a [`Sharing`] (`KeyFlags::sharing`, `KeyFlags::set_sharing`).
        const SHARING = 0b110;
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

/// Where a key is in learning whether it is shared. Whether the key is shared is settled once
/// a reply shows another instance (its entry, or counts no entry accounts for) after a reply
/// to a span-boundary flush, or a boundary reply and a read sent once the boundary's flushes
/// have landed show this instance alone. One reply cannot tell: instances that flush at the
/// same span boundary right after this one are not in it yet, so until then the key keeps
/// exchanging entries (alone, it would send only its count and learn of the others as one
/// unlisted group, from a total a span old).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// No reply with entries yet: the key's cold start.
    Cold = 0,
    /// Replies with entries have come; no reply to a span-boundary flush in this window yet.
    Unsettled = 1,
    /// One reply to a span-boundary flush in this window (the instances that flushed at the
    /// same boundary may not be in it yet).
    OneBoundaryReply = 2,
    /// Settled (shared, or this instance's alone).
    Settled = 3,
}

impl Sharing {
    /// A reply for the key carried entries: its cold start is over.
    pub(crate) fn seen_entries(self) -> bool {
        self != Self::Cold
    }

    pub(crate) fn settled(self) -> bool {
        self == Self::Settled
    }

    /// Whether a reply to a span-boundary flush has come in this window (what a settled key
    /// answers does not matter: it stays settled).
    pub(crate) fn boundary_replied(self) -> bool {
        matches!(self, Self::OneBoundaryReply | Self::Settled)
    }

    /// After a reply with entries.
    pub(crate) fn entries_seen(self) -> Self {
        match self {
            Self::Cold => Self::Unsettled,
            s => s,
        }
    }

    /// A reply to a span-boundary flush (not the window's first span's): the next phase, and
    /// whether it is the second in the window (the key settles then, if it shows another
    /// instance: see `KeyState::settles`).
    pub(crate) fn boundary_reply(self) -> (Self, bool) {
        match self {
            Self::Cold | Self::Unsettled => (Self::OneBoundaryReply, false),
            s => (s, true),
        }
    }

    /// A new window: the replies of the window before say nothing of who counts in this one.
    pub(crate) fn new_window(self) -> Self {
        match self {
            Self::OneBoundaryReply => Self::Unsettled,
            s => s,
        }
    }

    /// Every other instance went quiet: settled again as a new key is (a cold key stays cold).
    pub(crate) fn unsettle(self) -> Self {
        match self {
            Self::Cold => Self::Cold,
            _ => Self::Unsettled,
        }
    }
}

impl KeyFlags {
    /// The key's sharing phase.
    pub(crate) fn sharing(self) -> Sharing {
        match (self.bits() & Self::SHARING.bits()) >> 1 {
            0 => Sharing::Cold,
            1 => Sharing::Unsettled,
            2 => Sharing::OneBoundaryReply,
            _ => Sharing::Settled,
        }
    }

    pub(crate) fn set_sharing(&mut self, phase: Sharing) {
        let bits = (self.bits() & !Self::SHARING.bits()) | ((phase as u8) << 1);
        *self = Self::from_bits_retain(bits);
    }
}

bitflags::bitflags! {
    /// A synced key's recent activity, in one byte: the windows it was checked in (bits 0, 1,
    /// 2: its window, the one before, the one before that; an idle key is evicted once all
    /// three are clear), its early syncs, and whether a door records its usage.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(crate) struct Activity: u8 {
        const CHECKED = 0b111;
        /// An early sync was asked for in the current span (at most one a span).
        const EARLY_ASKED = 1 << 3;
        /// Asked, and not yet handed to the rule's queue of early syncs.
        const EARLY_TO_QUEUE = 1 << 4;
        /// The span's early sync was asked at a boundary reply, to read the boundary's
        /// flushes once they have landed: its reply gives the span its early sync back.
        const BOUNDARY_READ = 1 << 5;
        /// The key's demand has been sampled (or its opening hit set aside) once: its demand
        /// interval no longer opens with a hit.
        const SAMPLED = 1 << 6;
        /// Usage of the key has been recorded without a decision (a door whose clients
        /// enforce their own assignments: RLQS): the room it hands them is read at every
        /// report, so a boundary reply that may lack the others' flushes reads again. It
        /// lasts until the key is evicted (idle for three windows), whoever counts the key
        /// meanwhile: such a key reads at most once more a span than a checked one.
        const RECORDED = 1 << 7;
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
        self.remove(Self::EARLY_ASKED | Self::EARLY_TO_QUEUE | Self::BOUNDARY_READ);
    }

    /// Asks for the read after a boundary's flushes have landed: whether this call asked.
    /// Asked at a reply, it takes the span's early sync only until its own reply, so that a
    /// request refused later in the span may still read (and retry in 25 ms, not at the
    /// span's end), and a penalty still publishes itself at once.
    pub(crate) fn ask_boundary_read(&mut self) -> bool {
        let asked = self.ask_early();
        if asked {
            self.insert(Self::BOUNDARY_READ);
        }
        asked
    }

    /// An early sync's reply: when it was the boundary's read, the span may ask again.
    pub(crate) fn early_replied(&mut self) {
        if self.contains(Self::BOUNDARY_READ) {
            self.remove(Self::BOUNDARY_READ | Self::EARLY_ASKED);
        }
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
    fn the_sharing_phase_is_kept_apart_from_the_other_flags() {
        let mut f = KeyFlags::INIT | KeyFlags::PREV_KNOWN | KeyFlags::SPAN_SET;
        assert_eq!(f.sharing(), Sharing::Cold);
        for phase in [
            Sharing::Unsettled,
            Sharing::OneBoundaryReply,
            Sharing::Settled,
            Sharing::Cold,
        ] {
            f.set_sharing(phase);
            assert_eq!(f.sharing(), phase);
            assert!(f.contains(KeyFlags::INIT | KeyFlags::PREV_KNOWN | KeyFlags::SPAN_SET));
        }
    }

    #[test]
    fn two_boundary_replies_settle_and_a_new_window_forgets_one() {
        let (one, second) = Sharing::Cold.boundary_reply();
        assert_eq!(
            (one.entries_seen(), second),
            (Sharing::OneBoundaryReply, false)
        );
        assert_eq!(one.new_window(), Sharing::Unsettled);
        assert!(one.boundary_reply().1);
        assert_eq!(Sharing::Settled.new_window(), Sharing::Settled);
        assert_eq!(Sharing::Settled.unsettle(), Sharing::Unsettled);
        assert_eq!(Sharing::Cold.unsettle(), Sharing::Cold);
    }

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
