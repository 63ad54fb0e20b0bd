//! A state directory's spill file is read at start: any bytes give a spill or an error that
//! names the file (and says to move it away), never a panic; a spill that loads is delivered by
//! an engine over a fresh store: what is left to deliver never grows, and once the store has
//! answered a few flushes nothing is left (every count landed, or its window had expired).
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use sluice_config::{RuleSet, parse_domain};
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions, StateDir};
use sluice_store::MemoryStore;

const RULES: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { window: 10s, requests_per_unit: 30, mode: synced, spans: 4 }\n";

fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("sluice-fuzz-spill-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = scratch();
    std::fs::write(dir.join("spill.json"), data).expect("write the spill file");
    let state = StateDir::open(dir).expect("the lock of a directory no one else uses");
    let spill = match state.read_spill() {
        Err(e) => {
            let message = e.to_string();
            assert!(message.contains("spill.json"), "{message}");
            assert!(message.contains("move it away"), "{message}");
            return;
        }
        Ok(None) => panic!("the file is there"),
        Ok(Some(spill)) => spill,
    };
    let rules = RuleSet::new(vec![parse_domain(Path::new("d.yaml"), RULES).unwrap()]).unwrap();
    let clock = ManualClock::new(sluice_fuzz::T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let engine = Engine::new(
        &rules,
        &Default::default(),
        store,
        Arc::new(clock) as Arc<dyn Clock>,
        EngineOptions {
            node_id: Some("replayer".into()),
            flush_chunk_items: 3,
            ..EngineOptions::default()
        },
    );
    let mut left = spill.counts();
    engine.replay(spill, Arc::new(state));
    let runtime = sluice_fuzz::runtime();
    for _ in 0..4 {
        runtime.block_on(engine.flush());
        let now = engine.replay_pending();
        assert!(now <= left, "left to deliver grew from {left} to {now}");
        left = now;
    }
    assert_eq!(left, 0, "the store answered, yet counts are left");
    assert!(!dir.join("spill.json").exists(), "delivered, the file is gone");
});
