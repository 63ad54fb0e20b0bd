//! The simulator: deterministic, `exact` never over-admits, `split` on one node equals `exact`,
//! the seed's bound holds for `reactive`, traces replay, plots are drawn, bad files get precise
//! errors.

use std::path::{Path, PathBuf};

use sluice_sim::seeds::over_seeds;
use sluice_sim::{Report, Scenario, run, write_plots};

fn shipped() -> Vec<(String, Scenario)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 7,
        "the issue asks for seven shipped scenarios"
    );
    files
        .into_iter()
        .map(|f| {
            let scenario = Scenario::load(&f).unwrap();
            (f.display().to_string(), scenario)
        })
        .collect()
}

fn policy<'r>(r: &'r Report, name: &str) -> &'r sluice_sim::PolicyReport {
    r.policies.iter().find(|p| p.policy == name).unwrap()
}

#[test]
fn shipped_scenarios_are_deterministic_and_exact_never_over_admits() {
    for (name, s) in shipped() {
        let first = run(&s);
        let a = serde_json::to_string(&first).unwrap();
        let b = serde_json::to_string(&run(&s)).unwrap();
        assert_eq!(a, b, "{name} is not deterministic");
        let exact = policy(&first, "exact");
        assert_eq!(exact.over_max_pct, 0.0, "{name}: exact over-admitted");
        assert!(exact.requests > 0, "{name}: no traffic");
        for p in &first.policies {
            assert_eq!(
                p.requests, exact.requests,
                "{name}: same traffic for every policy"
            );
            assert!(p.admitted <= p.requests);
            assert!(p.over_p99_pct <= p.over_max_pct);
        }
        // The accuracy targets of docs/ACCURACY.md (deterministic, so they are regression
        // tests too).
        let (reactive, predictive) = (policy(&first, "reactive"), policy(&first, "predictive"));
        // Both flush every span; predictive adds early syncs (a cold key's, a read after a
        // boundary's flushes have landed, a read before refusing a request on news older
        // than a span, a read after a boundary reply that may lack the others' flushes when
        // the key nears its limit): at most 3.5 round trips per 100 requests (`scaling`: 3.1,
        // one hot key on up to ten instances, where nine replies in ten of a boundary may
        // come before another instance's flush and read again).
        assert!(
            predictive.store_ops >= reactive.store_ops
                && predictive.store_ops_per_request <= reactive.store_ops_per_request + 0.035,
            "{name}: store operations {} (reactive {})",
            predictive.store_ops,
            reactive.store_ops
        );
        if reactive.over_p99_pct > 1.0 {
            // Not met on `affinity` (docs/ACCURACY.md, "Targets"): 50 keys of a limit of 100,
            // each sticky to one of four instances, where predictive's p99 is 2-3 requests
            // over against reactive's 14-16 (4.7-8x over seeds 1-16; 3 against 14 with the
            // shipped seed). Held there to 4.5x, a regression bound.
            let factor = if name.ends_with("affinity.yaml") {
                4.5
            } else {
                5.0
            };
            assert!(
                predictive.over_p99_pct * factor <= reactive.over_p99_pct,
                "{name}: predictive p99 {} is not {factor}x below reactive's {}",
                predictive.over_p99_pct,
                reactive.over_p99_pct
            );
        }
        if name.ends_with("skew.yaml") {
            assert!(
                predictive.over_p99_pct <= 2.0,
                "{name}: {}",
                predictive.over_p99_pct
            );
        }
        if name.ends_with("attacker.yaml") {
            assert!(
                predictive.over_p99_pct <= 5.0,
                "{name}: {}",
                predictive.over_p99_pct
            );
        }
        if name.ends_with("headroom.yaml") {
            assert!(
                predictive.false_denial_pct < 0.1,
                "{name}: {}",
                predictive.false_denial_pct
            );
        }
    }
}

#[test]
fn split_on_one_node_equals_exact() {
    let s = Scenario::parse(
        "one.yaml",
        "duration_s: 300\nseed: 9\nrule: { limit: 50, window_s: 30 }\nnodes: { count: 1 }\ntraffic:\n  - steady: { rate: 6, keys: 3 }\npolicies: [split, exact]\n",
    )
    .unwrap();
    let r = run(&s);
    assert_eq!(r.policies[0].admitted, r.policies[1].admitted);
    assert_eq!(
        r.policies[0].busiest_key_admitted,
        r.policies[1].busiest_key_admitted
    );
    assert!(
        r.policies[0].admitted < r.policies[0].requests,
        "the limit was reached"
    );
}

#[test]
fn seed_scenario_reactive_stays_within_the_seed_bound() {
    let (_, s) = shipped()
        .into_iter()
        .find(|(n, _)| n.ends_with("seed.yaml"))
        .unwrap();
    let r = run(&s);
    let reactive = policy(&r, "reactive");
    // MAX/N per span per node: 300 / 3 per span on each of 3 nodes is at most 50% of the
    // limit over it in one window.
    assert!(reactive.over_max_pct <= 50.0, "{}", reactive.over_max_pct);
    assert!(
        reactive.over_max_pct > 0.0,
        "at 2x the limit the seed over-admits"
    );
    assert!(policy(&r, "predictive").over_max_pct < reactive.over_max_pct);
}

#[test]
fn a_new_user_and_two_bursts_get_their_whole_first_window_and_no_more() {
    // A new user at 3x a limit of 100 per minute through three instances, evenly and in two
    // bursts: the predictive policy must neither run over nor leave much of the limit unused
    // (a cold key's first demand sample once read two hits in 30 ms as 66 a second: 91 and
    // 83 of 100).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios/first-window");
    for name in ["new-user.yaml", "bursts.yaml"] {
        let r = run(&Scenario::load(&dir.join(name)).unwrap());
        let predictive = policy(&r, "predictive");
        assert!(
            (95..=100).contains(&predictive.admitted),
            "{name}: {} of 100",
            predictive.admitted
        );
    }
}

#[test]
fn per_user_keys_with_churn_stay_within_a_request_or_two_of_their_limit() {
    // New users at 2x and 5x a limit of 20 per 10 s, each spread over three or five
    // instances. A limit this small is decided at the store by default (exactly the limit);
    // shared (`small_limits: share`), three defects let a user's window run over by several
    // requests (one request is 5% here):
    // - an instance that met the key late in a window settled it as its own at the next
    //   window's first boundaries, whose replies each came before the others' flushes, and
    //   admitted alone for a span (28 of 20);
    // - a flush that only added its count dropped the instances carried from the previous
    //   window that had not flushed in the new one yet (24 of 20);
    // - an instance whose entry was written after a single hit (no rate yet) was taken to
    //   count nothing more until its next flush (23 of 20 in first windows).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios/first-window");
    for (name, max, first_max) in [("churn-3.yaml", 10.0, 5.0), ("churn-5.yaml", 15.0, 15.0)] {
        let mut scenario = Scenario::load(&dir.join(name)).unwrap();
        scenario.policies = Some(vec!["predictive".into(), "predictive_share".into()]);
        let r = run(&scenario);
        let decided = policy(&r, "predictive");
        assert!(
            decided.over_max_pct == 0.0 && decided.false_denial_pct == 0.0,
            "{name}: decided at the store, max {}%, false denials {}%",
            decided.over_max_pct,
            decided.false_denial_pct
        );
        let p = policy(&r, "predictive_share");
        assert!(
            p.over_max_pct <= max && p.over_p99_pct <= 5.0 && p.first_over_max_pct <= first_max,
            "{name}: max {}%, p99 {}%, first windows max {}%",
            p.over_max_pct,
            p.over_p99_pct,
            p.first_over_max_pct
        );
    }
}

#[test]
fn a_trace_replays_request_by_request() {
    let yaml = "duration_s: 20\nseed: 1\nrule: { limit: 5, window_s: 10 }\nnodes: { count: 2 }\ntraffic:\n  - trace: { file: t.jsonl }\npolicies: [exact, split, local]\n";
    // 8 requests for `a` in the first window (one costing 2), 3 in the second, one past the end.
    let mut trace = String::new();
    for i in 0..7 {
        trace.push_str(&format!(
            "{{\"t_ms\": {}, \"node\": {}, \"key\": \"a\"}}\n",
            100 + i * 100,
            i % 2
        ));
    }
    trace.push_str("{\"t_ms\": 900, \"node\": 0, \"key\": \"a\", \"cost\": 2}\n\n");
    for i in 0..3 {
        trace.push_str(&format!(
            "{{\"t_ms\": {}, \"node\": 1, \"key\": \"a\"}}\n",
            10_500 + i
        ));
    }
    trace.push_str("{\"t_ms\": 25000, \"node\": 1, \"key\": \"a\"}\n");
    let s = Scenario::parse("s.yaml", yaml)
        .unwrap()
        .with_trace("t.jsonl", &trace)
        .unwrap();
    let r = run(&s);
    let exact = policy(&r, "exact");
    assert_eq!(exact.requests, 11);
    assert_eq!(exact.busiest_key_admitted, vec![5, 3]);
    // split: 5 / 2 nodes = 2 per node per window.
    let split = policy(&r, "split");
    assert_eq!(split.busiest_key_admitted, vec![4, 2]);
    // local, as `mode: local` means in a rule: every node allows the whole 5.
    let local = policy(&r, "local");
    assert!(
        local.busiest_key_admitted.iter().sum::<u64>()
            > exact.busiest_key_admitted.iter().sum::<u64>(),
        "{:?}",
        local.busiest_key_admitted
    );

    // From files: the trace path is relative to the scenario.
    let dir = std::env::temp_dir().join(format!("sluice-sim-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("s.yaml"), yaml).unwrap();
    std::fs::write(dir.join("t.jsonl"), &trace).unwrap();
    let loaded = run(&Scenario::load(&dir.join("s.yaml")).unwrap());
    assert_eq!(loaded, r);
    // A bad line is named with its line and column.
    std::fs::write(
        dir.join("t.jsonl"),
        "{\"t_ms\": 1, \"node\": 0, \"key\": \"a\"}\n{\"t_ms\": 2, \"node\": 9, \"key\": \"a\"}\n",
    )
    .unwrap();
    let err = Scenario::load(&dir.join("s.yaml")).unwrap_err().to_string();
    assert!(err.contains("t.jsonl:2:"), "{err}");
    assert!(
        err.contains("node 9 is not one of the scenario's 2 nodes"),
        "{err}"
    );
    std::fs::write(
        dir.join("t.jsonl"),
        "{\"t_ms\": 1, \"node\": 0, \"kye\": \"a\"}\n",
    )
    .unwrap();
    let err = Scenario::load(&dir.join("s.yaml")).unwrap_err().to_string();
    assert!(err.contains("t.jsonl:1:") && err.contains("kye"), "{err}");
    std::fs::remove_file(dir.join("t.jsonl")).unwrap();
    let err = Scenario::load(&dir.join("s.yaml")).unwrap_err().to_string();
    assert!(err.contains("cannot read the trace"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn store_latency_delays_what_the_nodes_learn() {
    // `expected: 3`: with replies that never come in time, the fleet's size cannot be learned
    // from the store either; the configured floor is what a node has.
    let base = "duration_s: 600\nseed: 11\nrule: { limit: 300, window_s: 60, spans: 6 }\nnodes: { count: 3, expected: 3 }\ntraffic:\n  - steady: { rate: 10 }\npolicies: [predictive, exact]\n";
    let fast = run(&Scenario::parse("fast.yaml", base).unwrap());
    // Replies that come back after the window is over: the nodes learn nothing in time.
    let slow = run(&Scenario::parse(
        "slow.yaml",
        &format!("{base}store: {{ latency_ms: {{ median: 61000 }} }}\n"),
    )
    .unwrap());
    let (f, sl) = (policy(&fast, "predictive"), policy(&slow, "predictive"));
    // Without a reply a node knows nothing of the others: it keeps to the seed's fallback
    // share (MAX/N per span): never more than the limit, and with even load about as much.
    assert_eq!(sl.over_max_pct, 0.0);
    assert!(
        sl.admitted.abs_diff(f.admitted) <= f.admitted / 100,
        "fast {} slow {}",
        f.admitted,
        sl.admitted
    );
    assert!(
        sl.estimates.iter().all(|e| e.others_read == 0),
        "no reply arrived in time"
    );
    assert!(f.estimates.iter().any(|e| e.others_read > 0));
    // Fewer round trips complete: a node waits for its reply before it flushes again.
    assert!(
        sl.store_ops < f.store_ops,
        "{} vs {}",
        sl.store_ops,
        f.store_ops
    );
    // Exact decisions are atomic in the store: latency changes their response time only.
    assert_eq!(
        policy(&slow, "exact").admitted,
        policy(&fast, "exact").admitted
    );
}

#[test]
fn nodes_that_leave_drop_out_of_the_live_count() {
    let s = Scenario::parse(
        "scale.yaml",
        "duration_s: 300\nseed: 12\nrule: { limit: 300, window_s: 60 }\nnodes: { count: 4, join_s: [0, 0, 60, 60], leave_s: [~, ~, 180, 180] }\ntraffic:\n  - steady: { rate: 8 }\npolicies: [predictive]\n",
    )
    .unwrap();
    let r = run(&s);
    let live_at = |t: f64| {
        r.policies[0]
            .estimates
            .iter()
            .rfind(|e| e.t_s <= t)
            .map(|e| e.live_instances)
            .unwrap()
    };
    assert_eq!(live_at(50.0), 2);
    assert_eq!(live_at(170.0), 4);
    // Gone for more than two spans (20 s): out of the count, also across a window boundary.
    assert_eq!(live_at(230.0), 2);
    assert_eq!(live_at(295.0), 2);
}

#[test]
fn attacks_are_timed_and_plots_are_drawn() {
    let s = Scenario::parse(
        "attack.yaml",
        "duration_s: 240\nseed: 13\nrule: { limit: 100, window_s: 60 }\nnodes: { count: 3 }\ntraffic:\n  - steady: { rate: 1, keys: 5 }\n  - attacker: { rate: 30, node: 1, key: bad, start_s: 70, end_s: 200 }\n",
    )
    .unwrap();
    let r = run(&s);
    assert_eq!(r.busiest_key, "bad");
    for p in &r.policies {
        let reaction = p.attack_reaction_s.unwrap_or(f64::MAX);
        assert!(reaction < 60.0, "{}: {reaction}", p.policy);
    }
    assert_eq!(policy(&r, "exact").attack_reaction_s, Some(0.0));
    let dir = std::env::temp_dir().join(format!("sluice-sim-plots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files = write_plots(&r, &dir).unwrap();
    assert_eq!(files.len(), 8);
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        if f.extension().unwrap() == "png" {
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", f.display());
            assert!(bytes.len() > 10_000, "{} looks empty", f.display());
        } else {
            let text = String::from_utf8(bytes).unwrap();
            assert!(text.contains("<svg"), "{}", f.display());
            assert!(text.contains("predictive"), "{} has no legend", f.display());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_scenarios_get_precise_errors() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic:\n  - stedy: { rate: 1 }\n",
            "bad.yaml:6:",
            "stedy",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic:\n  - steady: { rate: 1 }\n  - attacker: { rate: 1, node: 5, key: k, end_s: 5 }\n",
            "bad.yaml:7:",
            "attacker.node",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2, skew_ms: [1, 2, 3] }\ntraffic: []\n",
            "bad.yaml:4:",
            "one entry per node",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2, join_s: [0, 5], leave_s: [~, 5] }\ntraffic: []\n",
            "bad.yaml:4:",
            "join (join_s) before it leaves",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2, leave_s: [~, 5], crash_s: [~, 6] }\ntraffic: []\n",
            "bad.yaml:4:",
            "either leaves (leave_s) or crashes (crash_s)",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic:\n  - bursts: { rate: 5, every_s: 1, length_s: 2 }\n",
            "bad.yaml:6:",
            "length_s <= every_s",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic: []\npolicies: [predictive, optimistic]\n",
            "bad.yaml:6:",
            "unknown policy `optimistic`",
        ),
        (
            "duration_s: 0\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic: []\n",
            "bad.yaml:1:",
            "duration_s must be",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic: []\nstore: { latency_ms: { median: 5, p99: 1 } }\n",
            "bad.yaml:6:",
            "median <= p99",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic:\n  - key_affinity: { rate: 5, affinity: 1.5 }\n",
            "bad.yaml:6:",
            "affinity <= 1",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic:\n  - steady: { rate: 5, tenant: '' }\n",
            "bad.yaml:6:",
            "tenant must be 1 to 256 characters",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic:\n  - steady: { rate: 5, tenant: acme }\npolicies: [predictive, rlqs]\n",
            "bad.yaml:7:",
            "the rlqs policy does not run `tenant` traffic",
        ),
    ];
    // In `sluice check`'s words: did-you-mean, types in plain words, the place said once.
    let worded: &[(&str, &str)] = &[
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, windw_s: 1 }\nnodes: { count: 2 }\ntraffic: []\n",
            "bad.yaml:3:19: unknown field `windw_s`; did you mean `window_s`? (valid: `limit`, `window_s`, `spans`, `cooldown_s`)",
        ),
        (
            "duration_s: ten\n",
            "bad.yaml:1:13: wrong type: expected a whole number, found `ten`",
        ),
        (
            "duration_s: 10\nseed: 1\nrule: { limit: 5, window_s: 1 }\nnodes: { count: 2 }\ntraffic: []\npolicies: [predictve]\n",
            "bad.yaml:6:11: unknown policy `predictve`; did you mean `predictive`? (valid: `reactive`, `predictive`, `predictive_sliding`, `predictive_share`, `exact`, `split`, `local`, `rlqs`)",
        ),
        (
            "",
            "bad.yaml:1:1: the file is empty; a scenario starts with `duration_s:` (docs/CONFIG.md)",
        ),
    ];
    for (text, expected) in worded {
        let err = Scenario::parse("bad.yaml", text).unwrap_err().to_string();
        assert_eq!(&err, expected);
    }
    for (text, at, what) in cases {
        let err = Scenario::parse("bad.yaml", text).unwrap_err().to_string();
        assert!(err.starts_with(at), "{err} (expected {at})");
        assert!(err.contains(what), "{err} (expected {what})");
    }
}

#[test]
fn instances_whose_clocks_differ_by_milliseconds_still_read_each_others_span_flushes() {
    // Three instances on a store without a clock, their own clocks 10 ms apart at most (what
    // NTP leaves; etcd). The instance that flushes first at a span boundary used to read the
    // others before their flushes landed and take their counts from their demand for a whole
    // span: up to 13.3% over the limit, 3.4% on average.
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/scenarios/stress/clock-spread.yaml");
    let scenario = Scenario::load(&path).unwrap();
    assert!(!scenario.store.clock);
    let r = run(&scenario);
    let predictive = policy(&r, "predictive");
    assert!(
        predictive.over_max_pct <= 7.0 && predictive.over_mean_pct <= 1.0,
        "max {}%, mean {}%",
        predictive.over_max_pct,
        predictive.over_mean_pct
    );
    // The same fleet following a store's clock is aligned whatever the skew.
    let mut aligned = scenario.clone();
    aligned.store.clock = true;
    let aligned = run(&aligned);
    assert!(policy(&aligned, "predictive").over_max_pct <= 3.4);
}

#[test]
fn a_burst_on_every_instance_after_a_trickle_gets_the_limit_and_no_more() {
    // One user trickling at 2 requests/s over five instances, then once a window a 1.5 s burst
    // at 250/s on all of them at once. Every instance's rates are a trickle's, each of a
    // different age: budgets split by demand added up to anywhere from half the room to one
    // and a half of it (windows of 318, 304, 378, 383 and 336 of 300). Split evenly where rates
    // say nothing (a key quiet at the boundary, a key far below its limit), every window held
    // within 5% of the limit (311, 304, 315, 312, 310). The first reply after the burst then
    // read the others as they were before it and handed out room they had spent since; a
    // budget set at a reply that may lack their flushes now leaves that room out when this
    // instance spent its own: within 2% of the limit, and at least 95% of it admitted.
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios/mix/surge.yaml");
    let r = run(&Scenario::load(&path).unwrap());
    let predictive = policy(&r, "predictive");
    for (w, &admitted) in predictive.admitted_by_window.iter().enumerate() {
        assert!(
            (285..=306).contains(&admitted),
            "window {w}: {admitted} of 300 ({:?})",
            predictive.admitted_by_window
        );
    }
}

#[test]
fn the_predictive_targets_hold_over_ten_seeds() {
    // The targets of docs/ACCURACY.md that hold for every seed tried, checked over seeds 1-10
    // (the shipped files' own seeds are checked above): p99 within 2% with ±2 s of clock
    // skew (0.0%, the worst window at most 0.7%), an attacker on one node within 5%, false
    // denials under 0.1% with traffic under 90% of the limit (at most 0.06%); a store outage
    // within 5x below reactive (at most 1.3% against reactive's 22.0-34.7%).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scenarios");
    let spread = |file: &str| {
        let mut s = Scenario::load(&dir.join(file)).unwrap();
        s.policies = Some(vec!["predictive".to_owned()]);
        over_seeds(&s, 1..=10).spreads
    };
    for c in spread("skew.yaml") {
        assert!(c.p99_over_max_pct <= 2.0, "{c:?}");
    }
    for c in spread("attacker.yaml") {
        assert!(c.p99_over_max_pct <= 5.0, "{c:?}");
    }
    for c in spread("headroom.yaml") {
        assert!(c.false_denials_max_pct < 0.1, "{c:?}");
    }
    // A 30 s store outage at 2x the limit: the others taken to grow at their last known rates
    // went up to 8.0% over (3.5x below reactive on seed 6); at 1.2x those rates, 0.0-1.3% over
    // seeds 1-10, some windows admitting 91% of the limit; every seed's reactive run went at
    // least 22% over, so predictive's worst is more than 5x below any of them.
    let mut outage = Scenario::load(&dir.join("outage.yaml")).unwrap();
    outage.policies = Some(vec!["predictive".to_owned(), "reactive".to_owned()]);
    let outage = over_seeds(&outage, 1..=10).spreads;
    let (predictive, reactive) = (&outage[0], &outage[1]);
    assert_eq!(
        (predictive.policy.as_str(), reactive.policy.as_str()),
        ("predictive", "reactive")
    );
    assert!(predictive.worst_over_max_pct <= 1.4, "{predictive:?}");
    assert!(predictive.busy_least_pct >= 85.0, "{predictive:?}");
    assert!(
        predictive.p99_over_max_pct * 5.0
            <= reactive.p99_over_max_pct.min(reactive.worst_over_min_pct),
        "{predictive:?} {reactive:?}"
    );
}
