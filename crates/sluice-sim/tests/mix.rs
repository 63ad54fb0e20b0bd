//! The mixes of users (`examples/scenarios/mix/`) in the simulator over 24 draws of the traffic:
//! per class, the worst window over the limit, busy windows under 95% of it, false denials.

use std::path::Path;

use sluice_sim::Scenario;
use sluice_sim::seeds::{SeedSpread, over_seeds};

/// The spread per class of the predictive policy on a shipped mix over seeds 1-24: one
/// traffic draw is one story, and bounds that held for one seed have failed for the next.
fn mix_over_seeds(file: &str) -> Vec<SeedSpread> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/scenarios")
        .join(file);
    let mut scenario = Scenario::load(&path).unwrap();
    scenario.policies = Some(vec!["predictive".to_owned()]);
    let spreads = over_seeds(&scenario, 1..=24).spreads;
    let classes: Vec<&str> = spreads.iter().map(|c| c.class.as_str()).collect();
    for class in ["bursty", "heavy", "mover", "normal", "pinned", "tenant"] {
        assert!(
            classes.contains(&class),
            "{file}: no {class} in {classes:?}"
        );
    }
    spreads
}

#[test]
fn a_surge_in_a_mix_of_users_holds_when_every_instance_spent_a_budget_split_from_old_rates() {
    // The mix of `mix/five.yaml` on five instances: a user trickling at 0.2/s, then a 1.5 s
    // surge on all five once a window, among heavy, bursty, pinned, moving, churning users
    // and a tenant over many members. Budgets set at the surge's first request from rates as
    // old as the trickle, each read as room by the others, went 5.7-15% over; an instance
    // that spent such a budget now leaves the others' part out at its early read, and counts
    // them as having spent what it did.
    //
    // Over seeds 1-24: every class but the surge and the tenant within 0.7% of the limit,
    // the surge 0-9.3% (one seed over 5%, seed 5), the tenant 0-9.3% (median 1.5%: its key
    // ramps from nothing to 3x the limit as its members arrive, read a span old; a boundary
    // reply that may lack the others' flushes reads again once they have landed when the key
    // nears its limit, which took it from 0-11.3%, median 5.7%; not held to the 5% target
    // yet), normal users' false denials at most 0.00%; the surge has 3 windows of 105 under
    // 95% of the limit (the least 83%; 67% while an early reply after a quiet span split by
    // the rates it read), the mover one under 95% (94.7%; docs/ACCURACY.md, "A mix of
    // users"). The bounds below are those figures: regression bounds where the targets are
    // not met.
    for c in mix_over_seeds("mix/five.yaml") {
        let (over, denials, least) = match c.class.as_str() {
            "surge" => (9.4, 0.1, 83.0),
            "tenant" => (9.4, 0.1, 95.0),
            "mover" => (1.0, 0.1, 94.0),
            "bursty" => (1.0, 0.1, 93.0),
            _ => (1.0, 0.1, 95.0),
        };
        assert!(c.worst_over_max_pct <= over, "{c:?}");
        assert!(c.false_denials_max_pct < denials, "{c:?}");
        assert!(c.busy_least_pct >= least, "{c:?}");
    }
}

#[test]
fn a_burst_after_a_quiet_span_reads_the_flushes_its_instances_last_read_came_before() {
    // The mix on 12 s windows (`mix/short.yaml`, a limit of 120: one request is 0.83%): a
    // bursty user, 50/s for 1 s every 4 s on five instances, quiet between. An instance whose
    // last read was a span boundary's reply that landed before the others' flushes of that
    // boundary took its budget at the next burst's first request from that read: three
    // instances that had read 73, 87 and 103 of 120 each took a fifth of what they read was
    // left (9, 6 and 3 of a room of 15). Such a budget now asks for an early sync at once,
    // and the burst is split from the count as it is.
    //
    // Over seeds 1-24: the bursty user 0-6.7% over (8 requests, seed 2; budgets of a
    // boundary split by rates of different ages add up to more than the room, and an early
    // reply after a quiet span splits evenly from what it read while the others spend their
    // parts; real processes: 0-6.7%), 15 busy windows of 56 under 95%, 91% at the least (an
    // early reply after a quiet span split by the rates it read: 5.0% over, 19 under, 90%),
    // heavy at most 1.7%, the tenant 0-11.7% (seed 9, its first window; false denials up to
    // 1.03%), the mover's least busy window 93%, normal users' false denials 0-0.11% (over
    // the 0.1% target in one seed; 0.19% before a budget split by demand was at least an
    // even part of the room while the window ends within the limit at the known rates;
    // docs/ACCURACY.md). Regression bounds where the targets are not met.
    for c in mix_over_seeds("mix/short.yaml") {
        let (over, denials, least) = match c.class.as_str() {
            "bursty" => (6.7, 0.1, 90.0),
            "tenant" => (11.7, 1.1, 95.0),
            "mover" => (2.0, 0.1, 93.0),
            _ => (2.0, 0.12, 95.0),
        };
        assert!(c.worst_over_max_pct <= over, "{c:?}");
        assert!(c.false_denials_max_pct < denials, "{c:?}");
        assert!(c.busy_least_pct >= least, "{c:?}");
    }
}
