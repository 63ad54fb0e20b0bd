//! A tenant-wide limit over many users: requests that carry a second descriptor, each rule's
//! key tallied with its own decision.

use sluice_sim::{Scenario, run};

#[test]
fn a_tenant_over_many_users_is_held_to_its_limit_while_its_users_are_not_refused() {
    // Thirty users far under their own limit whose requests also count against their tenant:
    // the tenant's key is a shared key at 3x the limit, the users' keys never refused by their
    // own rule (the tenant's rule refuses them, which is its figure, not theirs).
    let text = "duration_s: 180\nseed: 3\nrule: { limit: 300, window_s: 60 }\nnodes: { count: 5 }\ntraffic:\n  - steady: { rate: 15, keys: 30, prefix: member, tenant: tenant-0 }\nstore: { latency_ms: { median: 0.3, p99: 0.9 } }\npolicies: [predictive, exact]\n";
    let scenario = Scenario::parse("tenant.yaml", text).unwrap();
    assert!(sluice_sim::rule_file("predictive", &scenario).contains("- key: tenant"));
    let requests = sluice_sim::requests(&scenario);
    assert!(
        requests
            .iter()
            .all(|r| r.tenant.as_deref() == Some("tenant-0"))
    );
    let r = run(&scenario);
    for name in ["predictive", "exact"] {
        let p = r.policies.iter().find(|p| p.policy == name).unwrap();
        let class = |c: &str| p.classes.iter().find(|x| x.class == c).unwrap().clone();
        let (tenant, member) = (class("tenant"), class("member"));
        assert_eq!(tenant.keys, 1);
        // Every window busy (demand at 3x): the tenant gets its limit, no more.
        assert_eq!(tenant.busy_windows, 3, "{name}: {tenant:?}");
        assert!(
            tenant.over_max_pct <= 1.0 && tenant.under_admitted == 0,
            "{name}: {tenant:?}"
        );
        assert_eq!(member.false_denials, 0, "{name}: {member:?}");
        // Every request reached the tenant's rule: the users' rule admitted them all.
        assert_eq!(member.admitted, member.offered, "{name}");
        assert_eq!(tenant.offered, member.offered, "{name}");
    }
}
