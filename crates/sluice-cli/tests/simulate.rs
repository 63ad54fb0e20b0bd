//! `sluice simulate`: table, summary.json and plots from a shipped scenario; clear errors.

use std::path::Path;
use std::process::Command;

#[test]
fn simulate_writes_the_table_the_summary_and_the_plots() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("sluice-simulate-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("simulate")
        .arg(root.join("examples/scenarios/seed.yaml"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8(run.stdout).unwrap();
    for policy in [
        "reactive",
        "predictive",
        "predictive_sliding",
        "exact",
        "split",
    ] {
        assert!(stdout.contains(policy), "{stdout}");
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["limit"], 300);
    assert_eq!(summary["policies"].as_array().unwrap().len(), 5);
    for plot in ["admitted", "over_admission", "estimates", "instances"] {
        for ext in ["svg", "png"] {
            let file = out.join(format!("{plot}.{ext}"));
            assert!(
                std::fs::metadata(&file).unwrap().len() > 1000,
                "{}",
                file.display()
            );
            assert!(stdout.contains(&format!("{plot}.{ext}")), "{stdout}");
        }
    }
    let markdown = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("simulate")
        .arg(root.join("examples/scenarios/seed.yaml"))
        .arg("--out")
        .arg(&out)
        .arg("--markdown")
        .output()
        .unwrap();
    assert!(
        String::from_utf8(markdown.stdout)
            .unwrap()
            .contains("| predictive |")
    );
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn a_bad_scenario_is_named_with_its_line_and_column() {
    let dir = std::env::temp_dir().join(format!("sluice-simulate-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "duration_s: 60\nseed: 1\nrule: { limit: 10, window_s: 10 }\nnodes: { count: 2 }\ntraffic:\n  - steady: { rate: 1, weights: [1] }\n",
    )
    .unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("simulate")
        .arg(&file)
        .arg("--out")
        .arg(dir.join("out"))
        .output()
        .unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8(run.stderr).unwrap();
    assert!(stderr.contains("bad.yaml:6:"), "{stderr}");
    assert!(stderr.contains("one weight >= 0 per node"), "{stderr}");
    assert!(
        !dir.join("out").exists(),
        "nothing written for a bad scenario"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn policies_on_the_command_line_replace_the_scenarios() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("sluice-simulate-p-{}", std::process::id()));
    let simulate = |policies: &str| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("simulate")
            .arg(root.join("examples/scenarios/seed.yaml"))
            .arg("--out")
            .arg(&out)
            .args(["--markdown", "--policies", policies])
            .output()
            .unwrap()
    };
    let run = simulate("predictive,rlqs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let rows: Vec<String> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("| ")?.split(' ').next().map(str::to_owned))
        .filter(|p| p != "policy")
        .collect();
    assert_eq!(rows, ["predictive", "rlqs"]);
    let bad = simulate("predictive,rlq");
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("unknown policy `rlq`"), "{stderr}");
    // A scenario whose requests carry a tenant cannot run as Envoys' buckets.
    let tenants = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("simulate")
        .arg(root.join("examples/scenarios/mix/short.yaml"))
        .arg("--out")
        .arg(&out)
        .args(["--policies", "rlqs"])
        .output()
        .unwrap();
    assert!(!tenants.status.success());
    let stderr = String::from_utf8_lossy(&tenants.stderr);
    assert!(
        stderr.contains("short.yaml: the rlqs policy does not run `tenant` traffic"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn seeds_give_the_spread_of_every_class_over_the_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("sluice-simulate-seeds-{}", std::process::id()));
    let simulate = |seeds: &str| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("simulate")
            .arg(root.join("examples/scenarios/mix/short.yaml"))
            .args(["--policies", "predictive,exact", "--seeds", seeds, "--out"])
            .arg(&out)
            .output()
            .unwrap()
    };
    let run = simulate("3-5");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8(run.stdout).unwrap();
    assert!(stdout.contains("| predictive | bursty |"), "{stdout}");
    assert!(
        stdout.contains("| exact | bursty | 3 | 0.0 / 0.0 / 0.0%"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("seeds.json")).unwrap()).unwrap();
    assert_eq!(report["seeds"], serde_json::json!([3, 5]));
    let spreads = report["spreads"].as_array().unwrap();
    assert!(spreads.iter().all(|s| s["runs"] == 3), "{spreads:?}");
    let seed = spreads[0]["worst_over_max_seed"].as_u64().unwrap();
    assert!((3..=5).contains(&seed), "{spreads:?}");
    for (bad, says) in [
        ("5-2", "2 is before 5 in `5-2`"),
        ("x", "`x` is not a seed N or a range FIRST-LAST"),
        ("1-x", "`x` in `1-x` is not a whole number"),
        ("1-20000", "more than 10,000 seeds"),
    ] {
        let run = simulate(bad);
        assert!(!run.status.success());
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(stderr.contains(says), "{bad}: {stderr}");
    }
    // One seed: that draw's table.
    let one = simulate("4");
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("seeds.json")).unwrap()).unwrap();
    assert_eq!(report["seeds"], serde_json::json!([4, 4]));
    std::fs::remove_dir_all(&out).unwrap();
}
