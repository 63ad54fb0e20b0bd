//! The RLQS door's bounds over a real gRPC connection (tonic client and server in the test's
//! process): streams across peers, report and answer sizes, bucket ids Sluice refuses, the
//! cost of a usage, denials as demand, shadow and quota-mode rules, exact rules on several
//! instances, and the stop with a peer that reads nothing.

mod common;
#[path = "common/rlqs.rs"]
mod rlqs;

use rlqs::*;

#[tokio::test]
async fn all_peers_together_hold_a_bounded_number_of_streams() {
    let limits = RlqsLimits {
        max_streams: 2,
        max_streams_per_peer: 10,
        ..RlqsLimits::default()
    };
    let s = server(limits).await;
    let _first = open(s.addr).await.unwrap();
    let second = open(s.addr).await.unwrap();
    let third = open(s.addr).await.map(|_| ()).unwrap_err();
    assert_eq!(third.code(), tonic::Code::ResourceExhausted, "{third}");
    assert!(third.message().contains("server holds 2"), "{third}");
    // A stream that ends gives its place back.
    drop(second);
    let reopened = async {
        loop {
            if open(s.addr).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reopened)
        .await
        .expect("a place again within 10 s");
}

#[tokio::test]
async fn an_oversized_bucket_id_is_left_alone_and_the_stream_goes_on() {
    let s = server(RlqsLimits::default()).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    let alice = bucket(&[("user", "alice")]);
    let many: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let long_key = "k".repeat(257);
    let refused = [
        bucket(&many),
        bucket(&[(long_key.as_str(), "v")]),
        bucket(&[]),
    ];
    let mut usages: Vec<BucketQuotaUsage> =
        refused.iter().map(|id| usage(id.clone(), 1, 0)).collect();
    usages.push(usage(alice.clone(), 1, 0));
    tx.send(report("d", usages)).await.unwrap();
    // Only alice is answered; the refused ids keep Envoy's own fallback, the stream stays.
    let answer = actions(&next(&mut inbox).await);
    assert_eq!(answer.len(), 1, "{answer:?}");
    assert!(answer.contains_key(&name(&alice)), "{answer:?}");
    // A value longer than the RLS limit comes from a request: it is limited as its digest.
    let long = bucket(&[("user", &"x".repeat(5000))]);
    tx.send(report("", vec![usage(long.clone(), 150, 0)]))
        .await
        .unwrap();
    let answer = actions(&next(&mut inbox).await);
    assert_eq!(
        answer[&name(&long)].0,
        Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32)),
        "{answer:?}"
    );
}

#[tokio::test]
async fn a_long_answer_comes_in_parts_and_a_report_over_the_bound_ends_the_stream() {
    let s = server(RlqsLimits::default()).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    // Reports of 200 buckets with 1 KB values (about 200 KB each, within the 256 KiB bound):
    // each answer is about 210 KB of actions, sent in parts of at most 64 KiB.
    let value = "v".repeat(1000);
    for chunk in 0..4 {
        let usages = (0..200)
            .map(|i| usage(bucket(&[("user", &format!("{chunk}-{i}{value}"))]), 0, 0))
            .collect();
        tx.send(report("d", usages)).await.unwrap();
    }
    let (mut answered, mut parts) = (0, 0);
    while answered < 800 {
        let part = next(&mut inbox).await;
        assert!(
            part.bucket_action.len() <= 64,
            "{}",
            part.bucket_action.len()
        );
        answered += part.bucket_action.len();
        parts += 1;
    }
    assert!(parts >= 4 * 4, "{parts} parts");
    // A report over the bound ends the stream with an error.
    let usages = (0..300)
        .map(|i| usage(bucket(&[("user", &format!("{i}{value}"))]), 0, 0))
        .collect();
    tx.send(report("", usages)).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), inbox.message())
        .await
        .expect("an end within 10 s");
    assert!(end.is_err(), "{end:?}");
}

#[tokio::test]
async fn a_huge_allowed_count_costs_a_few_engine_calls_and_pays_for_them() {
    let limits = RlqsLimits {
        usages_per_second: 4,
        ..RlqsLimits::default()
    };
    // A local rule: counted through the decision (a synced one is recorded in one call).
    let rules = RULES.replace("minute,", "minute, mode: local,");
    let s = server_with(&rules, limits).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    let alice = bucket(&[("user", "alice")]);
    let started = tokio::time::Instant::now();
    // The first usage reports far more than the room: a look, three counting calls (the room,
    // then two refused halvings), a record of the rest, a look; the three calls beyond the
    // usual three are paced. The next ones find no room (a look, a record, a look). Four usages
    // a second: the last report waits for the first one's calls.
    for _ in 0..3 {
        tx.send(report("d", vec![usage(alice.clone(), 1 << 40, 0)]))
            .await
            .unwrap();
    }
    // A new bucket, answered once all three are.
    let bob = bucket(&[("user", "bob")]);
    tx.send(report("d", vec![usage(bob.clone(), 1, 0)]))
        .await
        .unwrap();
    let answer = actions(&next(&mut inbox).await);
    assert_eq!(
        answer[&name(&alice)].0,
        Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32))
    );
    // The next two repeat it: Envoy keeps it, no answer.
    let answer = actions(&next(&mut inbox).await);
    assert_eq!(
        answer.keys().collect::<Vec<_>>(),
        [&name(&bob)],
        "{answer:?}"
    );
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(200), "{took:?}");
    // The room was counted in full.
    assert_eq!(rls_code(&s.engine, "alice").await, Code::OverLimit);
}

#[tokio::test]
async fn a_rogue_stream_reporting_denials_does_not_take_a_victims_room() {
    let s = server(RlqsLimits::default()).await;
    let alice = bucket(&[("user", "alice")]);
    let (victim, mut victim_inbox) = open(s.addr).await.unwrap();
    victim
        .send(report("d", vec![usage(alice.clone(), 10, 10)]))
        .await
        .unwrap();
    next(&mut victim_inbox).await;
    // Another stream reports a million denials of alice and admits nothing.
    let (rogue, mut rogue_inbox) = open(s.addr).await.unwrap();
    rogue
        .send(report("d", vec![usage(alice.clone(), 0, 1_000_000)]))
        .await
        .unwrap();
    next(&mut rogue_inbox).await;
    // The victim keeps most of the room: its denials count up to what it admitted and an
    // even part of the rule's rate, the rogue's (it admitted nothing) up to that even part.
    victim
        .send(report("", vec![usage(alice.clone(), 10, 10)]))
        .await
        .unwrap();
    let answer = actions(&next(&mut victim_inbox).await);
    let Some(Strategy::TokenBucket(bucket)) = answer[&name(&alice)].0 else {
        panic!("expected a token bucket, got {answer:?}");
    };
    // Alone the victim would get 80 left over 12 report intervals: 6.7 per interval.
    let per_interval = f64::from(bucket.max_tokens)
        + f64::from(bucket.tokens_per_fill.unwrap().value)
            / bucket.fill_interval.unwrap().seconds as f64
            * 5.0;
    assert!(per_interval >= 4.0, "{bucket:?}");
}

#[tokio::test]
async fn shadow_and_quota_mode_rules_are_enforced_as_rls_enforces_them() {
    let rules = "domain: d
descriptors:
  - key: dry
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: tenant
    quota_mode: true
    limits:
      - { unit: minute, requests_per_unit: 2 }
      - { unit: hour, requests_per_unit: 1000 }
";
    let s = server_with(rules, RlqsLimits::default()).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    let dry = bucket(&[("dry", "x")]);
    // A shadow rule denies nothing over RLS, under its limit or over it: allow all (sent
    // once: Envoy keeps it). Each round names a new tenant bucket, answered whatever else is.
    for (round, allowed) in [1, 50].into_iter().enumerate() {
        let tenant = bucket(&[("tenant", &format!("t{round}"))]);
        tx.send(report(
            "d",
            vec![usage(dry.clone(), allowed, 0), usage(tenant.clone(), 5, 0)],
        ))
        .await
        .unwrap();
        let answer = actions(&next(&mut inbox).await);
        let allow_all = Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32));
        assert!(
            answer.get(&name(&dry)).is_none_or(|a| a.0 == allow_all)
                && (round > 0 || answer.contains_key(&name(&dry))),
            "{answer:?}"
        );
        assert_eq!(rls_code_of(&s.engine, "dry", "x").await, Code::Ok);
        // Quota mode: over the minute's soft limit, the hour's still has room, and RLS lets
        // the tenant through: so does the assignment.
        assert_eq!(
            rls_code_of(&s.engine, "tenant", &format!("t{round}")).await,
            Code::Ok
        );
        assert!(
            matches!(answer[&name(&tenant)].0, Some(Strategy::TokenBucket(_))),
            "{answer:?}"
        );
    }
}

#[tokio::test]
async fn the_stop_signal_ends_a_stream_whose_peer_reads_nothing_at_once() {
    // A peer that reads nothing holds its stream for `send_timeout` (30 s here), longer than a
    // shutdown waits; the stop signal must end it at once, and nothing is counted after it.
    let s = server(RlqsLimits::default()).await;
    let (tx, _never_read) = open(s.addr).await.unwrap();
    // New buckets (each answered) until the unread answers fill the windows.
    for n in 0..200 {
        let sent = tx.send(report("d", vec![usage(large_bucket(n), 0, 0)]));
        if tokio::time::timeout(Duration::from_millis(200), sent)
            .await
            .is_err()
        {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.handler.open_streams(), 1);
    s.stop.send(true).unwrap();
    s.wait_for_open_streams(0, Duration::from_secs(3), "the stream ended after the stop")
        .await;
    // A report sent after the stop is not counted.
    let _ = tx.try_send(report("", vec![usage(bucket(&[("user", "late")]), 100, 0)]));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rls_code(&s.engine, "late").await, Code::Ok);
}

#[tokio::test]
async fn instances_with_exact_rules_only_divide_the_room_among_them() {
    // Two instances on one store, an exact rule alone: each must hand out its part of the
    // room, so each announces itself (the fleet was announced only for synced rules).
    let rules = sluice_config::RuleSet::new(vec![
        sluice_config::parse_domain(
            std::path::Path::new("rules.yaml"),
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 1200, mode: exact }\n",
        )
        .unwrap(),
    ])
    .unwrap();
    let clock: Arc<dyn sluice_core::Clock> =
        Arc::new(sluice_core::ManualClock::new(60_000_000_000_000));
    let store = Arc::new(sluice_store::MemoryStore::new(clock.clone()));
    let instance = |node: &str| {
        let options = sluice_engine::EngineOptions {
            node_id: Some(node.to_owned()),
            shared_store: true,
            ..Default::default()
        };
        sluice_engine::Engine::new(
            &rules,
            &Default::default(),
            store.clone(),
            clock.clone(),
            options,
        )
    };
    let (a, b) = (instance("a"), instance("b"));
    a.announce().await;
    b.announce().await;
    a.announce().await;
    assert_eq!((a.fleet_size(), b.fleet_size()), (2, 2));
    let engine: SharedEngine = Arc::new(ArcSwap::from_pointee(a));
    let options = Arc::new(ArcSwap::from_pointee(RlsOptions::default()));
    let (_stop, stop_rx) = watch::channel(false);
    let handler = RateLimitQuotaGrpc::new(engine, options, RlqsLimits::default(), stop_rx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RlqsServer::new(handler))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let (tx, mut inbox) = open(addr).await.unwrap();
    let alice = bucket(&[("user", "alice")]);
    tx.send(report("d", vec![usage(alice.clone(), 0, 1)]))
        .await
        .unwrap();
    let answer = actions(&next(&mut inbox).await);
    // 1,200 a minute: a pace of 100 a report interval (no burst saved where instances share
    // the room); this instance's half, 50.
    let most = per_interval(answer[&name(&alice)].0);
    assert!((45.0..=50.0).contains(&most), "{most}");
}
