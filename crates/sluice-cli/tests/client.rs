//! The consistent-hashing client against three `sluice serve` processes: stopping one moves
//! only its users; restarting it brings them back.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::Serve;
use sluice_client::{ClientOptions, Limit, SluiceClient};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_follow_their_server_through_failure_and_recovery() {
    let mut servers: Vec<Serve> = (0..3).map(|i| Serve::start(&format!("client{i}"), "memory://", &[("api.yaml", "domain: api\ndescriptors:\n  - key: item\n    descriptors:\n      - key: user\n        rate_limit: { unit: minute, requests_per_unit: 100, mode: local }\n")])).collect();
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("http://127.0.0.1:{}", s.http))
        .collect();
    let options = ClientOptions {
        timeout: Duration::from_millis(300),
        backoff: Duration::from_millis(300),
        max_backoff: Duration::from_millis(600),
        ..ClientOptions::default()
    };
    let client = SluiceClient::new(&urls, options).unwrap();
    let users: Vec<String> = (0..60).map(|i| format!("user-{i}")).collect();
    let limit = Limit {
        requests: 5,
        window: "1h".into(),
        burst: None,
    };

    let mut home: HashMap<&str, String> = HashMap::new();
    for u in &users {
        let r = client.acquire(u, "reports", 1, None).await.unwrap();
        assert_eq!(
            r.server,
            client.ranking(u)[0],
            "a user goes to its first choice"
        );
        home.insert(u, r.server);
    }
    // Per-user bookkeeping stays on one server: 5 ad-hoc tokens per user, wherever it is.
    for _ in 0..5 {
        assert!(
            client
                .acquire(&users[0], "export", 1, Some(&limit))
                .await
                .unwrap()
                .value
                .allowed
        );
    }
    assert!(
        !client
            .acquire(&users[0], "export", 1, Some(&limit))
            .await
            .unwrap()
            .value
            .allowed
    );

    // Stop the second server: only its users move, each to its next choice.
    let victim = urls[1].clone();
    servers[1].kill();
    for u in &users {
        let r = client.acquire(u, "reports", 1, None).await.unwrap();
        if home[u.as_str()] == victim {
            assert_eq!(
                r.server,
                client.ranking(u)[1],
                "{u} moved to its second choice"
            );
        } else {
            assert_eq!(r.server, home[u.as_str()], "{u} did not move");
        }
    }
    // Restart it: after its backoff, its users come back.
    servers[1].restart();
    tokio::time::sleep(Duration::from_millis(700)).await;
    for u in &users {
        let r = client.acquire(u, "reports", 1, None).await.unwrap();
        assert_eq!(r.server, home[u.as_str()], "{u} came back home");
    }
    // Rejections are not failures: they do not move anyone.
    let err = client
        .acquire(&users[0], "reports", 0, None)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("amount"), "{err}");
    assert_eq!(client.server_for(&users[0]), home[users[0].as_str()]);
    // should_rate_limit (Envoy's /json) goes the same way.
    let r = client
        .should_rate_limit(
            &users[0],
            "api",
            &[&[("item", "reports"), ("user", &users[0])]],
            1,
        )
        .await
        .unwrap();
    assert_eq!(r.value["overallCode"], "OK");
    assert_eq!(r.server, home[users[0].as_str()]);
}

/// Single acquires of `item` for `user` until one is denied: how many more the server admits.
async fn drain(client: &SluiceClient, user: &str, item: &str) -> u64 {
    let mut admitted = 0;
    while client
        .acquire(user, item, 1, None)
        .await
        .unwrap()
        .value
        .allowed
    {
        admitted += 1;
        assert!(admitted <= 10_000, "the limit never ran out");
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_cut_calls_per_use_return_what_is_unused_and_never_pass_the_limit() {
    use sluice_client::{LeaseOptions, Leases};
    use std::sync::Arc;
    let rules = "domain: api\ndescriptors:\n  - key: item\n    value: steady\n    descriptors:\n      - key: user\n        rate_limit: { unit: day, requests_per_unit: 1000, mode: local }\n  - key: item\n    value: scarce\n    descriptors:\n      - key: user\n        rate_limit: { unit: day, requests_per_unit: 200, mode: local }\n";
    let servers: Vec<Serve> = (0..2)
        .map(|i| Serve::start(&format!("lease{i}"), "memory://", &[("api.yaml", rules)]))
        .collect();
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("http://127.0.0.1:{}", s.http))
        .collect();
    let clients = || -> Vec<Arc<Leases>> {
        (0..4)
            .map(|_| {
                let client = SluiceClient::new(&urls, ClientOptions::default()).unwrap();
                Arc::new(Leases::new(Arc::new(client), LeaseOptions::default()))
            })
            .collect()
    };
    // Four clients, 150 uses each of one user's `steady` item (1,000 a day), all at once.
    let run = |leases: Vec<Arc<Leases>>, item: &'static str, uses: usize| async move {
        let tasks: Vec<_> = leases
            .iter()
            .map(|l| {
                let l = l.clone();
                tokio::spawn(async move {
                    let mut allowed = 0u64;
                    for _ in 0..uses {
                        allowed += u64::from(l.take("ann", item).await.unwrap());
                    }
                    allowed
                })
            })
            .collect();
        let mut allowed = 0;
        for t in tasks {
            allowed += t.await.unwrap();
        }
        let mut returned = 0;
        let (mut acquires, mut refills) = (0, 0);
        for l in &leases {
            returned += l.close().await.unwrap();
            let s = l.stats();
            acquires += s.acquires;
            refills += s.refills;
            assert_eq!(l.held(), 0);
        }
        (allowed, returned, acquires, refills)
    };
    let plain = SluiceClient::new(&urls, ClientOptions::default()).unwrap();

    let (allowed, returned, acquires, refills) = run(clients(), "steady", 150).await;
    assert_eq!(allowed, 600, "under the limit every use is allowed");
    let per_use = (acquires + refills) as f64 / 600.0;
    eprintln!(
        "leases, 4 clients x 150 uses: {acquires} acquires + {refills} refills = {per_use:.3} calls per use; {returned} tokens returned"
    );
    assert!(
        per_use <= 0.2,
        "{acquires} acquires and {refills} refills for 600 uses"
    );
    assert!(returned > 0, "unused tokens come back at close");
    // What went back is the server's again: exactly 1,000 - 600 are left.
    assert_eq!(drain(&plain, "ann", "steady").await, 400);

    // Over the limit: 400 tries at 200 a day. Never more than the limit, and the tokens
    // still held at the end are returned, so the server's count is exactly what was used.
    let (allowed, _, _, _) = run(clients(), "scarce", 100).await;
    eprintln!("leases, 4 clients x 100 tries at a limit of 200: {allowed} allowed");
    assert!(allowed <= 200, "{allowed} uses allowed at a limit of 200");
    assert!(allowed >= 150, "only {allowed} of 200 used");
    assert_eq!(drain(&plain, "ann", "scarce").await, 200 - allowed);

    // A lease not used within its ttl goes back.
    let client = Arc::new(SluiceClient::new(&urls, ClientOptions::default()).unwrap());
    let options = LeaseOptions {
        min_batch: 10,
        ttl: Duration::from_millis(200),
        ..LeaseOptions::default()
    };
    let leases = Leases::new(client, options);
    assert!(leases.take("bob", "steady").await.unwrap());
    assert_eq!(leases.held(), 9);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(leases.return_expired().await.unwrap(), 9);
    assert_eq!(drain(&plain, "bob", "steady").await, 999);
}
