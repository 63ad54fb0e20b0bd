//! `sluice serve` on an etcd store: two real processes on one real etcd hold a shared limit
//! together, keep answering while etcd is down (local fallback), and count again once it is
//! back.

mod common;
#[path = "common/pair.rs"]
mod pair;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Serve, http_call};
use pair::{RULES, drive};
use sluice_testkit::EtcdCluster;

/// What the fleet counts for `user` in etcd, read every 400 ms while a drive runs (a
/// window's counters expire with their lease a few seconds after it ends): per window, the
/// sum of every instance's counter (`sluice:v1:e:<len>:<key>/<window>/c/<instance>`). This is
/// what the instances admitted by their own clocks, free of the test's send times.
struct Tally {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<BTreeMap<(u64, String), u64>>,
}

impl Tally {
    fn start(etcd: &EtcdCluster, user: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flags = etcd.etcdctl_flags();
        let marker = format!(":{user}/");
        let done = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut counters = BTreeMap::new();
            loop {
                let last = done.load(Ordering::Relaxed);
                let out = Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .args(&flags)
                    .args(["get", "--prefix", "sluice:v1:e:"])
                    .output()
                    .expect("run etcdctl");
                let out = String::from_utf8_lossy(&out.stdout).into_owned();
                let lines: Vec<&str> = out.lines().collect();
                for pair in lines.chunks(2) {
                    let [key, value] = pair else { continue };
                    let Some((_, rest)) = key.split_once(&marker) else {
                        continue;
                    };
                    if let [window, "c", instance] = rest.split('/').collect::<Vec<_>>()[..] {
                        let window: u64 = window.parse().expect("window number");
                        let count: u64 = value.parse().expect("count");
                        let seen = counters.entry((window, instance.to_owned())).or_default();
                        *seen = count.max(*seen);
                    }
                }
                if last {
                    return counters;
                }
                std::thread::sleep(Duration::from_millis(400));
            }
        });
        Self { stop, thread }
    }

    /// Waits for the drive's last counts to reach etcd (the next span's flush, a second),
    /// checks that every admitted request is counted there once, and returns the count per
    /// window.
    async fn counted_once(self, user: &str, admitted: u64) -> Vec<u64> {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        self.stop.store(true, Ordering::Relaxed);
        let counters = self.thread.join().expect("the tally thread");
        eprintln!("{user}, per window and instance: {counters:?}");
        let mut windows = BTreeMap::<u64, u64>::new();
        for ((window, _), count) in counters {
            *windows.entry(window).or_default() += count;
        }
        let windows: Vec<u64> = windows.into_values().collect();
        assert_eq!(
            windows.iter().sum::<u64>(),
            admitted,
            "every request admitted for {user} is counted once in etcd: {windows:?}"
        );
        windows
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_etcd_share_a_limit_and_survive_its_outage() {
    let mut etcd = EtcdCluster::start();
    let store = format!("etcd://{}", etcd.endpoints().join(","));
    let a = Serve::start("etcd-a", &store, &[("edge.yaml", RULES)]);
    let b = Serve::start("etcd-b", &store, &[("edge.yaml", RULES)]);
    let ports = [a.http, b.http];
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _windows = common::align_to_window(Duration::from_secs(2)).await;
    let tally = Tally::start(&etcd, "alice");
    let (sent, admitted) = drive(ports, "alice", 8).await;
    let shared = tally.counted_once("alice", admitted).await;
    eprintln!("etcd up: admitted per 2 s window {shared:?} (by send time {sent:?})");
    // Alone, each instance would admit its whole limit: 60 a window together. Sharing the
    // count through etcd holds the fleet near 30 (the first window of a new key may run over
    // while it learns it is shared).
    holds_the_limit(&shared, &[&a, &b]);

    // etcd goes away: every request is still answered (the fallback share), none waits.
    etcd.kill(0);
    let (down, _) = drive(ports, "bob", 4).await;
    eprintln!("admitted per 2 s window, etcd down: {down:?}");
    assert!(
        down.iter().all(|&n| n > 0),
        "requests answered with etcd down: {down:?}"
    );
    let (_, status) = http_call(a.admin, "GET", "/status.json", "");
    assert!(status.contains(r#""health":"unreachable""#), "{status}");

    // Back (with its data): sharing resumes, and the counts made while it was down arrive.
    etcd.restart(0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _windows = common::align_to_window(Duration::from_secs(2)).await;
    let tally = Tally::start(&etcd, "carol");
    let (sent, admitted) = drive(ports, "carol", 8).await;
    let again = tally.counted_once("carol", admitted).await;
    eprintln!("etcd back: admitted per 2 s window {again:?} (by send time {sent:?})");
    holds_the_limit(&again, &[&a, &b]);
}

/// Every window of a drive as etcd counted it holds the limit of 30 (the first may run over
/// while a new key learns it is shared; the last holds the few requests sent as it began).
fn holds_the_limit(windows: &[u64], instances: &[&Serve]) {
    let logs = || {
        instances
            .iter()
            .map(|s| s.log_tail())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    assert!(windows.len() >= 4, "{windows:?}");
    assert!(windows[0] <= 45, "first window {windows:?}\n{}", logs());
    for (w, n) in windows.iter().enumerate().take(4).skip(1) {
        assert!(
            (24..=31).contains(n),
            "window {w}: {n} of 30 ({windows:?})\n{}",
            logs()
        );
    }
    assert!(windows[4..].iter().all(|&n| n <= 3), "{windows:?}");
}

/// A store that stalls past the flush timeout at one span boundary (SIGSTOP for 700 ms, as
/// an overloaded machine's etcd did): the flush sent there fails after 500 ms, and the
/// instances decide that span from what they knew before it. The window holds the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stalls_past_one_flush_keeps_the_window_within_its_limit() {
    let etcd = Arc::new(EtcdCluster::start());
    let store = format!("etcd://{}", etcd.endpoints().join(","));
    let a = Serve::start("etcd-stall-a", &store, &[("edge.yaml", RULES)]);
    let b = Serve::start("etcd-stall-b", &store, &[("edge.yaml", RULES)]);
    let ports = [a.http, b.http];
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _windows = common::align_to_window(Duration::from_secs(2)).await;
    let tally = Tally::start(&etcd, "dave");
    let stalls = {
        let (p, r) = (etcd.clone(), etcd.clone());
        pair::stall_two_boundaries(move || p.pause(0), move || r.resume(0))
    };
    let (sent, admitted) = drive(ports, "dave", 8).await;
    stalls.join().expect("the stall thread");
    let windows = tally.counted_once("dave", admitted).await;
    eprintln!("etcd stalling: admitted per 2 s window {windows:?} (by send time {sent:?})");
    holds_the_limit(&windows, &[&a, &b]);
}
