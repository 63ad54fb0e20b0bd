//! Two `sluice serve` sharing a limit of 30 per 2 s window on the `edge` domain (key `user`),
//! driven at 1.5x it through `/json`, alternately: what the store drills of etcd and Redis
//! share.

#![allow(dead_code)]

use std::time::Duration;

use sluice_core::{Clock, SystemClock};

use crate::common::http_call;

/// 30 per 2 s window, synced in 2 spans (a flush a second).
pub const RULES: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: { window: 2s, requests_per_unit: 30, spans: 2 }
";

/// One `/json` check of `user` on the instance at `port`: whether it was admitted.
pub fn check(port: u16, user: &str) -> bool {
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    );
    let (status, text) = http_call(port, "POST", "/json", &body);
    assert!(status == 200 || status == 429, "{status}: {text}");
    status == 200
}

/// 45 requests a second (1.5x the limit) for `secs`, alternately to the two instances;
/// returns the admitted count per 2 s window by send time (a request sent late in a window
/// can be decided in the next one when the machine is loaded), and the admitted total.
pub async fn drive(ports: [u16; 2], user: &str, secs: u64) -> (Vec<usize>, u64) {
    let clock = SystemClock::new();
    let start = clock.now();
    let mut admitted = vec![0; (secs / 2) as usize];
    let mut total = 0;
    for n in 0..45 * secs {
        let due = start + n * 1_000_000_000 / 45;
        tokio::time::sleep(Duration::from_nanos(due.saturating_sub(clock.now()))).await;
        let w = ((clock.now() - start) / 2_000_000_000) as usize;
        if check(ports[(n % 2) as usize], user) {
            total += 1;
            if let Some(count) = admitted.get_mut(w) {
                *count += 1;
            }
        }
    }
    (admitted, total)
}

/// Stalls the store with `pause` for 700 ms from 30 ms before the middle boundary (1 s in) of
/// windows 1 and 2 of a drive started now (20 ms into a window), then `resume`s it: the
/// flushes sent at those boundaries time out (500 ms).
pub fn stall_two_boundaries(
    pause: impl Fn() + Send + 'static,
    resume: impl Fn() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let clock = SystemClock::new();
        let start = clock.now();
        for at in [2_950, 4_950] {
            let due = start + at * 1_000_000;
            std::thread::sleep(Duration::from_nanos(due.saturating_sub(clock.now())));
            pause();
            std::thread::sleep(Duration::from_millis(700));
            resume();
        }
    })
}
