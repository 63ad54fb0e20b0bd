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
