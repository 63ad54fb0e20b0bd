//! The docs cannot rot:
//!
//! - docs/GETTING-STARTED.md runs as written: every `sh` block in order in one bash (with
//!   `set -euo pipefail`), in a scratch directory beside a link to `examples/`, with the built
//!   `sluice` and the test Envoy on `PATH`; a `text` block right under an `sh` block is what
//!   that block must print. Blocks that start with `# Install` are skipped (the binary is
//!   already built, Envoy already installed).
//! - Every YAML block of README.md and docs/ that is a rule file, a `sluice.yaml` naming no rule
//!   files, or a simulator scenario loads with the real parsers.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One fenced block: its info string and its text.
struct Block {
    info: String,
    text: String,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut current: Option<Block> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    current = Some(Block {
                        info: info.trim().to_owned(),
                        text: String::new(),
                    });
                }
            }
            Some(block) => {
                if line.trim_start() == "```" {
                    out.extend(current.take());
                } else {
                    block.text.push_str(line);
                    block.text.push('\n');
                }
            }
        }
    }
    out
}

/// The `sh` blocks to run, each with the output it must print (if the page gives one).
fn steps(markdown: &str) -> Vec<(String, Option<String>)> {
    let all = blocks(markdown);
    let mut steps = Vec::new();
    for (i, b) in all.iter().enumerate() {
        if b.info != "sh" || b.text.starts_with("# Install") {
            continue;
        }
        let expected = all
            .get(i + 1)
            .filter(|next| next.info == "text")
            .map(|next| next.text.clone());
        steps.push((b.text.clone(), expected));
    }
    steps
}

#[test]
fn getting_started_runs_as_written() {
    let page = std::fs::read_to_string(root().join("docs/GETTING-STARTED.md")).unwrap();
    let steps = steps(&page);
    assert!(steps.len() >= 5, "only {} steps", steps.len());
    // The page uses the documented ports; a server of the machine on one of them would answer
    // in Sluice's place, so say so rather than test something else.
    for port in [
        3000, 6400, 8000, 8080, 8081, 9090, 10000, 8110, 8111, 9110, 8120, 8121, 9120, 8130, 8131,
        9130,
    ] {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port} is in use on this machine; docs/GETTING-STARTED.md needs it free"
        );
    }
    // The page's limits are per minute, and minutes start on the clock's :00: a step whose
    // requests straddle one sees a fresh window (a 200 where the page shows a 429). Such a run
    // says nothing of the page, so it runs once more (the second run is a few seconds long and
    // starts right after a minute began).
    let mut run = run_page(&steps);
    if !run.passed(&steps) && run.crossed_a_minute() {
        eprintln!("the run crossed a minute boundary; running the page again");
        run = run_page(&steps);
    }
    run.assert_as_written(&steps);
}

/// One run of the page's steps, as a script in a scratch directory.
struct PageRun {
    dir: PathBuf,
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
    printed: Vec<String>,
    started: std::time::SystemTime,
    ended: std::time::SystemTime,
}

#[expect(
    clippy::disallowed_methods,
    reason = "the page's windows start on the wall clock's minutes"
)]
fn run_page(steps: &[(String, Option<String>)]) -> PageRun {
    let started = std::time::SystemTime::now();
    let dir = std::env::temp_dir().join(format!("sluice-docs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(root().join("examples"), dir.join("examples")).unwrap();
    let mut script =
        String::from("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n");
    for (i, (text, _)) in steps.iter().enumerate() {
        script.push_str(text);
        script.push_str(&format!("echo '@@@ step {i} done'\n"));
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_sluice"));
    let envoy = root().join("target/envoy-venv/bin");
    let path = format!(
        "{}:{}:{}",
        bin.parent().unwrap().display(),
        envoy.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(&dir)
        .env("PATH", path)
        .env("HOME", &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    // Bounded: the whole page takes a few seconds; a hang is killed with its process group.
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        let _ = Command::new("kill")
            .args(["-9", &format!("-{pid}")])
            .status();
    });
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    drop(watchdog);
    let mut printed = Vec::new();
    let mut rest = stdout.as_str();
    for i in 0..steps.len() {
        let marker = format!("@@@ step {i} done\n");
        match rest.find(&marker) {
            Some(at) => {
                printed.push(rest[..at].to_owned());
                rest = &rest[at + marker.len()..];
            }
            None => break,
        }
    }
    eprintln!("{stdout}");
    PageRun {
        dir,
        status,
        stdout,
        stderr,
        printed,
        started,
        ended: std::time::SystemTime::now(),
    }
}

impl PageRun {
    fn passed(&self, steps: &[(String, Option<String>)]) -> bool {
        self.status.success()
            && self.printed.len() == steps.len()
            && steps.iter().zip(&self.printed).all(|((_, expected), got)| {
                expected
                    .as_ref()
                    .is_none_or(|e| got.trim_end() == e.trim_end())
            })
    }

    fn crossed_a_minute(&self) -> bool {
        let minute = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 60
        };
        minute(self.started) != minute(self.ended)
    }

    fn assert_as_written(&self, steps: &[(String, Option<String>)]) {
        let (stdout, stderr, status) = (&self.stdout, &self.stderr, self.status);
        let log = |name: &str| std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        assert!(
            status.success() && self.printed.len() == steps.len(),
            "the page stopped in step {} ({status}):\n{}\nstdout:\n{stdout}\nstderr:\n{stderr}\nserve.log:\n{}",
            self.printed.len(),
            steps[self.printed.len().min(steps.len() - 1)].0,
            log("serve.log")
        );
        for ((text, expected), got) in steps.iter().zip(&self.printed) {
            if let Some(expected) = expected {
                assert_eq!(
                    got.trim_end(),
                    expected.trim_end(),
                    "the output of:\n{text}"
                );
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How a `sluice.yaml` (or a part of one) in the docs starts.
const SERVICE_KEYS: [&str; 8] = [
    "store:",
    "listen:",
    "gateways:",
    "listeners:",
    "access:",
    "exact:",
    "defaults:",
    "headers:",
];

#[test]
fn every_rule_file_and_scenario_in_the_docs_loads() {
    let mut pages = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for block in blocks(&text).iter().filter(|b| b.info == "yaml") {
            let first = block
                .text
                .lines()
                .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                .unwrap_or("");
            if first.starts_with("domain:") {
                if let Err(e) = sluice_config::parse_domain(Path::new("doc.yaml"), &block.text) {
                    panic!(
                        "{}: a rule file does not load: {e}\n{}",
                        page.display(),
                        block.text
                    );
                }
                checked += 1;
            } else if SERVICE_KEYS.iter().any(|k| first.starts_with(k))
                && !block.text.lines().any(|l| l.starts_with("rules:"))
            {
                // A sluice.yaml (or a part of one) that names no rule files.
                if let Err(e) = sluice_config::parse_service(Path::new("sluice.yaml"), &block.text)
                {
                    panic!(
                        "{}: a sluice.yaml does not load: {e}\n{}",
                        page.display(),
                        block.text
                    );
                }
                checked += 1;
            } else if first.starts_with("duration_s:") {
                if let Err(e) = sluice_sim::Scenario::parse("doc.yaml", &block.text) {
                    panic!(
                        "{}: a scenario does not load: {e}\n{}",
                        page.display(),
                        block.text
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 3, "only {checked} blocks checked");
}

/// Every `.rs` file under `dir`, read.
fn sources(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.ends_with("target") {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            out.push((path, text));
        }
    }
}

/// docs/THREATS.md: every row names a test, and every test, fuzz target, script or module it
/// names exists, so a renamed or deleted test cannot leave a threat looking defended.
#[test]
fn every_threat_names_tests_that_exist() {
    let threats = std::fs::read_to_string(root().join("docs/THREATS.md")).unwrap();
    let mut code = Vec::new();
    sources(&root().join("crates"), &mut code);
    sources(&root().join("fuzz/fuzz_targets"), &mut code);
    let exists = |name: &str| {
        if name.starts_with("scripts/") {
            return root().join(name).exists();
        }
        code.iter().any(|(path, text)| {
            text.contains(&format!("fn {name}(")) || path.file_stem().is_some_and(|s| s == name)
        })
    };
    let mut rows = 0;
    for line in threats.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 || cells[1] == "attacker" || cells[1].starts_with("---") {
            continue;
        }
        rows += 1;
        let test = cells[cells.len() - 2];
        let names: Vec<&str> = test.split('`').skip(1).step_by(2).collect();
        assert!(!names.is_empty(), "a threat without a test: {line}");
        for name in names {
            let last = name.rsplit("::").next().unwrap_or(name);
            if last == "*"
                || last == "tests"
                || last.contains("...")
                || last.contains('.') && !name.starts_with("scripts/")
            {
                continue;
            }
            assert!(
                exists(if name.starts_with("scripts/") {
                    name
                } else {
                    last
                }),
                "docs/THREATS.md names `{name}`, which does not exist: {line}"
            );
        }
    }
    assert!(rows >= 30, "only {rows} rows read");
}
