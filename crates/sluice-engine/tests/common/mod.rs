//! Shared helpers: several engine instances with their own manual clocks on one store.

#![allow(dead_code)]

pub mod paused;
pub mod watched;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice_config::{RuleSet, parse_domain};
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions, Verdict};
use sluice_store::CounterStore;

pub const T0: u64 = 1_800_000_000_000_000_000; // a whole number of minutes since the epoch
pub const SECOND: u64 = 1_000_000_000;

pub fn rules(yaml: &str) -> RuleSet {
    RuleSet::new(vec![parse_domain(Path::new("test.yaml"), yaml).unwrap()]).unwrap()
}

pub fn synced_rule(limit: u64, window: &str, spans: u32, policy: &str, algorithm: &str) -> RuleSet {
    rules(&format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{ window: {window}, requests_per_unit: {limit}, spans: {spans}, policy: {policy}, algorithm: {algorithm}, mode: synced }}\n"
    ))
}

/// Polls a future once: local and synced checks must complete without waiting on anything.
pub fn now_or_never<F: Future>(f: F) -> Option<F::Output> {
    futures_util::FutureExt::now_or_never(f)
}

pub struct Instance {
    pub clock: ManualClock,
    pub skew: i64,
    pub engine: Arc<Engine>,
}

pub struct Fleet {
    pub instances: Vec<Instance>,
}

impl Fleet {
    pub fn new(
        rules: &RuleSet,
        store: Arc<dyn CounterStore>,
        skews_ms: &[i64],
        follow_store_clock: bool,
    ) -> Self {
        Self::expecting(rules, store, skews_ms, follow_store_clock, 1)
    }

    /// As [`Fleet::new`], with `expected_instances` set (the predictive cold start).
    pub fn expecting(
        rules: &RuleSet,
        store: Arc<dyn CounterStore>,
        skews_ms: &[i64],
        follow_store_clock: bool,
        expected_instances: u64,
    ) -> Self {
        let instances = skews_ms
            .iter()
            .enumerate()
            .map(|(i, &skew)| {
                let clock = ManualClock::new(T0);
                let engine = Engine::new(
                    rules,
                    &Default::default(),
                    store.clone(),
                    Arc::new(clock.clone()) as Arc<dyn Clock>,
                    EngineOptions {
                        node_id: Some(format!("node-{i}")),
                        follow_store_clock,
                        expected_instances,
                        ..EngineOptions::default()
                    },
                );
                Instance {
                    clock,
                    skew: skew * 1_000_000,
                    engine: Arc::new(engine),
                }
            })
            .collect();
        Self { instances }
    }

    /// Sets every instance's clock to `t` plus its skew.
    pub fn set_time(&self, t: u64) {
        for i in &self.instances {
            i.clock.set(t.saturating_add_signed(i.skew));
        }
    }

    /// Checks one request for `user` on instance `i`, which must not wait.
    pub fn check(&self, i: usize, user: &str) -> Verdict<'_> {
        let request = [[("user", user)]];
        now_or_never(self.instances[i].engine.check("d", &request, 1))
            .expect("a synced check waited on something")
            .unwrap()
    }

    pub async fn flush_due(&self) {
        for i in &self.instances {
            i.engine.flush_due().await;
        }
    }

    /// Flushes every instance now with the store down: every flush must fail.
    pub async fn flush_all_failing(&self) {
        for i in &self.instances {
            let report = i.engine.flush().await;
            assert!(report.error.is_some() || report.items == 0, "{report:?}");
        }
    }

    /// Flushes every instance now; every item must reach the store.
    pub async fn flush_all_ok(&self) {
        for i in &self.instances {
            let report = i.engine.flush().await;
            assert_eq!(report.failed, 0, "{report:?}");
        }
    }
}

pub fn window_of(t: u64, window_ns: u64) -> u64 {
    t / window_ns
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
