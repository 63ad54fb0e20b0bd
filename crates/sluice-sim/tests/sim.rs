//! The simulator: deterministic, `exact` never over-admits, `local` on one node equals `exact`,
//! bad files get precise errors.

use std::path::Path;

use sluice_sim::{Scenario, run};

fn shipped() -> Vec<(String, Scenario)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            let name = f.display().to_string();
            let scenario = Scenario::parse(&name, &text).unwrap();
            (name, scenario)
        })
        .collect()
}

#[test]
fn same_seed_same_result() {
    for (name, s) in shipped() {
        let a = serde_json::to_string(&run(&s)).unwrap();
        let b = serde_json::to_string(&run(&s)).unwrap();
        assert_eq!(a, b, "{name} is not deterministic");
    }
}

#[test]
fn exact_never_over_admits_in_any_shipped_scenario() {
    for (name, s) in shipped() {
        let report = run(&s);
        let exact = report
            .policies
            .iter()
            .find(|p| p.policy == "exact")
            .unwrap();
        assert_eq!(exact.over_max_pct, 0.0, "{name}: exact over-admitted");
    }
}

#[test]
fn local_on_one_node_equals_exact() {
    let s = Scenario::parse(
        "one.yaml",
        "duration_s: 300\nseed: 9\nrule: { limit: 50, window_s: 30 }\nnodes: { count: 1 }\ntraffic:\n  - steady: { rate: 3, keys: 3 }\npolicies: [local, exact]\n",
    )
    .unwrap();
    let r = run(&s);
    assert_eq!(r.policies[0].admitted, r.policies[1].admitted);
    assert_eq!(
        r.policies[0].busiest_key_admitted,
        r.policies[1].busiest_key_admitted
    );
}

#[test]
fn seed_scenario_reactive_stays_within_the_seed_bound() {
    let (_, s) = shipped()
        .into_iter()
        .find(|(n, _)| n.ends_with("seed.yaml"))
        .unwrap();
    let r = run(&s);
    let reactive = r.policies.iter().find(|p| p.policy == "reactive").unwrap();
    // MAX/N per span per node: 300 / 6 * 3 nodes = 150, i.e. 50% of the limit.
    assert!(reactive.over_max_pct <= 50.0, "{}", reactive.over_max_pct);
    let predictive = r
        .policies
        .iter()
        .find(|p| p.policy == "predictive")
        .unwrap();
    assert!(predictive.over_max_pct < reactive.over_max_pct);
}

#[test]
fn bad_scenarios_get_precise_errors() {
    let err = Scenario::parse("bad.yaml", "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic:\n  - stedy: { rate: 1 }\n").unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("bad.yaml:6:"), "{text}");
    assert!(text.contains("stedy"), "{text}");
    let err = Scenario::parse("bad.yaml", "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic:\n  - attacker: { rate: 1, node: 5, key: k, end_s: 5 }\n").unwrap_err();
    assert!(err.to_string().contains("attacker.node"), "{err}");
}
