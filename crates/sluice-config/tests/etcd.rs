//! An etcd store serves synced mode only: a rule in exact mode (its own or by default) is an
//! error at the rule's line, and synced rules load.

use std::path::PathBuf;

fn service(
    name: &str,
    service: &str,
    rules: &str,
) -> (PathBuf, Result<sluice_config::ServiceConfig, String>) {
    let dir =
        std::env::temp_dir().join(format!("sluice-etcd-config-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("rules.yaml"), rules).unwrap();
    std::fs::write(dir.join("sluice.yaml"), service).unwrap();
    let loaded = sluice_config::load(&dir.join("sluice.yaml")).map_err(|e| e.to_string());
    (dir, loaded)
}

const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n  - key: ip\n    rate_limit: { unit: minute, requests_per_unit: 10, mode: exact }\n";

#[test]
fn exact_rules_are_refused_on_an_etcd_store_at_their_line() {
    let (dir, loaded) = service(
        "exact",
        "store: etcd://sluice:hunter2@127.0.0.1:2379\nrules: [rules.yaml]\n",
        RULES,
    );
    let e = loaded.unwrap_err();
    let rules = dir.join("rules.yaml").display().to_string();
    assert!(e.starts_with(&format!("{rules}:6:")), "{e}");
    assert!(
        e.contains("rule `ip` is in `exact` mode, which the etcd store does not run"),
        "{e}"
    );
    assert!(!e.contains("hunter2"), "{e}");

    let (_, loaded) = service(
        "default-exact",
        "store: etcd://127.0.0.1:2379\ndefaults: { mode: exact }\nrules: [rules.yaml]\n",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n",
    );
    assert!(
        loaded
            .unwrap_err()
            .contains("rule `user` is in `exact` mode")
    );

    let (_, loaded) = service(
        "synced",
        "store: etcds://127.0.0.1:2379,127.0.0.2\ndefaults: { mode: synced }\nrules: [rules.yaml]\n",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n",
    );
    let config = loaded.unwrap();
    assert!(
        matches!(config.store, sluice_config::StoreConfig::Etcd(ref t) if t.tls && t.endpoints.len() == 2)
    );
    let _ = std::fs::remove_dir_all(dir);
}
