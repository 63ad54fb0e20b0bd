//! Every file in `tests/invalid/` is rejected with exactly the message written on its last
//! line (`# expect: ...`, where `{dir}` stands for the fixture directory).

use std::path::Path;

#[test]
fn each_malformed_file_gets_its_exact_message() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/invalid");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 25, "only {} fixtures", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let expected = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} has no `# expect:` line", file.display()))
            .replace("{dir}", &dir.display().to_string());
        match sluice_config::load(file) {
            Ok(_) => failures.push(format!("{}: accepted", file.display())),
            Err(e) if e.to_string() != expected => failures.push(format!(
                "{}:\n  expected: {expected}\n  actual:   {e}",
                file.display()
            )),
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn shipped_examples_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let config = sluice_config::load(&root.join("sluice.yaml")).unwrap();
    assert_eq!(config.api_domain, "api");
    assert!(config.rules.domain("edge").is_some());
    assert!(config.rules.domain("mongo_cps").is_some());
    assert_eq!(config.gateways.len(), 1);
    for file in [
        "rules/edge.yaml",
        "rules/envoy-example.yaml",
        "rules/api.yaml",
    ] {
        sluice_config::load(&root.join(file)).unwrap();
    }
    let etcd = sluice_config::load(&root.join("etcd/sluice.yaml")).unwrap();
    assert!(matches!(etcd.store, sluice_config::StoreConfig::Etcd(_)));
    assert!(etcd.rules.domain("edge").is_some());
}

#[test]
fn listeners_take_host_names_and_say_which_do_not_resolve() {
    let file = Path::new("sluice.yaml");
    let config = sluice_config::parse_service(
        file,
        "listen: { http: 'localhost:18080', grpc: '127.0.0.1:18081', admin: '[::1]:19090' }\n",
    )
    .unwrap();
    assert_eq!(config.listen.http, "127.0.0.1:18080".parse().unwrap());
    assert_eq!(config.listen.admin, "[::1]:19090".parse().unwrap());
    let e = sluice_config::parse_service(file, "listen: { http: 'no-such-host.invalid:8080' }\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("sluice.yaml:1:17: invalid listen.http address `no-such-host.invalid:8080`: `no-such-host.invalid` does not resolve ("),
        "{e}"
    );
}

#[test]
fn defaults_shadow_mode_puts_every_limited_rule_in_shadow() {
    let dir = std::env::temp_dir().join(format!("sluice-shadow-all-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    std::fs::write(
        dir.join("rules/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: ip\n    rate_limit: { unit: minute, requests_per_unit: 0 }\n  - key: health\n    rate_limit: { unlimited: true }\n  - key: admin\n    shadow_mode: false\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
    )
    .unwrap();
    let file = dir.join("sluice.yaml");
    // A rule that says `shadow_mode: false` keeps enforcing in a dry run.
    for (shadow, expected) in [("true", [true, true, false, false]), ("false", [false; 4])] {
        std::fs::write(
            &file,
            format!("rules: [rules/]\ndefaults: {{ shadow_mode: {shadow} }}\n"),
        )
        .unwrap();
        let config = sluice_config::load(&file).unwrap();
        let domain = config.rules.domains().next().unwrap();
        let shadows: Vec<bool> = domain.rules().iter().map(|r| r.shadow_mode).collect();
        assert_eq!(shadows, expected, "shadow_mode: {shadow}");
        // A dry run is not a mistake: no warning about it.
        let warnings = sluice_config::warnings(&config);
        assert!(warnings.is_empty(), "{warnings:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
