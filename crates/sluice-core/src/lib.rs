//! Pure rate-limiting algorithms for Sluice.
//!
//! This crate has no I/O and no async runtime. Time comes from a [`Clock`]; every algorithm is
//! a pure function `(state, now, cost) -> (Decision, state)` (see [`Algorithm`]); a
//! [`KeyedLimiter`] applies one algorithm to many keys in memory.
//!
//! ```
//! use sluice_core::{Decision, FixedWindow, KeyedLimiter, ManualClock, Rate};
//! use std::num::NonZeroU64;
//! use std::time::Duration;
//!
//! let clock = ManualClock::new(0);
//! let limiter = KeyedLimiter::with_clock(
//!     FixedWindow::new(Rate::per_minute(NonZeroU64::new(3).unwrap())),
//!     clock.clone(),
//! );
//! for _ in 0..3 {
//!     assert!(limiter.check("user-1", 1).is_allowed());
//! }
//! match limiter.check("user-1", 1) {
//!     Decision::Denied(d) => assert_eq!(d.retry_after, Duration::from_secs(60)),
//!     other => panic!("expected a denial, got {other:?}"),
//! }
//! clock.advance(Duration::from_secs(60));
//! assert!(limiter.check("user-1", 1).is_allowed());
//! ```

mod algorithm;
mod cell;
mod clock;
mod coarse;
mod decision;
mod keyed;
mod rate;

pub use algorithm::{
    Algorithm, Cooldown, CooldownState, FixedWindow, FixedWindowState, Gcra, LeakyBucket,
    LeakyBucketState, LeakyQueue, SlidingLog, SlidingLogState, SlidingWindow, SlidingWindowState,
};
pub use cell::{AtomicCell, LockedCell, StateCell};
pub use clock::{Clock, ManualClock, Nanos, StdClock, SystemClock, duration_to_nanos};
pub use coarse::{COARSE_CLOCK_RESOLUTION, CoarseClock};
pub use decision::{Allowed, Decision, Denied, InsufficientCapacity, MAX_COST};
pub use keyed::{CellFor, KeyedLimiter};
pub use rate::{Rate, RateError, format_duration};
