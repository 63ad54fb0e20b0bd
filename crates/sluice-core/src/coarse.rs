//! The default clock: one atomic load of a time that a background thread publishes every
//! millisecond, steered onto the operating system's wall clock.
//!
//! The thread counts time with the TSC (`quanta`), whose rate is calibrated once when the
//! process starts. On a busy machine that calibration can be off by hundreds of parts per
//! million (seen: 260 ppm, a clock 5 to 10 ms ahead within a minute and some 22 s a day). So
//! once a second the thread compares its time with the wall clock (NTP-disciplined) and steers
//! towards it ([`Discipline`]): a difference is slewed at 1,000 ppm or at half of it per
//! second, whichever is faster, but never faster than 5%; a wall clock stepped forward by
//! 100 ms or more is followed at once. The published time never goes back.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{Clock, Nanos, StdClock, SystemClock, duration_to_nanos};

/// How often the background thread publishes the time.
pub const COARSE_CLOCK_RESOLUTION: Duration = Duration::from_millis(1);

/// How often the thread compares its time with the wall clock.
const MEASURE_EVERY: Nanos = 1_000_000_000;
/// A wall-clock reading whose bracketing TSC readings are further apart than this (the thread
/// was preempted between them) is not used.
const MEASURE_BRACKET: Nanos = 1_000_000;
/// A difference of at least this much is a step of the wall clock, not drift.
const STEP: i64 = 100_000_000;
/// Drift is slewed at up to 1/1,000 of the elapsed time (1,000 ppm: 1 ms a second).
const SLEW_DIVISOR: i64 = 1_000;
/// Larger differences (a wall clock stepped back) are slewed faster, at up to 1/20 of the
/// elapsed time (the published time runs at 95% speed at the slowest)...
const FAST_SLEW_DIVISOR: i64 = 20;
/// ...closing the difference exponentially with this time constant.
const SLEW_TIME_CONSTANT: i128 = 2_000_000_000;

/// A clock read from a value refreshed every millisecond by one background thread (started
/// once per process on first use): reading it is one atomic load.
///
/// The default clock of [`crate::KeyedLimiter::new`] and of `sluice serve`. Resolution is about
/// a millisecond; it never goes backwards, and it stays within about a millisecond of the
/// operating system's wall clock however far off the TSC's calibration is (see the module's
/// documentation). Event-driven proxies do the same (nginx and Envoy cache the time once per
/// loop iteration). Measured side by side with [`SystemClock`] and [`StdClock`] in the `clock`
/// bench (docs/BENCHMARKS.md). If the thread cannot be started, it reads the TSC like
/// [`SystemClock`].
#[derive(Clone, Debug)]
pub struct CoarseClock {
    /// Used when the thread could not be started.
    fallback: Option<SystemClock>,
}

/// The published time, nanoseconds since the Unix epoch (0 until the thread has started).
static PUBLISHED: AtomicU64 = AtomicU64::new(0);

/// Starts the publishing thread once per process; true when it runs.
fn start_publisher() -> bool {
    static STARTED: OnceLock<bool> = OnceLock::new();
    *STARTED.get_or_init(|| {
        let base = quanta::Instant::now();
        let source = move || duration_to_nanos(quanta::Instant::now().duration_since(base));
        let mut discipline = Discipline::new(source(), StdClock.now());
        // The first value is published before any clock reads it.
        PUBLISHED.store(discipline.tick(source()), Ordering::Relaxed);
        std::thread::Builder::new()
            .name("sluice-clock".into())
            .spawn(move || {
                let mut next_measure = source().saturating_add(MEASURE_EVERY);
                loop {
                    std::thread::sleep(COARSE_CLOCK_RESOLUTION);
                    let now = source();
                    if now >= next_measure {
                        next_measure = now.saturating_add(MEASURE_EVERY);
                        let before = source();
                        let wall = StdClock.now();
                        let after = source();
                        if after - before <= MEASURE_BRACKET {
                            discipline.measure(before + (after - before) / 2, wall);
                        }
                    }
                    PUBLISHED.store(discipline.tick(source()), Ordering::Relaxed);
                }
            })
            .is_ok()
    })
}

impl CoarseClock {
    /// Creates a coarse clock, starting the process's publishing thread if needed.
    pub fn new() -> Self {
        let fallback = (!start_publisher()).then(SystemClock::new);
        Self { fallback }
    }
}

impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        if let Some(precise) = &self.fallback {
            return precise.now();
        }
        PUBLISHED.load(Ordering::Relaxed)
    }
}

/// Steers a steady time source (the TSC, whose rate may be off) onto the wall clock, without
/// ever going back: the published time is the source plus an offset that moves towards the
/// last measured difference at a bounded rate.
#[derive(Clone, Debug)]
struct Discipline {
    /// Added to the source for the published time.
    offset: i64,
    /// The wall clock minus the source, as last measured.
    target: i64,
    /// The source at the last tick.
    last_source: Nanos,
    /// The last published time.
    published: Nanos,
}

impl Discipline {
    fn new(source: Nanos, wall: Nanos) -> Self {
        let offset = difference(wall, source);
        Self {
            offset,
            target: offset,
            last_source: source,
            published: wall,
        }
    }

    /// Records a wall-clock reading taken at `source`.
    fn measure(&mut self, source: Nanos, wall: Nanos) {
        self.target = difference(wall, source);
    }

    /// The time to publish at `source`: the offset moves towards the target by what the time
    /// since the last tick allows, and the result is never below the last one.
    fn tick(&mut self, source: Nanos) -> Nanos {
        let elapsed = i64::try_from(source.saturating_sub(self.last_source)).unwrap_or(i64::MAX);
        self.last_source = source.max(self.last_source);
        let error = self.target.saturating_sub(self.offset);
        let allowed = if error >= STEP {
            error
        } else {
            let proportional =
                i128::from(error.unsigned_abs()) * i128::from(elapsed) / SLEW_TIME_CONSTANT;
            i64::try_from(proportional)
                .unwrap_or(i64::MAX)
                .min(elapsed / FAST_SLEW_DIVISOR)
                .max(elapsed / SLEW_DIVISOR)
        };
        self.offset = self
            .offset
            .saturating_add(error.clamp(allowed.saturating_neg(), allowed));
        let time = self.last_source.saturating_add_signed(self.offset);
        self.published = self.published.max(time);
        self.published
    }
}

/// `a - b` as a signed number of nanoseconds (saturating: both are within centuries).
fn difference(a: Nanos, b: Nanos) -> i64 {
    if a >= b {
        i64::try_from(a - b).unwrap_or(i64::MAX)
    } else {
        i64::try_from(b - a).map_or(i64::MIN, |d| -d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    const SEC: Nanos = 1_000_000_000;
    const EPOCH: Nanos = 1_800_000_000 * SEC;

    /// Runs `seconds` of ticks every millisecond with a source running `ppm` fast, the wall
    /// clock changed by `wall_step` (in nanoseconds) at `step_at`, and calls `check` with (wall,
    /// published) every tick.
    fn run(
        seconds: u64,
        ppm: i64,
        step_at: Nanos,
        wall_step: i64,
        mut check: impl FnMut(Nanos, Nanos, Nanos),
    ) {
        let source_at = |t: Nanos| t.saturating_add_signed(t as i64 / 1_000_000 * ppm);
        let wall_at = |t: Nanos| {
            let wall = EPOCH + t;
            if t >= step_at {
                wall.saturating_add_signed(wall_step)
            } else {
                wall
            }
        };
        let mut d = Discipline::new(source_at(0), wall_at(0));
        let mut last = 0;
        for tick in 1..=seconds * 1_000 {
            let t = tick * MS;
            if t.is_multiple_of(SEC) {
                d.measure(source_at(t), wall_at(t));
            }
            let published = d.tick(source_at(t));
            assert!(published >= last, "went back at {t}: {published} < {last}");
            last = published;
            check(t, wall_at(t), published);
        }
    }

    #[test]
    fn a_fast_or_slow_tsc_is_held_on_the_wall_clock() {
        // 260 ppm fast, as measured on a busy machine (uncorrected: 15.6 ms ahead in a
        // minute), and 400 ppm slow.
        for ppm in [260, -400] {
            let mut worst = 0;
            run(600, ppm, u64::MAX, 0, |t, wall, published| {
                if t > SEC {
                    worst = worst.max(wall.abs_diff(published));
                }
            });
            assert!(worst < MS / 2, "{ppm} ppm: {worst} ns off the wall clock");
        }
    }

    #[test]
    fn a_wall_clock_stepped_forward_is_followed_at_once() {
        let mut off_after = 0;
        run(20, 0, 5 * SEC, 2 * SEC as i64, |t, wall, published| {
            if t >= 6 * SEC + MS {
                off_after = off_after.max(wall.abs_diff(published));
            }
        });
        assert!(off_after < MS, "{off_after} ns off after the step");
    }

    #[test]
    fn a_wall_clock_stepped_back_is_slewed_without_going_back() {
        // 2 s back at 5%: about 40 s to catch up; `run` asserts the time never goes back.
        let mut off_at_end = 0;
        let mut rate_at_worst = Nanos::MAX;
        let mut last = (0, 0);
        run(60, 0, 5 * SEC, -2 * (SEC as i64), |t, wall, published| {
            if last.0 != 0 {
                rate_at_worst = rate_at_worst.min(published - last.1);
            }
            last = (t, published);
            off_at_end = wall.abs_diff(published);
        });
        assert!(off_at_end < MS, "{off_at_end} ns off 55 s after the step");
        assert!(
            rate_at_worst >= MS * 94 / 100,
            "ran at {rate_at_worst} ns per ms"
        );
    }

    #[test]
    fn the_published_time_is_near_the_wall_clock_and_monotonic() {
        let clock = CoarseClock::new();
        let a = clock.now();
        let wall = StdClock.now();
        assert!(
            wall.abs_diff(a) < SEC,
            "coarse clock drifted: {a} vs {wall}"
        );
        // The thread publishes every millisecond; a busy machine may hold it back a while.
        let moved = (0..1_000).any(|_| {
            std::thread::sleep(Duration::from_millis(1));
            clock.now() > a
        });
        assert!(
            moved,
            "the published time did not move from {a} in a second"
        );
    }
}
