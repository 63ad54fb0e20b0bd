//! How far the clocks drift from the OS wall clock: prints, every 10 s for `SECONDS` (default
//! 120), the largest difference seen from the wall clock for `CoarseClock` (steered onto it)
//! and `SystemClock` (a TSC anchored once). Start it on a busy machine to see a TSC calibrated
//! under load, and the coarse clock's lag when its thread is not scheduled for a while.
//!
//! `cargo run --release -p sluice-core --example clock_drift`

use std::time::Duration;

use sluice_core::{Clock, CoarseClock, StdClock, SystemClock};

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let coarse = CoarseClock::new();
    let system = SystemClock::new();
    let signed_ms = |a: u64, b: u64| (a as f64 - b as f64) / 1e6;
    println!("elapsed_s coarse_minus_wall_ms(max abs) system_minus_wall_ms(last)");
    for step in 1..=seconds / 10 {
        let mut worst: f64 = 0.0;
        let mut system_off = 0.0;
        for _ in 0..100 {
            std::thread::sleep(Duration::from_millis(100));
            let wall = StdClock.now();
            let c = signed_ms(coarse.now(), wall);
            if c.abs() > worst.abs() {
                worst = c;
            }
            system_off = signed_ms(system.now(), wall);
        }
        println!("{:>9} {worst:>+10.3} {system_off:>+10.3}", step * 10);
    }
}
