//! Memory per tracked key: the size of each algorithm's per-key cell, and the resident memory
//! a `KeyedLimiter` adds for one million `u64` keys (read from /proc/self/statm).
//! Run: `cargo bench -p sluice-core --bench memory`

use std::time::Duration;

use sluice_core::{FixedWindow, Gcra, KeyedLimiter, ManualClock, Rate};

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn per_key<A: sluice_core::CellFor>(name: &str, algorithm: A, keys: u64) {
    let before = rss_bytes().unwrap_or(0);
    let limiter =
        KeyedLimiter::<u64, _, _>::with_capacity(algorithm, ManualClock::new(1), keys as usize);
    for k in 0..keys {
        limiter.check_at(&k, 1, 1);
    }
    let after = rss_bytes().unwrap_or(0);
    println!(
        "{name}: cell {} bytes; {keys} keys add {:.1} MiB resident = {:.1} bytes per key (key is 8 bytes)",
        std::mem::size_of::<A::Cell>(),
        (after.saturating_sub(before)) as f64 / 1048576.0,
        after.saturating_sub(before) as f64 / keys as f64
    );
    drop(limiter);
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rate = Rate::new(100, Duration::from_secs(60)).unwrap();
    println!(
        "state: gcra {} bytes, fixed_window {} bytes",
        std::mem::size_of::<u64>(),
        std::mem::size_of::<sluice_core::FixedWindowState>()
    );
    per_key("gcra", Gcra::new(rate), 1_000_000);
    per_key("fixed_window", FixedWindow::new(rate), 1_000_000);
}
