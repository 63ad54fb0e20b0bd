//! RLQS across Sluice instances: two `sluice serve` sharing one Redis, an Envoy
//! (`rate_limit_quota` filter) on each, one user's traffic at 3x the limit split 9:1 between
//! them, then evenly. Each instance hands its Envoy its part of the room by how the fleet's
//! admissions split (the counts the store holds), not half of it, so the fleet admits about
//! the limit whatever the split.

mod common;
#[path = "common/envoy.rs"]
mod envoy;
#[path = "common/rlqs_envoy.rs"]
mod rlqs_envoy;

use std::time::Duration;

use common::{Serve, upstream};
use rlqs_envoy::{load_phases, metric, start_envoy};
use sluice_testkit::{RedisServer, wait_until};

/// Windows of 20 s: the first four at 9:1, the next four even.
const WINDOWS: usize = 8;
const SPLIT_AT: usize = 4;

/// The admissions a window may hold, of 100. The figure is 90 to 105: measured 92 to
/// 103 after the first two windows (docs/RLQS.md, "Two Sluice instances"); 88 to 106 without
/// the read a boundary reply of a recorded key asks for and with a tenth of the room as the
/// parts' floor, 113 to 118 where the split turns without the projection of counts
/// (`synced/part.rs`), 132 with deep bursts saved on both instances. A busy 2-core machine
/// (two Sluice, two Envoys, Redis, the load threads and the other tests) delays reports and
/// the load's requests now and then: the test allows 85 to 110, so that it fails on those
/// regressions and not on a request or two moved across a window's edge.
const LOW: u64 = 85;
const HIGH: u64 = 110;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_a_users_limit_by_their_envoys_demand() {
    let window = Duration::from_secs(20);
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 20s, requests_per_unit: 100 }\n";
    let redis = RedisServer::start();
    let one = Serve::start("rlqs-fleet-1", &redis.url(), &[("edge.yaml", rules)]);
    let two = Serve::start("rlqs-fleet-2", &redis.url(), &[("edge.yaml", rules)]);
    // Until each knows the other, each shares a limit among fewer instances than there are.
    assert!(
        wait_until(Duration::from_secs(30), || [&one, &two]
            .iter()
            .all(|s| metric(s, "sluice_fleet_instances") == 2.0)),
        "the instances did not learn of each other: {}\n{}",
        one.log_tail(),
        two.log_tail()
    );
    let (upstream_port, _) = upstream();
    let (_a, port_a, _) = start_envoy(one.dir(), &one, upstream_port);
    let (_b, port_b, _) = start_envoy(two.dir(), &two, upstream_port);
    let _aligned = common::align_to_window(window).await;
    // 15 a second in all, 3x the limit's pace of 5: 13.5 and 1.5, then 7.5 each.
    let loads = [
        load_phases(
            port_a,
            "u",
            &[(13.5, SPLIT_AT), (7.5, WINDOWS - SPLIT_AT)],
            window,
        ),
        load_phases(
            port_b,
            "u",
            &[(1.5, SPLIT_AT), (7.5, WINDOWS - SPLIT_AT)],
            window,
        ),
    ];
    let tallies: Vec<Vec<u64>> = loads.into_iter().map(|l| l.join().unwrap()).collect();
    let total: Vec<u64> = (0..WINDOWS)
        .map(|w| tallies[0][w] + tallies[1][w])
        .collect();
    eprintln!(
        "admitted {total:?} (a {:?}, b {:?})",
        tallies[0], tallies[1]
    );
    for s in [&one, &two] {
        eprintln!(
            "reports {}, usage counted {}, over {}, uncounted {}",
            metric(s, "sluice_rlqs_reports_total"),
            metric(s, "sluice_rlqs_usage_total{result=\"counted\"}"),
            metric(s, "sluice_rlqs_usage_total{result=\"over\"}"),
            metric(s, "sluice_rlqs_usage_total{result=\"uncounted\"}"),
        );
    }
    for (w, &n) in total.iter().enumerate().skip(2) {
        assert!(
            (LOW..=HIGH).contains(&n),
            "window {w} admitted {n} of 100: {total:?} (a {:?}, b {:?})",
            tallies[0],
            tallies[1]
        );
    }
    // 9:1: the instance whose Envoy carries most of the demand admits most of the limit: 65
    // to 68 measured with 30% of the room kept evenly (66 to 82 with a tenth; once 59 in a
    // window of 85 on a loaded CI machine), where an even split of the limit would hold it to
    // 50 (the small Envoy wants 30). Finer
    // regressions of the split (each instance handing out an even part of the room gave 62
    // of 91) are within this test's run-to-run noise; the deterministic
    // `sluice-engine/tests/fleet_parts.rs` and `sluice-rls/tests/rlqs_fleet.rs` hold those.
    // The small Envoy still gets room.
    for w in 2..SPLIT_AT {
        assert!(tallies[0][w] >= 55, "window {w}: a {:?}", tallies[0]);
        assert!(tallies[1][w] >= 7, "window {w}: b {:?}", tallies[1]);
    }
    // Even: neither is locked out by the split before. (Two Envoys that both want more than
    // the room keep about the split they had, drifting to even as the floor pulls them: 30%
    // of the way a window.) By the last window the small one has most of the way: 42 and 40
    // measured; 25 to 29 with a tenth of the room as the floor.
    for w in SPLIT_AT..WINDOWS {
        assert!(
            tallies[1][w] >= 12 && tallies[0][w] >= 12,
            "window {w}: a {:?}, b {:?}",
            tallies[0],
            tallies[1]
        );
    }
    assert!(
        tallies[1][WINDOWS - 1] >= 33,
        "the even split's last window: a {:?}, b {:?}",
        tallies[0],
        tallies[1]
    );
}
