//! The store conformance suite: every [`CounterStore`] must pass it, the embedded memory store
//! and each Redis topology alike. Each run uses keys under a fresh prefix, so several runs can
//! share one server.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::Decision;
use sluice_store::{
    CounterKey, CounterStore, ExactAlgorithm, ExactRequest, FlushItem, FlushReceipt, FlushTime,
    NodeEntry, StoreError, decide_in_memory,
};

/// A flush item for `key` in `window` (TTL 120 s, first write, previous total asked), with an
/// optional node entry `(node, count)`.
pub fn item(key: &CounterKey, window: u64, delta: u64, node: Option<(&str, u64)>) -> FlushItem {
    FlushItem {
        key: key.as_str().into(),
        window,
        delta,
        ttl: Duration::from_secs(120),
        entry: node.map(|(n, count)| NodeEntry {
            node: n.into(),
            count,
            at_ms: 1_700_000_000_000,
            rate_milli: 2500,
        }),
        want_previous: true,
        first_write: true,
    }
}

/// Flush semantics: totals per window, the previous window's total, per-node entries, many
/// keys in one call, and a zero delta that only reads.
pub async fn flush_semantics(store: &dyn CounterStore, prefix: &str) {
    let rule = format!("{prefix}/user");
    let k = CounterKey::new(&rule, &["alice"]);
    let other = CounterKey::new(&rule, &["bob"]);
    let reply = store
        .flush(
            &[
                item(&k, 10, 5, None),
                item(&other, 10, 1, None),
                item(&k, 9, 2, None),
            ],
            None,
        )
        .await
        .expect("flush");
    assert!(
        reply.store_time.is_some(),
        "{}: no store time",
        store.describe()
    );
    let totals: Vec<u64> = reply
        .results
        .iter()
        .map(|r| r.as_ref().expect("item").total)
        .collect();
    assert_eq!(totals, [5, 1, 2], "{}", store.describe());
    let reply = store
        .flush(
            &[
                item(&k, 10, 3, Some(("node-a", 8))),
                item(&k, 10, 0, Some(("node-b", 1))),
            ],
            None,
        )
        .await
        .expect("flush");
    let a = reply.results[0].as_ref().expect("item");
    assert_eq!(
        (a.total, a.previous_total),
        (8, Some(2)),
        "{}",
        store.describe()
    );
    let b = reply.results[1].as_ref().expect("item");
    assert_eq!(b.total, 8);
    let mut nodes: Vec<_> = b
        .entries
        .iter()
        .map(|e| (e.node.to_string(), e.count))
        .collect();
    nodes.sort();
    assert_eq!(
        nodes,
        [("node-a".to_owned(), 8), ("node-b".to_owned(), 1)],
        "{}",
        store.describe()
    );
    // A flush that skips the store's clock still counts and reads; its reply has no time.
    let reply = store
        .flush_timed(
            &[item(&k, 10, 1, Some(("node-a", 9)))],
            None,
            FlushTime::Skip,
        )
        .await
        .expect("flush without TIME");
    assert_eq!(
        (
            reply.results[0].as_ref().expect("item").total,
            reply.store_time
        ),
        (9, None),
        "{}",
        store.describe()
    );
    // Many keys (all slots of a cluster) in one flush.
    let many: Vec<FlushItem> = (0..2000)
        .map(|i| {
            item(
                &CounterKey::new(&rule, &[format!("user-{i}").as_str()]),
                1,
                i % 7 + 1,
                None,
            )
        })
        .collect();
    let receipt = FlushReceipt {
        owner: format!("{prefix}-node").into(),
        token: 41,
    };
    let reply = store
        .flush(&many, Some(&receipt))
        .await
        .expect("flush of many keys");
    for (i, r) in reply.results.iter().enumerate() {
        assert_eq!(
            r.as_ref().expect("item").total,
            i as u64 % 7 + 1,
            "{}",
            store.describe()
        );
    }
    receipts(store, &many, &receipt).await;
}

/// A flush's receipt tells whether it arrived: its marker is there for the same items (grouped
/// the same way), not for another token, another owner or items that were never flushed.
async fn receipts(store: &dyn CounterStore, flushed: &[FlushItem], receipt: &FlushReceipt) {
    let expect = |items: Vec<FlushItem>, r: FlushReceipt, arrived: bool, case: &'static str| async move {
        let landed = store.landed(&items, &r).await.expect("read the markers");
        assert_eq!(
            landed,
            vec![Some(arrived); items.len()],
            "{}: {case}",
            store.describe()
        );
    };
    expect(
        flushed.to_vec(),
        receipt.clone(),
        true,
        "a flush that arrived",
    )
    .await;
    let later = FlushReceipt {
        token: receipt.token + 1,
        ..receipt.clone()
    };
    expect(flushed.to_vec(), later, false, "another token").await;
    let stranger = FlushReceipt {
        owner: format!("{}-other", receipt.owner).into(),
        ..receipt.clone()
    };
    expect(flushed.to_vec(), stranger, false, "another owner").await;
    let unsent: Vec<FlushItem> = flushed
        .iter()
        .map(|i| FlushItem {
            window: i.window + 1,
            key: format!("{}-unsent", i.key).into(),
            ..i.clone()
        })
        .collect();
    expect(unsent, receipt.clone(), false, "items never flushed").await;
}

/// Exact mode: the store decides exactly as `sluice-core` does, step for step, on a
/// pseudo-random sequence (forward steps, jumps, and the clock going backwards).
pub async fn exact_agrees_with_core(store: &dyn CounterStore, prefix: &str) {
    let algorithms = [
        ExactAlgorithm::FixedWindow {
            limit: 5,
            window_us: 1_000_000,
        },
        ExactAlgorithm::TokenBucket {
            limit: 5,
            window_us: 1_000_000,
            burst: 3,
        },
        ExactAlgorithm::SlidingWindow {
            limit: 7,
            window_us: 2_000_000,
        },
        ExactAlgorithm::SlidingLog {
            limit: 4,
            window_us: 1_500_000,
        },
    ];
    for (i, algorithm) in algorithms.into_iter().enumerate() {
        let mut rng = 0x5eed_u64 + i as u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let key: Arc<str> = CounterKey::new(&format!("{prefix}/exact{i}"), &["k"])
            .as_str()
            .into();
        let mut state = None;
        let mut now_us = 1_700_000_000_000_000u64;
        let (mut allowed, mut denied) = (0, 0);
        for step in 0..300 {
            match next() % 10 {
                0 => now_us = now_us.saturating_sub(next() % 300_000),
                1 => now_us += next() % 3_000_000,
                _ => now_us += next() % 150_000,
            }
            let cost = match next() % 10 {
                0 => 0,
                1 => 1 + next() % 8,
                _ => 1,
            };
            let request = ExactRequest {
                key: key.clone(),
                algorithm,
                now_us,
                cost,
            };
            let (expected, next_state) =
                decide_in_memory(&request, state.take()).expect("valid parameters");
            state = Some(next_state);
            let actual = store.exact(&request).await.expect("exact decision");
            assert_eq!(
                actual,
                expected,
                "{}: {algorithm:?} step {step}",
                store.describe()
            );
            match expected {
                Decision::Allowed(_) => allowed += 1,
                Decision::Denied(_) => denied += 1,
                _ => {}
            }
        }
        assert!(
            allowed > 20 && denied > 20,
            "{algorithm:?}: one-sided sequence"
        );
    }
}

/// A synced rule's store decision ([`ExactAlgorithm::WindowCounter`]) shares the window
/// counters with the flushes: other instances' flushed counts leave less room, each admission
/// adds its cost to the count the next flush reads, and a sliding window weighs the previous
/// window's count in. Checked against a plain model, step by step.
pub async fn window_counter_shares_the_flushed_counts(store: &dyn CounterStore, prefix: &str) {
    for sliding in [false, true] {
        let key = CounterKey::new(&format!("{prefix}/small-{sliding}"), &["k"]);
        let (limit, w) = (6u64, 1_000_000u64);
        let algorithm = ExactAlgorithm::WindowCounter {
            limit,
            window_us: w,
            sliding,
        };
        let mut counts = std::collections::BTreeMap::<u64, u64>::new();
        let mut rng = 0x51de_u64 + u64::from(sliding);
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Whole windows from a round number, so the window numbers are small.
        let mut now_us = 1_700_000_000 * w;
        let (mut allowed, mut denied) = (0, 0);
        for step in 0..200 {
            now_us += next() % 120_000;
            let window = now_us / w;
            if next() % 4 == 0 {
                // Another instance's flush.
                let delta = next() % 3;
                let reply = store
                    .flush(&[item(&key, window, delta, None)], None)
                    .await
                    .expect("flush");
                *counts.entry(window).or_default() += delta;
                let total = reply.results[0].as_ref().expect("flushed").total;
                assert_eq!(total, counts[&window], "step {step}: the flush's total");
                continue;
            }
            let cost = if next() % 8 == 0 { 2 } else { 1 };
            let current = counts.get(&window).copied().unwrap_or(0);
            let previous = if sliding {
                counts.get(&(window - 1)).copied().unwrap_or(0)
            } else {
                0
            };
            let elapsed = now_us % w;
            let fits = previous * (w - elapsed) + (current + cost) * w <= limit * w;
            let request = ExactRequest {
                key: key.as_str().into(),
                algorithm,
                now_us,
                cost,
            };
            let d = store.exact(&request).await.expect("decision");
            let reset = Duration::from_micros(w - elapsed);
            match d {
                Decision::Allowed(a) if fits => {
                    allowed += 1;
                    *counts.entry(window).or_default() += cost;
                    let used = previous * (w - elapsed) + (current + cost) * w;
                    assert_eq!(a.remaining, (limit * w - used) / w, "step {step}");
                    assert_eq!(a.reset_after, reset, "step {step}");
                }
                Decision::Denied(d) if !fits => {
                    denied += 1;
                    assert_eq!(d.reset_after, reset, "step {step}");
                    assert!(
                        d.retry_after > Duration::ZERO && d.retry_after <= reset,
                        "step {step}: {d:?}"
                    );
                }
                other => panic!(
                    "{}: sliding {sliding}, step {step}: {current} + {cost} (previous {previous}) of {limit}: {other:?}",
                    store.describe()
                ),
            }
        }
        assert!(
            allowed > 20 && denied > 20,
            "one-sided: {allowed} / {denied}"
        );
    }
}

/// The whole suite.
pub async fn run(store: &dyn CounterStore, prefix: &str) {
    flush_semantics(store, prefix).await;
    exact_agrees_with_core(store, prefix).await;
    window_counter_shares_the_flushed_counts(store, prefix).await;
}

/// The suite for a store that serves `synced` mode only: the flush semantics, and `exact`
/// refused with an error that says so (never a decision).
pub async fn run_synced_only(store: &dyn CounterStore, prefix: &str) {
    flush_semantics(store, prefix).await;
    let request = ExactRequest {
        key: CounterKey::new(&format!("{prefix}/exact"), &["k"])
            .as_str()
            .into(),
        algorithm: ExactAlgorithm::FixedWindow {
            limit: 5,
            window_us: 1_000_000,
        },
        now_us: 1_700_000_000_000_000,
        cost: 1,
    };
    match store.exact(&request).await {
        Err(StoreError::Refused(message)) => {
            assert!(message.contains("exact"), "{message}");
        }
        other => panic!("{}: exact mode answered {other:?}", store.describe()),
    }
}

/// Asserts that `error` is a per-key bad reply naming `key`.
pub fn assert_bad_reply(
    result: &Result<sluice_store::FlushOutcome, StoreError>,
    key: &str,
    contains: &str,
) {
    match result {
        Err(StoreError::BadReply { key: k, detail }) => {
            assert_eq!(k, key);
            assert!(detail.contains(contains), "{detail}");
        }
        other => panic!("expected a bad reply for {key}, got {other:?}"),
    }
}
