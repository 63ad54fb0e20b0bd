//! The ways in of docs/INSTALL.md, each checked here with the debug binary this test run
//! built (no release build):
//!
//! - `deb.rs`: the Debian package, built by `scripts/package.sh --no-build` with cargo-deb,
//!   inspected (metadata, files, conffiles, maintainer scripts), unpacked into a temporary
//!   root and run with its own config until `/readyz` answers, its unit checked by
//!   `systemd-analyze verify` and `security`; then installed with dpkg in a Debian container
//!   running systemd, where the unit starts, reloads, survives an upgrade and stops.
//! - `container.rs`: the Containerfile linted by hadolint, built by podman on a Debian base made
//!   by mmdebstrap, and run read-only with its config from a mounted directory.
//! - `kubernetes.rs`: the manifests rendered by `kubectl kustomize` and validated against
//!   Kubernetes' schemas by kubernetes-validate, offline; their Sluice config loaded by `sluice
//!   check`, their Envoy configs (and the Istio EnvoyFilter's patches) by `envoy --mode
//!   validate`; and the ConfigMap's rules, swapped in as the kubelet updates a volume, reloaded
//!   by a running `sluice serve`.
//!
//! scripts/test.sh installs every tool; the helpers the files share are here.

#[path = "../common/mod.rs"]
mod common;
mod container;
mod deb;
mod kubernetes;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A directory of its own under the system's temporary directory, removed at the end.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new(name: &str) -> Self {
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
pub(crate) fn run(cmd: &mut Command) -> Output {
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

pub(crate) fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run(cmd).stdout).into_owned()
}

/// A tool the test needs, with what installs it (for the message when it is missing).
pub(crate) fn tool(path: &str, installed_by: &str) -> PathBuf {
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
    found.unwrap_or_else(|| panic!("{path} is missing: {installed_by}"))
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
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
