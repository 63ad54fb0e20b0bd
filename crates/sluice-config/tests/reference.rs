//! docs/CONFIG.md cannot drift from the parser: at every level of `sluice.yaml` and of rule
//! files, an unknown key makes the parser list the keys it accepts, and each of them must be
//! named (as `key`) in the reference.

use std::path::Path;

/// The keys the parser accepts where `text` puts the unknown key `zzzz_unknown`.
fn accepted_keys(text: &str, service: bool) -> Vec<String> {
    let file = Path::new("reference.yaml");
    let error = if service {
        sluice_config::parse_service(file, text)
            .map(|_| ())
            .unwrap_err()
    } else {
        sluice_config::parse_domain(file, text)
            .map(|_| ())
            .unwrap_err()
    }
    .to_string();
    let list = error
        .split_once("write one of ")
        .or_else(|| error.split_once("(valid: "))
        .unwrap_or_else(|| panic!("no list of keys in: {error}"))
        .1;
    list.split(", ")
        .map(|k| k.trim_matches(|c| c == '`' || c == ')').to_owned())
        .collect()
}

#[test]
fn every_key_the_parser_accepts_is_in_the_reference() {
    let reference =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/CONFIG.md"))
            .unwrap();
    let gateway =
        "gateways:\n  - listen: 127.0.0.1:1\n    upstream: http://127.0.0.1:2\n    domain: d\n";
    let levels: [(&str, String, bool); 10] = [
        ("sluice.yaml", "zzzz_unknown: 1\n".into(), true),
        ("listen", "listen:\n  zzzz_unknown: 1\n".into(), true),
        ("defaults", "defaults:\n  zzzz_unknown: 1\n".into(), true),
        ("api", "api:\n  zzzz_unknown: 1\n".into(), true),
        ("listeners", "listeners:\n  zzzz_unknown: 1\n".into(), true),
        ("access", "access:\n  zzzz_unknown: 1\n".into(), true),
        (
            "gateways[]",
            format!("{gateway}    zzzz_unknown: 1\n"),
            true,
        ),
        (
            "routes[]",
            format!(
                "{gateway}    routes:\n      - match: {{ path: / }}\n        zzzz_unknown: 1\n"
            ),
            true,
        ),
        (
            "descriptors[]",
            "domain: d\ndescriptors:\n  - key: k\n    zzzz_unknown: 1\n".into(),
            false,
        ),
        (
            "rate_limit",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { zzzz_unknown: 1 }\n".into(),
            false,
        ),
    ];
    let mut missing = Vec::new();
    for (level, text, service) in &levels {
        let keys = accepted_keys(text, *service);
        assert!(!keys.is_empty(), "{level}: {keys:?}");
        for key in keys {
            // `key`, `key: ...` in an example, or a dotted `parent.key` / `key.child`.
            let named = [
                format!("`{key}`"),
                format!("{key}:"),
                format!(".{key}`"),
                format!("`{key}."),
            ]
            .iter()
            .any(|form| reference.contains(form.as_str()));
            if !named {
                missing.push(format!("{level}.{key}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/CONFIG.md does not name these keys the parser accepts: {missing:?}"
    );
}
