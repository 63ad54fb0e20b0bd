//! RLQS streams over a real gRPC connection (tonic client and server in the test's process):
//! reports counted in the counters RLS uses, the assignments they get, the door's bounds and
//! the end of streams at shutdown.

mod common;
#[path = "common/rlqs.rs"]
mod rlqs;

use rlqs::*;

#[tokio::test]
async fn reports_share_the_limit_with_rls_and_get_assignments() {
    let s = server(RlqsLimits::default()).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    let alice = bucket(&[("user", "alice")]);
    let free = bucket(&[("path", "/")]);
    // A new bucket's first report (Envoy sends one at once): a token bucket living until its
    // window ends and a report interval more, at most a window (a minute).
    tx.send(report(
        "d",
        vec![usage(alice.clone(), 1, 0), usage(free.clone(), 3, 0)],
    ))
    .await
    .unwrap();
    let first = actions(&next(&mut inbox).await);
    assert!(
        matches!(first[&name(&alice)], (Some(Strategy::TokenBucket(_)), 60)),
        "{first:?}"
    );
    // No rule for `path`: allow all, for an hour.
    assert_eq!(
        first[&name(&free)],
        (
            Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32)),
            3600
        )
    );
    // The rest of alice's minute used through Envoy: RLS refuses her now...
    tx.send(report("", vec![usage(alice.clone(), 99, 40)]))
        .await
        .unwrap();
    let over = actions(&next(&mut inbox).await);
    assert_eq!(rls_code(&s.engine, "alice").await, Code::OverLimit);
    // ... and the Envoy is told to deny until the window allows more and its next report is
    // in (a minute's window: up to 65 s; Envoy keeps it through a Sluice outage).
    let (strategy, ttl) = over[&name(&alice)];
    assert_eq!(
        strategy,
        Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32))
    );
    assert!((20..=65).contains(&ttl), "{ttl}");
    // Another user is untouched.
    assert_eq!(rls_code(&s.engine, "bob").await, Code::Ok);
}

#[tokio::test]
async fn requests_admitted_by_rls_shrink_the_assignment() {
    let s = server(RlqsLimits::default()).await;
    for _ in 0..100 {
        rls_code(&s.engine, "carol").await;
    }
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    let carol = bucket(&[("user", "carol")]);
    tx.send(report("d", vec![usage(carol.clone(), 0, 1)]))
        .await
        .unwrap();
    let answer = actions(&next(&mut inbox).await);
    assert_eq!(
        answer[&name(&carol)].0,
        Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32))
    );
}

#[tokio::test]
async fn an_unknown_domain_allows_all_and_a_first_report_without_domain_is_refused() {
    let s = server(RlqsLimits::default()).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    let id = bucket(&[("user", "alice")]);
    tx.send(report("nowhere", vec![usage(id.clone(), 1, 0)]))
        .await
        .unwrap();
    let answer = actions(&next(&mut inbox).await);
    assert_eq!(
        answer[&name(&id)].0,
        Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32))
    );
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    tx.send(report("", vec![usage(id.clone(), 1, 0)]))
        .await
        .unwrap();
    let status = inbox.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    // A domain longer than any rule file's is refused before it is kept or looked up.
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    tx.send(report(&"d".repeat(257), vec![usage(id, 1, 0)]))
        .await
        .unwrap();
    let status = inbox.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
}

#[tokio::test]
async fn a_peer_holds_a_bounded_number_of_streams_and_buckets() {
    let limits = RlqsLimits {
        max_streams_per_peer: 2,
        max_buckets_per_stream: 2,
        ..RlqsLimits::default()
    };
    let s = server(limits).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    let _second = open(s.addr).await.unwrap();
    let third = open(s.addr).await.map(|_| ()).unwrap_err();
    assert_eq!(third.code(), tonic::Code::ResourceExhausted, "{third}");
    let (a, b, c) = (
        bucket(&[("user", "a")]),
        bucket(&[("user", "b")]),
        bucket(&[("user", "c")]),
    );
    tx.send(report(
        "d",
        vec![usage(a.clone(), 1, 0), usage(b.clone(), 1, 0)],
    ))
    .await
    .unwrap();
    assert_eq!(actions(&next(&mut inbox).await).len(), 2);
    // A third bucket is not held, but it is counted and answered like the known ones: a
    // spray of new values through Envoy must not leave buckets without an assignment (its
    // fallback lets everything through). The held bucket `a`, its assignment unchanged, is
    // not answered: Envoy keeps the one it has.
    tx.send(report(
        "",
        vec![usage(c.clone(), 150, 0), usage(a.clone(), 1, 0)],
    ))
    .await
    .unwrap();
    let answer = actions(&next(&mut inbox).await);
    assert!(
        !answer.contains_key(&name(&a)) && answer.contains_key(&name(&c)),
        "{answer:?}"
    );
    assert_eq!(rls_code(&s.engine, "c").await, Code::OverLimit);
    // A report with more usages than the stream holds is answered (the bucket it does not
    // hold, every time: it keeps no record of what it sent), and the stream goes on.
    tx.send(report(
        "",
        vec![
            usage(a.clone(), 0, 0),
            usage(b.clone(), 0, 0),
            usage(c.clone(), 0, 0),
        ],
    ))
    .await
    .unwrap();
    let answer = actions(&next(&mut inbox).await);
    assert!(answer.contains_key(&name(&c)), "{answer:?}");
}

#[tokio::test]
async fn a_peer_that_reads_nothing_is_ended_and_stalls_no_one() {
    let limits = RlqsLimits {
        send_timeout: Duration::from_millis(300),
        ..RlqsLimits::default()
    };
    let s = server(limits).await;
    let (tx, _never_read) = open(s.addr).await.unwrap();
    // Reports of new buckets with large ids (32 entries of 1 KiB; a new bucket is always
    // answered) until the unread answers fill the HTTP/2 windows (a few MB).
    for n in 0..400 {
        if tx
            .send(report("d", vec![usage(large_bucket(n), 0, 0)]))
            .await
            .is_err()
        {
            break;
        }
    }
    // Another stream is answered meanwhile.
    let (other, mut inbox) = open(s.addr).await.unwrap();
    other
        .send(report("d", vec![usage(bucket(&[("user", "z")]), 1, 0)]))
        .await
        .unwrap();
    next(&mut inbox).await;
    // The stalled stream is ended: only the other one is left.
    s.wait_for_open_streams(1, Duration::from_secs(10), "the stalled stream ended")
        .await;
}

#[tokio::test]
async fn the_stop_signal_ends_streams_cleanly() {
    let s = server(RlqsLimits::default()).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    tx.send(report("d", vec![usage(bucket(&[("user", "a")]), 1, 0)]))
        .await
        .unwrap();
    next(&mut inbox).await;
    s.stop.send(true).unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), inbox.message())
        .await
        .expect("the stream ends within 10 s");
    assert!(matches!(end, Ok(None)), "{end:?}");
    let refused = open(s.addr).await.map(|_| ()).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused}");
}

#[tokio::test]
async fn a_rule_removed_by_a_reload_abandons_its_buckets() {
    let s = server(RlqsLimits::default()).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    let alice = bucket(&[("user", "alice")]);
    tx.send(report("d", vec![usage(alice.clone(), 1, 0)]))
        .await
        .unwrap();
    let first = actions(&next(&mut inbox).await);
    assert!(matches!(
        first[&name(&alice)].0,
        Some(Strategy::TokenBucket(_))
    ));
    // A reload without the `user` rule: the bucket is abandoned, then allowed for long.
    let rules = sluice_config::RuleSet::new(vec![
        sluice_config::parse_domain(
            std::path::Path::new("rules.yaml"),
            "domain: d\ndescriptors:\n  - key: path\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
        )
        .unwrap(),
    ])
    .unwrap();
    let reloaded = s.engine.load().reload(&rules, &Default::default());
    s.engine.store(Arc::new(reloaded));
    assert_eq!(s.handler.tracked_buckets(), 1);
    tx.send(report("", vec![usage(alice.clone(), 1, 0)]))
        .await
        .unwrap();
    assert_eq!(actions(&next(&mut inbox).await)[&name(&alice)], (None, 0));
    // Its demand left the book with it.
    assert_eq!(s.handler.tracked_buckets(), 0);
    tx.send(report("", vec![usage(alice.clone(), 1, 0)]))
        .await
        .unwrap();
    assert_eq!(
        actions(&next(&mut inbox).await)[&name(&alice)],
        (
            Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32)),
            3600
        )
    );
}

#[tokio::test]
async fn a_stream_that_reports_nothing_is_ended_and_frees_its_peers_slot() {
    // A peer holding streams open to take the slots Envoys need: its stream sends nothing
    // while the connection stays open (the listener closes only a connection with no bytes
    // either way; this test has no such timeout). Before, the stream stayed open for good,
    // and a peer's 17th was refused.
    let limits = RlqsLimits {
        idle_timeout: Duration::from_millis(300),
        max_streams_per_peer: 1,
        ..RlqsLimits::default()
    };
    let s = server(limits).await;
    let (_silent, _inbox) = open(s.addr).await.unwrap();
    s.wait_for_open_streams(0, Duration::from_secs(10), "the silent stream ended")
        .await;
    // The peer's slot is free: its next stream is served.
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    tx.send(report("d", vec![usage(bucket(&[("user", "a")]), 1, 0)]))
        .await
        .unwrap();
    next(&mut inbox).await;
}
