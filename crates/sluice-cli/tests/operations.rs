//! What an operator sees: every metric family with its help from the start, the shipped alert
//! rules (run by promtool) and dashboard naming only metrics Sluice exports, the status page
//! and `/status.json` naming the key being denied (escaped: keys come from traffic), `sluice
//! status`, and the page as a real browser (headless Chromium) renders it.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Serve, http_call};
use serde_json::Value;
use sluice_testkit::{RedisServer, wait_until};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A key whose value is markup: the page must show it, never run it.
const EVIL: &str = "<img src=x onerror=alert(1)>";

const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
"#;

fn json_request(user: &str) -> String {
    serde_json::json!({
        "domain": "edge",
        "descriptors": [{ "entries": [{ "key": "user", "value": user }] }]
    })
    .to_string()
}

/// Family names in a Prometheus text exposition, and the families with a `# HELP` line.
fn families(metrics: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut typed = BTreeSet::new();
    let mut helped = BTreeSet::new();
    for line in metrics.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("#"), Some("TYPE"), Some(name)) => {
                typed.insert(name.to_owned());
            }
            (Some("#"), Some("HELP"), Some(name)) => {
                helped.insert(name.to_owned());
            }
            _ => {}
        }
    }
    (typed, helped)
}

/// Every `sluice_*` metric an expression names, as its family (histogram series to their
/// family).
fn named_metrics(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("sluice_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_lowercase() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &text[start..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.insert(family.to_owned());
        i = end;
    }
    names
}

#[test]
fn alert_rules_pass_their_promtool_tests() {
    let dir = root().join("deploy/prometheus");
    let run = |args: &[&str]| {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool (Debian's prometheus package; the README test command installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["check", "rules", "sluice-alerts.yml"]);
    run(&["test", "rules", "sluice-alerts.test.yml"]);
}

#[test]
fn every_family_has_help_from_the_start_and_alerts_and_dashboard_name_real_metrics() {
    let redis = RedisServer::start();
    // Synced over a real store (flushes, fleet, tracked keys), a tiny key cap (the sketch's
    // overflow counter) and an exact rule (the breaker).
    let rules = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: { window: 3s, requests_per_unit: 5, spans: 3 }
  - key: account
    rate_limit: { unit: minute, requests_per_unit: 100, mode: exact }
"#;
    let serve = Serve::start_with(
        "ops-metrics",
        &redis.url(),
        &[("edge.yaml", rules)],
        "max_keys_per_rule: 4\n",
    );
    let (status, at_start) = http_call(serve.admin, "GET", "/metrics", "");
    assert_eq!(status, 200);
    let (typed, helped) = families(&at_start);
    for f in sluice_engine::METRIC_FAMILIES {
        if !f.start.is_empty() {
            assert!(
                typed.contains(f.name),
                "{} missing at start:\n{at_start}",
                f.name
            );
        }
    }
    assert!(
        at_start.contains("sluice_build_info{version=\""),
        "{at_start}"
    );
    assert!(at_start.contains("sluice_store_up 1"), "{at_start}");

    for i in 0..400 {
        let user = format!("u{}", i % 10);
        http_call(serve.http, "POST", "/json", &json_request(&user));
    }
    let account =
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"account","value":"a1"}]}]}"#;
    http_call(serve.http, "POST", "/json", account);
    let mut metrics = String::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            metrics = http_call(serve.admin, "GET", "/metrics", "").1;
            metrics.contains("sluice_tracked_keys{")
                && metrics.contains("sluice_flush_duration_seconds_bucket")
                && metrics.contains("sluice_decision_duration_seconds_bucket")
        }),
        "flush and decision metrics never appeared:\n{metrics}\n{}",
        serve.log_tail()
    );
    let (typed, helped_now) = families(&metrics);
    for name in &typed {
        assert!(
            helped.contains(name) || helped_now.contains(name),
            "{name} has no # HELP"
        );
        assert!(
            sluice_engine::METRIC_FAMILIES
                .iter()
                .any(|f| f.name == name),
            "{name} is exported but not in METRIC_FAMILIES (and docs/OPERATIONS.md)"
        );
    }
    assert!(
        metrics.contains("le=\"0.001\""),
        "flush duration is a histogram with buckets:\n{metrics}"
    );

    let alerts =
        std::fs::read_to_string(root().join("deploy/prometheus/sluice-alerts.yml")).unwrap();
    let dashboard = std::fs::read_to_string(root().join("deploy/grafana/sluice.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let mut exprs = String::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push_str(target["expr"].as_str().expect("a PromQL expression"));
            exprs.push('\n');
        }
    }
    for (what, text) in [
        ("alert rules", alerts.as_str()),
        ("dashboard", exprs.as_str()),
    ] {
        let names = named_metrics(text);
        assert!(names.len() >= 5, "{what}: {names:?}");
        for name in names {
            assert!(
                typed.contains(&name),
                "the {what} name {name}, which this instance does not export:\n{metrics}"
            );
        }
    }
    // A fresh instance that has decided nothing yet (no key cap reached, no exact rule, no
    // flush) already has a series for every family the dashboard and the alerts query, so
    // their panels show 0 rather than "no data".
    let fresh = Serve::start("ops-fresh", "memory://", &[("edge.yaml", RULES)]);
    let (_, fresh_metrics) = http_call(fresh.admin, "GET", "/metrics", "");
    let series = |name: &str| {
        fresh_metrics.lines().any(|l| {
            !l.starts_with('#')
                && (l.starts_with(&format!("{name}{{"))
                    || l.starts_with(&format!("{name} "))
                    || l.starts_with(&format!("{name}_bucket"))
                    || l.starts_with(&format!("{name}_count")))
        })
    };
    let mut missing: Vec<String> = named_metrics(&alerts)
        .into_iter()
        .chain(named_metrics(&exprs))
        .filter(|n| !series(n))
        .collect();
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "queried by the dashboard or the alerts, no series at start: {missing:?}\n{fresh_metrics}"
    );
}

/// A `sluice serve` with the per-user rule, after one user (`EVIL`) sent 200 requests and two
/// others one each: a rule this quiet counts every request of its heavy keys.
fn serve_with_a_denied_key(name: &str) -> Serve {
    // Keys in full: this test is about escaping them (masking is admin_exposure.rs's).
    let serve = Serve::start_with(
        name,
        "memory://",
        &[("edge.yaml", RULES)],
        "access:\n  status_full_keys: true\n",
    );
    // The rule's window is the wall clock's minute: a test that crossed into the next one
    // would see the key's count start over. Begin early in a minute.
    let into_minute = sluice_core::Clock::now(&sluice_core::SystemClock::new()) % 60_000_000_000;
    if into_minute > 40_000_000_000 {
        std::thread::sleep(std::time::Duration::from_nanos(
            60_000_000_000 - into_minute + 200_000_000,
        ));
    }
    for _ in 0..200 {
        http_call(serve.http, "POST", "/json", &json_request(EVIL));
    }
    for user in ["alice", "bob"] {
        http_call(serve.http, "POST", "/json", &json_request(user));
    }
    serve
}

fn status_json(serve: &Serve) -> Value {
    let (code, body) = http_call(serve.admin, "GET", "/status.json", "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status.json is JSON")
}

#[test]
fn the_status_shows_who_is_denied_escaped_and_sluice_status_prints_it() {
    let serve = serve_with_a_denied_key("ops-status");
    let status = status_json(&serve);
    assert_eq!(status["format"], 1);
    assert_eq!(status["store"]["health"], "answering");
    let rule = &status["rules"][0];
    assert_eq!(rule["id"], "edge/user");
    assert_eq!(rule["decisions"]["allowed"], 5, "{rule}");
    assert_eq!(rule["decisions"]["denied"], 197, "{rule}");
    assert_eq!(rule["tracked_keys"], 3);
    let top = &rule["heavy_keys"][0];
    assert_eq!(top["key"], EVIL, "{rule}");
    assert_eq!(top["blocked"], true);
    assert_eq!(top["used"], 3);
    // A quiet rule's keys are counted one by one, not sampled.
    assert_eq!(top["requests"], 200, "{top}");
    assert_eq!(top["denied"], 197, "{top}");
    assert_eq!(top["estimated"], false, "{top}");
    let alice = rule["heavy_keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == "alice")
        .expect("alice among the keys");
    assert_eq!(
        (&alice["requests"], &alice["denied"]),
        (&1.into(), &0.into())
    );

    let (code, page) = http_call(serve.admin, "GET", "/", "");
    assert_eq!(code, 200);
    assert!(
        !page.contains(EVIL),
        "the key's markup reached the page raw"
    );
    assert!(
        page.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "the key is shown escaped"
    );
    assert!(
        page.contains("since started: 5 allowed, 197 denied"),
        "{page}"
    );

    let (code, rules) = http_call(serve.admin, "GET", "/rlconfig", "");
    assert_eq!(code, 200);
    assert!(
        rules.contains("domain edge") && rules.contains("3 per 1m"),
        "{rules}"
    );
    let (_, metrics) = http_call(serve.admin, "GET", "/metrics", "");
    for series in [
        r#"sluice_requests_total{door="json",result="ok"} 5"#,
        r#"sluice_requests_total{door="json",result="over_limit"} 197"#,
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }

    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["status", "--admin", &format!("127.0.0.1:{}", serve.admin)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("edge/user heaviest keys"), "{text}");
    assert!(text.contains(EVIL) && text.contains("blocked"), "{text}");
    // The build, as `sluice --version` names it, on the page and in `sluice status`.
    let version = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    let build = version.trim().strip_prefix("sluice ").unwrap();
    assert!(build.contains(&format!(
        "(commit {}, built {})",
        status["commit"].as_str().unwrap(),
        status["build_date"].as_str().unwrap()
    )));
    assert!(page.contains(build), "{build} not on the page");
    assert!(
        text.starts_with(&format!("sluice {build} instance")),
        "{text}"
    );
}

fn chromium() -> PathBuf {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("chromium (Debian's chromium package; the README test command installs it)")
}

fn headless(url: &str, extra: &[&str], profile: &Path) -> std::process::Output {
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1280,900",
            // Lets the page's own refresh (every 2 s) run once before the DOM is taken.
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("run chromium")
}

#[test]
fn a_real_browser_shows_the_denied_key_with_the_figures_of_status_json() {
    let serve = serve_with_a_denied_key("ops-browser");
    let url = format!("http://127.0.0.1:{}/", serve.admin);
    let profile = serve.dir().join("chromium");
    let shot = root().join("target/status-page.png");
    let out = headless(
        &url,
        &[&format!("--screenshot={}", shot.display())],
        &profile,
    );
    assert!(
        shot.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = headless(&url, &["--dump-dom"], &profile);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains(r#"data-from="status.json""#),
        "the page did not redraw itself from /status.json:\n{dom}"
    );
    let status = status_json(&serve);
    let rule = &status["rules"][0];
    let figures = format!(
        "since started: {} allowed, {} denied",
        rule["decisions"]["allowed"], rule["decisions"]["denied"]
    );
    assert!(dom.contains(&figures), "{figures} not in the page:\n{dom}");
    let heavy = dom
        .split("heaviest keys")
        .nth(1)
        .expect("a heavy-hitters table");
    assert!(
        heavy.contains("&lt;img src=x onerror=alert(1)&gt;") && heavy.contains("blocked"),
        "the denied key in the table:\n{heavy}"
    );
    assert!(!dom.contains(EVIL), "the key's markup became an element");
}

#[test]
fn docs_operations_lists_every_metric_family_with_its_help() {
    let doc = std::fs::read_to_string(root().join("docs/OPERATIONS.md")).unwrap();
    for f in sluice_engine::METRIC_FAMILIES {
        let kind = format!("{:?}", f.kind).to_lowercase();
        let row = format!("| `{}` | {kind} | {} |", f.name, f.help);
        assert!(
            doc.contains(&row),
            "docs/OPERATIONS.md lacks the row\n{row}"
        );
    }
}

#[test]
fn the_shipped_systemd_unit_verifies() {
    let Ok(probe) = Command::new("systemd-analyze").arg("--version").output() else {
        panic!("systemd-analyze is missing (Debian's systemd package)");
    };
    assert!(probe.status.success());
    let unit = std::fs::read_to_string(root().join("deploy/systemd/sluice.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/sluice serve"));
    // Verified with the binary this build made where the unit expects the installed one.
    let dir = std::env::temp_dir().join(format!("sluice-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/sluice", env!("CARGO_BIN_EXE_sluice")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn detailed_metric_counts_per_value_within_its_bound() {
    let rules = r#"
domain: edge
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
"#;
    let serve = Serve::start("ops-detailed", "memory://", &[("edge.yaml", rules)]);
    for _ in 0..3 {
        http_call(serve.http, "POST", "/json", &json_request("carol"));
    }
    for i in 0..150 {
        http_call(
            serve.http,
            "POST",
            "/json",
            &json_request(&format!("spray-{i}")),
        );
    }
    let (_, metrics) = http_call(serve.admin, "GET", "/metrics", "");
    let series = |value: &str, outcome: &str| {
        format!(
            r#"sluice_detailed_decisions_total{{domain="edge",rule="edge/user",value="{value}",outcome="{outcome}"}}"#
        )
    };
    assert!(
        metrics.contains(&format!("{} 2", series("carol", "allowed"))),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("{} 1", series("carol", "denied"))),
        "{metrics}"
    );
    // carol and 99 sprayed values have their own series; the other 51 share one.
    assert!(
        metrics.contains(&format!("{} 51", series("_other", "allowed"))),
        "{metrics}"
    );
    let own = metrics
        .lines()
        .filter(|l| {
            l.starts_with("sluice_detailed_decisions_total{") && l.contains("outcome=\"allowed\"")
        })
        .count();
    assert_eq!(own, 101, "{metrics}");
}
