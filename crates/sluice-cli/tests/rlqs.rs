//! RLQS on `sluice serve`: real Envoys (1.40, the `rate_limit_quota` filter) in front of a
//! plain upstream, getting their assignments from Sluice (the user's traffic over the limit is
//! held to it, and Sluice gets no call per request), and streams ended cleanly on SIGTERM.

mod common;
#[path = "common/envoy.rs"]
mod envoy;
#[path = "common/rlqs_envoy.rs"]
mod rlqs_envoy;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Serve, upstream};
use envoy::get;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use rlqs_envoy::{load, metric, start_envoy};
use sluice_testkit::wait_until;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 60 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_enforces_sluice_assignments_with_no_call_per_request() {
    let sluice = Serve::start("rlqs-envoy", "memory://", &[("edge.yaml", RULES)]);
    let (upstream_port, upstream_hits) = upstream();
    let (_envoy, listen, _admin) = start_envoy(sluice.dir(), &sluice, upstream_port);
    // The first request goes through on no_assignment_behavior and makes Envoy report the
    // new bucket at once; the assignment follows.
    assert_eq!(get(listen, "/", "alice").0, 200);
    assert!(
        wait_until(Duration::from_secs(10), || metric(
            &sluice,
            "sluice_rlqs_assignments_total{strategy=\"token_bucket\"}"
        ) >= 1.0),
        "no token bucket assigned; sluice log: {}",
        sluice.log_tail()
    );
    // 300 requests at once, far over the room (60 a minute): Envoy admits at most half the
    // room left before its next report is counted.
    let codes: Vec<u16> = (0..300).map(|_| get(listen, "/", "alice").0).collect();
    let admitted = codes.iter().filter(|&&c| c == 200).count();
    let denied = codes.iter().filter(|&&c| c == 429).count();
    assert_eq!(admitted + denied, 300, "{codes:?}");
    assert!((1..=30).contains(&admitted), "admitted {admitted}");
    assert_eq!(upstream_hits.load(Ordering::Relaxed) as usize, admitted + 1);
    // Another user has her own bucket.
    assert_eq!(get(listen, "/", "bob").0, 200);
    // No call per request: a report per new bucket and one per 5 s, no RLS call.
    let reports = metric(&sluice, "sluice_rlqs_reports_total");
    assert!(
        (1.0..=3.0).contains(&reports),
        "{reports} reports for 302 requests"
    );
    assert_eq!(metric(&sluice, "sluice_rlqs_streams_total"), 1.0);
    assert_eq!(
        metric(
            &sluice,
            "sluice_requests_total{door=\"grpc\",result=\"ok\"}"
        ),
        0.0
    );
    // The next report counts what Envoy admitted in the counters every door shares.
    let counted = || metric(&sluice, "sluice_rlqs_usage_total{result=\"counted\"}");
    assert!(
        wait_until(Duration::from_secs(12), || counted()
            >= (admitted + 2) as f64),
        "counted {} of {}",
        counted(),
        admitted + 2
    );
}

/// A user at half her limit, arriving at random (bursts of several requests within a second
/// are common at that rate), is not refused (one at most): the assignment's token bucket is
/// deep enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_admits_random_arrivals_under_the_limit() {
    let sluice = Serve::start("rlqs-under", "memory://", &[("edge.yaml", RULES)]);
    let (upstream_port, _) = upstream();
    let (_envoy, listen, _admin) = start_envoy(sluice.dir(), &sluice, upstream_port);
    // 30 a minute on a limit of 60, exponential gaps (a fixed seed: the same clumps every
    // run), for 40 s: at least two reports and their assignments.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut gap = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let u = (seed >> 11) as f64 / (1u64 << 53) as f64;
        Duration::from_secs_f64(-(1.0 - u).ln() * 2.0)
    };
    let clock = sluice_core::SystemClock::new();
    let end = sluice_core::Clock::now(&clock) + 40_000_000_000;
    let mut codes = Vec::new();
    while sluice_core::Clock::now(&clock) < end {
        codes.push(get(listen, "/", "carol").0);
        tokio::time::sleep(gap()).await;
    }
    let refused = codes.iter().filter(|&&c| c != 200).count();
    assert!(codes.len() >= 10, "{codes:?}");
    // At most one (one run refused 1 of 24; the previous sizing, a burst of a tenth of a
    // 5 s allowance, refused 11 of 40).
    assert!(
        refused <= 1,
        "{refused} of {} refused: {codes:?}",
        codes.len()
    );
    assert!(
        metric(
            &sluice,
            "sluice_rlqs_assignments_total{strategy=\"token_bucket\"}"
        ) >= 1.0,
        "no assignment was made"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_rlqs_streams_cleanly() {
    let mut sluice = Serve::start("rlqs-term", "memory://", &[("edge.yaml", RULES)]);
    let url = format!("http://127.0.0.1:{}", sluice.grpc);
    let mut client = RateLimitQuotaServiceClient::connect(url).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut inbox = client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let usage = BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [("user".to_owned(), "alice".to_owned())].into(),
        }),
        num_requests_allowed: 1,
        ..Default::default()
    };
    tx.send(RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: vec![usage],
    })
    .await
    .unwrap();
    let first = inbox.message().await.unwrap().unwrap();
    assert_eq!(first.bucket_action.len(), 1, "{first:?}");
    // The stream is open (the sender is alive) when SIGTERM comes: it ends with status OK,
    // and the process exits in time.
    let (status, _sluice) = tokio::task::spawn_blocking(move || (sluice.terminate(), sluice))
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    let end = tokio::time::timeout(Duration::from_secs(5), inbox.message())
        .await
        .expect("the stream ended");
    assert!(matches!(end, Ok(None)), "{end:?}");
    drop(tx);
}

/// Two Envoys, one user's traffic at 3x a limit of 100 per 20 s, split evenly (user `even`)
/// and 9:1 (user `skewed`) at once: every window after the first two admits 88% to 105% of
/// the limit, 92% on average, with no call per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_hold_a_user_to_the_limit_by_demand() {
    const WINDOWS: usize = 6;
    let window = Duration::from_secs(20);
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 20s, requests_per_unit: 100 }\n";
    let sluice = Serve::start("rlqs-two", "memory://", &[("edge.yaml", rules)]);
    let (upstream_port, _) = upstream();
    let (_a, port_a, _) = start_envoy(sluice.dir(), &sluice, upstream_port);
    let (_b, port_b, _) = start_envoy(sluice.dir(), &sluice, upstream_port);
    let _aligned = common::align_to_window(window).await;
    // 15 a second in all: 3x the limit's pace of 5.
    let loads = [
        load(port_a, "even", 7.5, window, WINDOWS),
        load(port_b, "even", 7.5, window, WINDOWS),
        load(port_a, "skewed", 13.5, window, WINDOWS),
        load(port_b, "skewed", 1.5, window, WINDOWS),
    ];
    let tallies: Vec<Vec<u64>> = loads.into_iter().map(|l| l.join().unwrap()).collect();
    let even: Vec<u64> = (0..WINDOWS)
        .map(|w| tallies[0][w] + tallies[1][w])
        .collect();
    let skewed: Vec<u64> = (0..WINDOWS)
        .map(|w| tallies[2][w] + tallies[3][w])
        .collect();
    eprintln!("even {even:?} (a {:?}, b {:?})", tallies[0], tallies[1]);
    eprintln!("skewed {skewed:?} (a {:?}, b {:?})", tallies[2], tallies[3]);
    let reports = metric(&sluice, "sluice_rlqs_reports_total");
    let requests = 15.0 * 2.0 * window.as_secs_f64() * WINDOWS as f64;
    eprintln!("{reports} reports for {requests} requests");
    // Every window after the first two within 88% to 105% of the limit, at least 92% on
    // average (the figure is 90% to 105%; measured: 92 to 98, a busy machine moving a
    // request or two across a window's edge now and then). Before a drained Envoy sent new
    // numbers was counted for its old bucket's clock at the new rate, and the others'
    // unreported admissions kept out of the room shared, 94 to 99 but 87 and 107 now and then.
    for (name, windows) in [("even", &even), ("skewed", &skewed)] {
        for (w, &n) in windows.iter().enumerate().skip(2) {
            assert!(
                (88..=105).contains(&n),
                "{name}: window {w} admitted {n} of 100: {windows:?}"
            );
        }
        let warm = &windows[2..];
        let mean = warm.iter().sum::<u64>() as f64 / warm.len() as f64;
        assert!(mean >= 92.0, "{name}: {mean} a window: {windows:?}");
    }
    // A report per Envoy per 5 s whatever the traffic: 0.4 a second here for 15 requests a
    // second; 1/100 of the requests from 40 requests a second per Envoy.
    assert!(
        reports <= requests / 50.0,
        "{reports} reports for {requests} requests"
    );
    // The RPCs: a stream per Envoy for the whole run, and no RLS call.
    assert_eq!(metric(&sluice, "sluice_rlqs_streams_total"), 2.0);
    assert_eq!(
        metric(
            &sluice,
            "sluice_requests_total{door=\"grpc\",result=\"ok\"}"
        ),
        0.0
    );
}
