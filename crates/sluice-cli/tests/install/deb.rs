//! The Debian package: built by `scripts/package.sh --no-build` from the debug binary,
//! inspected, unpacked and run with its own config; and installed with dpkg into a Debian
//! container running systemd, where its unit runs, reloads and stops.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use sluice_testkit::{free_port, wait_until};

use crate::common::http_call;
use crate::container::{debian_image, podman, podman_run_limits};
use crate::{Scratch, root, run, stdout, tool};

/// `sluice --version`: `sluice 0.1.0 (commit <12 hex digits or unknown>, built <YYYY-MM-DD>)`.
pub(crate) fn assert_version_line(line: &str) {
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

pub(crate) fn status_json(admin: u16) -> Value {
    let (code, body) = http_call(admin, "GET", "/status.json", "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// `scripts/package.sh --no-build` in `dir`: the package of this test run's debug binary.
fn build_deb(dir: &Path) -> PathBuf {
    tool(
        "cargo-deb",
        "cargo install --locked cargo-deb (scripts/test.sh does)",
    );
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
    std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("a .deb in the output directory")
}

#[test]
fn the_debian_package_installs_its_files_runs_and_its_unit_verifies() {
    let scratch = Scratch::new("deb");
    let dir = &scratch.0;
    let deb = build_deb(dir);

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

/// A Debian container running systemd as its init, removed at the end.
struct SystemdContainer(String);

impl SystemdContainer {
    fn start(name: &str) -> Self {
        let image = debian_image(
            "localhost/sluice-test-systemd:bookworm",
            "minbase",
            "systemd,systemd-sysv,dbus,procps",
            r#"["/sbin/init"]"#,
        );
        let container = Self(name.to_owned());
        run(podman()
            .arg("run")
            .args(podman_run_limits())
            .args(["--detach", "--systemd=always", "--name", name])
            .arg(&image));
        let booted = wait_until(Duration::from_secs(60), || {
            let state = container.exec(&["systemctl", "is-system-running"]);
            let state = String::from_utf8_lossy(&state.stdout);
            matches!(state.trim(), "running" | "degraded")
        });
        assert!(booted, "systemd did not finish booting in the container");
        container
    }

    /// `podman exec` (its output, whatever the exit status).
    fn exec(&self, args: &[&str]) -> Output {
        podman()
            .arg("exec")
            .arg(&self.0)
            .args(args)
            .output()
            .unwrap()
    }

    /// `podman exec`, asserting success; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        stdout(podman().arg("exec").arg(&self.0).args(args))
    }

    fn unit(&self, property: &str) -> String {
        self.ok(&[
            "systemctl",
            "show",
            "sluice",
            "--value",
            "--property",
            property,
        ])
        .trim()
        .to_owned()
    }

    fn journal(&self) -> String {
        String::from_utf8_lossy(
            &self
                .exec(&["journalctl", "-u", "sluice", "--no-pager"])
                .stdout,
        )
        .into_owned()
    }
}

impl Drop for SystemdContainer {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time", "0", &self.0])
            .output();
    }
}

/// What a unit file cannot show offline: that the package installs on Debian with systemd
/// (its dependencies, the `sluice` user from sysusers, the unit enabled and started), that
/// the service runs under the unit's sandbox (its system-call filter, say) until it is ready,
/// reloads on `systemctl reload`, keeps an edited conffile and restarts on an upgrade, and
/// stops cleanly. Some of the sandbox needs namespaces a container does not grant
/// (`ProtectHostname` is skipped there, as systemd logs); the rest applies.
#[test]
fn the_debian_package_runs_under_systemd_reloads_upgrades_and_stops() {
    tool(
        "podman",
        "Debian's podman package, which scripts/test.sh installs",
    );
    let scratch = Scratch::new("deb-systemd");
    let deb = build_deb(&scratch.0);
    let systemd = SystemdContainer::start(&format!("sluice-test-systemd-{}", std::process::id()));
    run(podman()
        .arg("cp")
        .arg(&deb)
        .arg(format!("{}:/tmp/sluice.deb", systemd.0)));
    systemd.ok(&["dpkg", "--install", "/tmp/sluice.deb"]);
    assert!(systemd.ok(&["id", "sluice"]).contains("(sluice)"));
    let ready = wait_until(Duration::from_secs(20), || {
        systemd.exec(&["sluice", "probe"]).status.success()
    });
    assert!(ready, "not ready under systemd:\n{}", systemd.journal());
    assert_eq!(systemd.unit("ActiveState"), "active");
    assert_eq!(systemd.unit("UnitFileState"), "enabled");
    assert_eq!(systemd.unit("User"), "sluice");
    let owner = systemd.ok(&["stat", "--format", "%U %a", "/var/lib/sluice"]);
    assert_eq!(owner.trim(), "sluice 700");
    let status =
        || -> Value { serde_json::from_str(&systemd.ok(&["sluice", "status", "--json"])).unwrap() };
    let now = status();
    assert_version_line(&format!(
        "sluice {} (commit {}, built {})",
        now["version"].as_str().unwrap_or_default(),
        now["commit"].as_str().unwrap_or_default(),
        now["build_date"].as_str().unwrap_or_default()
    ));

    // `systemctl reload` is SIGHUP: the rules are reloaded in place.
    systemd.ok(&["systemctl", "reload", "sluice"]);
    assert!(
        wait_until(Duration::from_secs(10), || {
            let r = &status()["config"]["last_reload"];
            r["trigger"] == "SIGHUP" && r["ok"] == true
        }),
        "systemctl reload did not reload:\n{}",
        systemd.journal()
    );

    // An upgrade (here the same package again) keeps an edited conffile and restarts.
    let before = systemd.unit("MainPID");
    systemd.ok(&[
        "sh",
        "-c",
        "echo '# edited here' >> /etc/sluice/sluice.yaml",
    ]);
    systemd.ok(&["dpkg", "--force-confold", "--install", "/tmp/sluice.deb"]);
    assert!(
        systemd
            .ok(&["tail", "-n1", "/etc/sluice/sluice.yaml"])
            .contains("# edited here")
    );
    let restarted = wait_until(Duration::from_secs(20), || {
        systemd.unit("MainPID") != before && systemd.exec(&["sluice", "probe"]).status.success()
    });
    assert!(
        restarted,
        "not restarted by the upgrade:\n{}",
        systemd.journal()
    );
    assert_eq!(systemd.unit("NRestarts"), "0", "{}", systemd.journal());

    // A stop is SIGTERM: the last flush, a clean exit.
    systemd.ok(&["systemctl", "stop", "sluice"]);
    assert_eq!(systemd.unit("ActiveState"), "inactive");
    assert_eq!(systemd.unit("Result"), "success", "{}", systemd.journal());
    assert!(
        systemd.journal().contains("final flush done"),
        "{}",
        systemd.journal()
    );
}
