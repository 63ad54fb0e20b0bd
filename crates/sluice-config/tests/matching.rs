//! Matching request descriptors to rules with Envoy ratelimit's semantics.

use std::path::Path;

use sluice_config::{Domain, Limit, parse_domain};

fn domain() -> Domain {
    parse_domain(
        Path::new("test.yaml"),
        r#"
domain: test
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: user
    value: vip
    rate_limit: { unit: minute, requests_per_unit: 1000 }
  - key: user
    value: bot-*
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: user
    value: health
    rate_limit: { unlimited: true }
  - key: path
    value: /search
    rate_limit: { name: search_all, unit: second, requests_per_unit: 200 }
    descriptors:
      - key: user
        rate_limit:
          unit: minute
          requests_per_unit: 30
          replaces: [{ name: search_all }]
  - key: database
    value: users
    rate_limit: { unit: second, requests_per_unit: 500 }
  - key: tenant
    limits:
      - { unit: minute, requests_per_unit: 3 }
      - { unit: hour, requests_per_unit: 100 }
"#,
    )
    .unwrap()
}

fn paths(domain: &Domain, entries: &[(&str, &str)]) -> Vec<String> {
    domain
        .match_descriptor(entries)
        .map(|r| format!("{} {}", r.path, r.limit))
        .collect()
}

#[test]
fn exact_value_wins_over_key_only() {
    let d = domain();
    assert_eq!(paths(&d, &[("user", "vip")]), ["user=vip 1000/1m"]);
    assert_eq!(paths(&d, &[("user", "alice")]), ["user 10/1m"]);
}

#[test]
fn prefix_value_wins_over_key_only() {
    let d = domain();
    assert_eq!(paths(&d, &[("user", "bot-42")]), ["user=bot-* 1/1m"]);
}

#[test]
fn unlimited_matches_and_reports_unlimited() {
    let d = domain();
    let rules: Vec<_> = d.match_descriptor(&[("user", "health")]).collect();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].limit, Limit::Unlimited);
}

#[test]
fn nested_descriptors_match_only_where_the_request_ends() {
    let d = domain();
    assert_eq!(paths(&d, &[("path", "/search")]), ["path=/search 200/1s"]);
    assert_eq!(
        paths(&d, &[("path", "/search"), ("user", "bob")]),
        ["path=/search/user 30/1m"]
    );
    // A longer descriptor than the tree: no rule (Envoy applies limits only at the last entry).
    assert!(paths(&d, &[("database", "users"), ("extra", "x")]).is_empty());
    assert!(paths(&d, &[("path", "/other")]).is_empty());
    assert!(paths(&d, &[("unknown", "x")]).is_empty());
    assert!(paths(&d, &[] as &[(&str, &str)]).is_empty());
}

#[test]
fn several_limits_on_one_key() {
    let d = domain();
    assert_eq!(
        paths(&d, &[("tenant", "t1")]),
        ["tenant 3/1m", "tenant 100/1h"]
    );
    let ids: Vec<_> = d
        .match_descriptor(&[("tenant", "t1")])
        .map(|r| r.id.clone())
        .collect();
    assert_eq!(ids, ["test/tenant#0", "test/tenant#1"]);
}

#[test]
fn replaces_drops_the_named_rule_when_both_match() {
    let d = domain();
    let request = vec![
        vec![("path", "/search")],
        vec![("path", "/search"), ("user", "bob")],
        vec![("user", "bob")],
    ];
    let matched: Vec<_> = d
        .match_request(&request)
        .iter()
        .map(|m| (m.descriptor, m.rule.path.clone()))
        .collect();
    assert_eq!(
        matched,
        [(1, "path=/search/user".to_owned()), (2, "user".to_owned())]
    );
    // Without the replacing rule, the named rule applies.
    let alone = vec![vec![("path", "/search")]];
    assert_eq!(d.match_request(&alone).len(), 1);
}
