//! `sluice check` warnings: every file in `tests/warn/` loads and gets exactly the warnings
//! written on its `# warn: ...` lines (`{dir}` stands for the fixture directory), in order;
//! the shipped examples get none.

use std::path::Path;

#[test]
fn each_fixture_gets_exactly_its_warnings() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/warn");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "only {} fixtures", files.len());
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let expected: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# warn: "))
            .map(|l| l.replace("{dir}", &dir.display().to_string()))
            .collect();
        let config = sluice_config::load(file)
            .unwrap_or_else(|e| panic!("{} does not load: {e}", file.display()));
        let actual: Vec<String> = sluice_config::warnings(&config)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(actual, expected, "{}", file.display());
    }
}

#[test]
fn the_shipped_examples_have_no_warnings() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut configs = vec![root.join("sluice.yaml")];
    for dir in ["rules", "gateway"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                configs.push(path);
            }
        }
    }
    for config in configs {
        let loaded = sluice_config::load(&config).unwrap();
        let warnings = sluice_config::warnings(&loaded);
        assert!(
            warnings.is_empty(),
            "{}: {}",
            config.display(),
            warnings
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
