//! Envoy ratelimit's configuration language, feature by feature (`tests/envoy-compat/`): every
//! valid file loads unchanged, every invalid one is rejected with exactly its `# expect:`
//! message, in Sluice's file:line:column words.

use std::path::{Path, PathBuf};

fn files(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/envoy-compat")
        .join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_valid_file_loads() {
    let valid = files("valid");
    assert!(valid.len() >= 13);
    for file in valid {
        if let Err(e) = sluice_config::load(&file) {
            panic!("{} is rejected: {e}", file.display());
        }
    }
}

#[test]
fn every_invalid_file_gets_its_message() {
    let invalid = files("invalid");
    assert!(invalid.len() >= 14);
    let dir = invalid[0].parent().unwrap().display().to_string();
    let mut failures = Vec::new();
    for file in &invalid {
        let text = std::fs::read_to_string(file).unwrap();
        let expected = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} has no `# expect:` line", file.display()))
            .replace("{dir}", &dir);
        match sluice_config::load(file) {
            Ok(_) => failures.push(format!("{}: accepted", file.display())),
            Err(e) if e.to_string() != expected => {
                failures.push(format!("expected: {expected}\nactual:   {e}"));
            }
            Err(e) => {
                // Never a Rust type name or serde's wording.
                let e = e.to_string();
                assert!(!e.contains("Option<") && !e.contains("deserialize"), "{e}");
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
