//! Rule files (Envoy ratelimit's format and Sluice's extensions): any text gets a rule set or
//! an error naming where, never a panic; a rule set that loads builds an engine that decides.
#![no_main]

use std::path::Path;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use sluice_config::{RuleSet, parse_domain};
use sluice_core::ManualClock;
use sluice_store::MemoryStore;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let domain = match parse_domain(Path::new("fuzz.yaml"), text) {
        Ok(domain) => domain,
        Err(error) => {
            assert!(error.to_string().contains("fuzz.yaml"), "{error}");
            return;
        }
    };
    let name = domain.name().to_owned();
    let Ok(rules) = RuleSet::new(vec![domain]) else {
        return;
    };
    let clock = ManualClock::new(sluice_fuzz::T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let engine = sluice_fuzz::engine(&rules, &clock, store);
    let runtime = sluice_fuzz::runtime();
    for key in ["user", "ip", "a", "generic_key"] {
        let request = [[(key, "x")]];
        let _ = runtime.block_on(engine.check(&name, &request, 1));
    }
});
