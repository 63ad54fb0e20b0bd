//! What a new user meets in the first week, on real `sluice serve` processes: the shipped
//! example starts clean, a config without rules is refused with a way out.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::http_call;
use sluice_testkit::{free_port, wait_until};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A copy of the shipped example config and rules in a fresh directory, its listeners moved
/// to free loopback ports. Returns the directory and the admin port.
fn example_copy(name: &str) -> (PathBuf, u16) {
    let dir = std::env::temp_dir().join(format!(
        "sluice-first-week-{name}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    for entry in std::fs::read_dir(repo().join("examples/rules")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join("rules").join(path.file_name().unwrap())).unwrap();
    }
    let admin = free_port();
    let mut config = std::fs::read_to_string(repo().join("examples/sluice.yaml")).unwrap();
    for (from, to) in [
        ("127.0.0.1:8080", free_port()),
        ("127.0.0.1:8081", free_port()),
        ("127.0.0.1:9090", admin),
        ("127.0.0.1:8000", free_port()),
    ] {
        assert!(
            config.contains(from),
            "the example no longer listens on {from}"
        );
        config = config.replace(from, &format!("127.0.0.1:{to}"));
    }
    std::fs::write(dir.join("sluice.yaml"), config).unwrap();
    (dir, admin)
}

#[test]
fn the_shipped_example_starts_without_a_warning() {
    let (dir, admin) = example_copy("clean");
    let log = dir.join("serve.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(dir.join("sluice.yaml"))
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(10), || {
        http_call(admin, "GET", "/healthz", "").0 == 200
    });
    // Past the start: the listeners are bound and the flusher has run once.
    std::thread::sleep(Duration::from_millis(300));
    let _ = child.kill();
    let _ = child.wait();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(up, "the example did not come up: {said}");
    assert!(
        said.trim().is_empty(),
        "the shipped example logged at start:\n{said}"
    );
}

fn check(config: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--config"])
        .arg(config)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_config_without_rules_is_refused_by_check_and_serve_unless_it_says_so() {
    let dir = std::env::temp_dir().join(format!(
        "sluice-first-week-norules-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    let admin = free_port();
    let base = format!(
        "store: memory://\nlisten: {{ http: 127.0.0.1:{}, grpc: 127.0.0.1:{}, admin: 127.0.0.1:{admin} }}\n",
        free_port(),
        free_port()
    );
    let config = dir.join("sluice.yaml");

    // No `rules:` at all, then a mis-mounted (empty) rules directory.
    for (text, says) in [
        (base.clone(), "no rules: add `rules: [rules/]`"),
        (format!("{base}rules: [rules/]\n"), "no rule file is there"),
    ] {
        std::fs::write(&config, &text).unwrap();
        let (ok, said) = check(&config);
        assert!(!ok, "check passed a config without rules: {said}");
        assert!(said.contains(says), "{said}");
        assert!(said.contains("allow_empty_rules: true"), "{said}");
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(!out.status.success(), "serve started without rules");
        assert!(String::from_utf8_lossy(&out.stderr).contains(says));
    }

    // Said on purpose: it loads, with a warning.
    std::fs::write(&config, format!("{base}allow_empty_rules: true\n")).unwrap();
    let (ok, said) = check(&config);
    assert!(ok, "{said}");
    assert!(
        said.contains("warning") && said.contains("unknown domain"),
        "{said}"
    );

    // One empty directory among others: a warning, the rules of the others load.
    std::fs::create_dir_all(dir.join("more")).unwrap();
    std::fs::write(
        dir.join("rules/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
    )
    .unwrap();
    std::fs::write(&config, format!("{base}rules: [rules/, more/]\n")).unwrap();
    let (ok, said) = check(&config);
    assert!(ok, "{said}");
    assert!(said.contains("more/` holds no rule file"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sluice_status_finds_the_instance_from_its_config_and_says_why_a_rule_runs_as_local() {
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    let serve = common::Serve::start("first-week-status", "memory://", &[("edge.yaml", rules)]);
    http_call(
        serve.http,
        "POST",
        "/json",
        r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#,
    );
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["status", "--config"])
        .arg(serve.dir().join("sluice.yaml"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One word per column: the mode, then the policy only where it says more.
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("edge/user "))
        .unwrap_or_else(|| panic!("no row for the rule:\n{text}"));
    assert!(!row.contains("local local"), "{row}");
    assert!(
        text.contains("edge/user: synced on the embedded memory store: runs as local"),
        "{text}"
    );
    // The counts of a quiet rule are exact: alice's one request.
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("alice") && !l.contains('~')),
        "{text}"
    );

    let (ok, said) = check(&serve.dir().join("sluice.yaml"));
    assert!(ok, "{said}");
    assert!(said.contains(": 1 rule\n"), "{said}");
    assert!(
        said.contains("runs as local (one instance on the memory store)"),
        "{said}"
    );
}

#[test]
fn a_stopped_instance_leaves_the_fleet_at_once() {
    let redis = sluice_testkit::RedisServer::start();
    let rules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 60 }\n";
    let mut first =
        common::Serve::start("first-week-leave-a", &redis.url(), &[("edge.yaml", rules)]);
    let announced = wait_until(Duration::from_secs(10), || {
        redis.command("ZCARD sluice:v1:fleet").trim() == ":1"
    });
    assert!(announced, "the instance never announced itself");
    assert!(first.terminate().success());
    // Restarted (a deploy): the new process counts itself alone, not the one that stopped
    // for the next 90 s (which halved every new key's share).
    assert_eq!(redis.command("ZCARD sluice:v1:fleet").trim(), ":0");
    let second = common::Serve::start("first-week-leave-b", &redis.url(), &[("edge.yaml", rules)]);
    let mut live = String::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (_, body) = http_call(second.admin, "GET", "/status.json", "");
            live = serde_json::from_str::<serde_json::Value>(&body)
                .map(|s| s["store"]["fleet_instances"].to_string())
                .unwrap_or_default();
            live == "1"
        }),
        "the restarted instance sees {live} instances"
    );
}
