//! Starting and stopping `redis-server` processes.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::ports::wait_until;
use crate::resp::raw_command;

/// Whether `redis-server` is installed (the README's test command installs it when missing).
pub fn redis_available() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// When a started server counts as up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ready {
    /// It answers `PING` in plain text (with `PONG`, or with a demand to log in).
    Answering,
    /// It accepts connections (a TLS-only server).
    Listening,
}

/// Starts `redis-server` on `port` with its files in `dir`, persistence off unless `extra`
/// turns it on (later arguments win), and waits until it is `ready`.
pub(crate) fn spawn_redis<S: AsRef<std::ffi::OsStr>>(
    port: u16,
    dir: &std::path::Path,
    extra: &[S],
    ready: Ready,
) -> Child {
    std::fs::create_dir_all(dir).expect("create redis dir");
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--dir", &dir.display().to_string()])
        // Replicas sync at once instead of after the default 5 s diskless-sync delay.
        .args(["--repl-diskless-sync-delay", "0"])
        .args(extra)
        .args(["--logfile", "redis.log"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is not installed: run the README test command, which installs it");
    // Up when it answers, with PONG or (with `requirepass`) a demand to log in.
    let up = wait_until(Duration::from_secs(5), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
            && (ready == Ready::Listening || {
                let reply = raw_command(port, "PING");
                reply.starts_with("+PONG") || reply.starts_with("-NOAUTH")
            })
    });
    if !up {
        // Not left running behind a failed test.
        let mut child = Some(child);
        kill_child(&mut child);
        let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        panic!("redis on {port} did not start; its log ends: {tail:?}");
    }
    child
}

pub(crate) fn kill_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}
