//! Validated limits: a count per window, hard to write wrong.

use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use crate::clock::{Nanos, duration_to_nanos};

/// `limit` units of cost per `window`. Both are non-zero by construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    limit: NonZeroU64,
    window_ns: NonZeroU64,
}

/// Why a [`Rate`] could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RateError {
    /// The limit was zero.
    #[error(
        "limit must be at least 1 (to block everything, use a limit of 1 with a long window, or deny upstream)"
    )]
    ZeroLimit,
    /// The window was shorter than a nanosecond.
    #[error("window must be longer than zero")]
    ZeroWindow,
    /// The window does not fit in nanoseconds since the epoch arithmetic.
    #[error("window must be at most 100 years")]
    WindowTooLong,
}

const MAX_WINDOW_NS: u64 = 100 * 365 * 24 * 3600 * 1_000_000_000;

impl Rate {
    /// `limit` per `window`.
    pub fn new(limit: u64, window: Duration) -> Result<Self, RateError> {
        let limit = NonZeroU64::new(limit).ok_or(RateError::ZeroLimit)?;
        let ns = duration_to_nanos(window);
        if ns > MAX_WINDOW_NS {
            return Err(RateError::WindowTooLong);
        }
        let window_ns = NonZeroU64::new(ns).ok_or(RateError::ZeroWindow)?;
        Ok(Self { limit, window_ns })
    }

    /// `limit` per second.
    pub const fn per_second(limit: NonZeroU64) -> Self {
        Self::from_parts(limit, 1_000_000_000)
    }

    /// `limit` per minute.
    pub const fn per_minute(limit: NonZeroU64) -> Self {
        Self::from_parts(limit, 60 * 1_000_000_000)
    }

    /// `limit` per hour.
    pub const fn per_hour(limit: NonZeroU64) -> Self {
        Self::from_parts(limit, 3600 * 1_000_000_000)
    }

    const fn from_parts(limit: NonZeroU64, window_ns: u64) -> Self {
        match NonZeroU64::new(window_ns) {
            Some(window_ns) => Self { limit, window_ns },
            None => panic!("constant window is zero"),
        }
    }

    /// The number of cost units admitted per window.
    #[inline]
    pub const fn limit(&self) -> u64 {
        self.limit.get()
    }

    /// The window length in nanoseconds.
    #[inline]
    pub const fn window_ns(&self) -> Nanos {
        self.window_ns.get()
    }

    /// The window length.
    pub const fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns.get())
    }

    /// Time between two units at the steady rate, rounded up so that the steady rate never
    /// exceeds `limit` per window.
    #[inline]
    pub const fn emission_interval_ns(&self) -> Nanos {
        self.window_ns.get().div_ceil(self.limit.get())
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            self.limit,
            crate::format_duration(self.window())
        )
    }
}

/// Formats a duration the way rule files write it: `1s`, `90s`, `1m`, `1h`, `1d`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    const UNITS: [(u128, &str); 7] = [
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    for (size, name) in UNITS {
        if ns >= size && ns.is_multiple_of(size) {
            return format!("{}{name}", ns / size);
        }
    }
    "0s".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emission_interval_rounds_up() {
        let r = Rate::new(3, Duration::from_secs(1)).unwrap();
        assert_eq!(r.emission_interval_ns(), 333_333_334);
        assert!(r.emission_interval_ns() * 3 >= 1_000_000_000);
    }

    #[test]
    fn rejects_zero() {
        assert_eq!(
            Rate::new(0, Duration::from_secs(1)),
            Err(RateError::ZeroLimit)
        );
        assert_eq!(Rate::new(1, Duration::ZERO), Err(RateError::ZeroWindow));
    }

    #[test]
    fn formats() {
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(
            Rate::per_minute(NonZeroU64::new(5).unwrap()).to_string(),
            "5/1m"
        );
    }
}
