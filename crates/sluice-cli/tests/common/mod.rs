//! `sluice serve` processes for tests, and a minimal HTTP client.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_testkit::{free_port, wait_until};

fn spawn(dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(dir.join("sluice.yaml"))
        .env(
            "RUST_LOG",
            std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(
            if std::env::var("SLUICE_TEST_LOG").is_ok()
                && std::env::var_os("SLUICE_KEEP_LOGS").is_none()
            {
                Stdio::inherit()
            } else {
                // Kept (appended across restarts) so a failing test can show what the server
                // said; with `SLUICE_KEEP_LOGS`, each server's log stays in its directory.
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join("serve.log"))
                    .map_or_else(|_| Stdio::null(), Stdio::from)
            },
        )
        .spawn()
        .expect("start sluice serve")
}

pub struct Serve {
    child: Child,
    dir: PathBuf,
    pub http: u16,
    pub grpc: u16,
    pub admin: u16,
}

impl Serve {
    pub fn start(name: &str, store: &str, rules: &[(&str, &str)]) -> Self {
        Self::start_with(name, store, rules, "")
    }

    /// Like [`Serve::start`], with more `sluice.yaml` text appended (e.g. a `gateways:` section).
    pub fn start_with(name: &str, store: &str, rules: &[(&str, &str)], extra: &str) -> Self {
        let serve = Self::spawn_with(name, store, rules, extra);
        serve.wait_healthy();
        serve
    }

    /// Like [`Serve::start_with`], without waiting for a plain-HTTP `/healthz` (for listeners
    /// that speak TLS, say): the caller waits its own way.
    pub fn spawn_with(name: &str, store: &str, rules: &[(&str, &str)], extra: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "sluice-serve-{name}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(dir.join("rules")).unwrap();
        for (file, text) in rules {
            std::fs::write(dir.join("rules").join(file), text).unwrap();
        }
        let (http, grpc, admin) = (free_port(), free_port(), free_port());
        let api = if rules.iter().any(|(f, _)| *f == "api.yaml") {
            "api:\n  domain: api\n"
        } else {
            ""
        };
        std::fs::write(
            dir.join("sluice.yaml"),
            format!(
                "store: {store}\nlisten:\n  http: 127.0.0.1:{http}\n  grpc: 127.0.0.1:{grpc}\n  admin: 127.0.0.1:{admin}\nrules: [rules/]\n{api}{extra}"
            ),
        )
        .unwrap();
        let child = spawn(&dir);
        Self {
            child,
            dir,
            http,
            grpc,
            admin,
        }
    }

    fn wait_healthy(&self) {
        assert!(
            wait_until(Duration::from_secs(10), || http_call(
                self.admin, "GET", "/healthz", ""
            )
            .0 == 200),
            "sluice serve did not come up; its log:\n{}",
            self.log_tail()
        );
    }

    /// Kills the process (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again with the same config and ports.
    pub fn restart(&mut self) {
        self.kill();
        self.child = spawn(&self.dir);
        self.wait_healthy();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines the server logged (warnings and errors unless `SLUICE_TEST_LOG` is set),
    /// for a failing assertion's message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The directory holding its `sluice.yaml` (and its log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn rules_dir(&self) -> PathBuf {
        self.dir.join("rules")
    }

    pub async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc))
            .await
            .expect("grpc connect")
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let mut status = None;
        wait_until(Duration::from_secs(10), || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        status.expect("sluice serve did not stop on SIGTERM")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // `SLUICE_KEEP_LOGS` keeps the directory (its config, rules and logs) for a look after.
        if std::env::var_os("SLUICE_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A minimal HTTP/1.1 exchange: returns (status, body).
pub fn http_call(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

/// An upstream that answers 200 to everything (echoing the `X-Forwarded-For` it got) and
/// counts requests.
pub fn upstream() -> (u16, Arc<AtomicU64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicU64::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = [0u8; 16384];
                let mut pending = Vec::new();
                loop {
                    let n = match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    pending.extend_from_slice(&buf[..n]);
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&pending[..end]).to_string();
                        pending.drain(..end + 4);
                        counter.fetch_add(1, Ordering::Relaxed);
                        let xff = head
                            .lines()
                            .find(|l| l.to_ascii_lowercase().starts_with("x-forwarded-for:"))
                            .unwrap_or("")
                            .to_owned();
                        let body = format!("ok {xff}");
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n{body}",
                            body.len()
                        );
                        if stream.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (port, hits)
}

/// Sleeps until 20 ms past the next boundary of `window` on the system clock (the servers'
/// clock; this machine's Redis has the same time), and returns a counter of the servers'
/// windows since then (0 for the one that just began). Tests tally admissions by it, not by
/// time from their own start: a loaded machine that wakes a test late would otherwise count the
/// next window's first admissions in the current one.
pub async fn align_to_window(window: Duration) -> impl Fn() -> usize {
    let clock = sluice_core::SystemClock::new();
    let window_ns = window.as_nanos() as u64;
    let now = sluice_core::Clock::now(&clock);
    tokio::time::sleep(Duration::from_nanos(
        window_ns - now % window_ns + 20_000_000,
    ))
    .await;
    let first = sluice_core::Clock::now(&clock) / window_ns;
    move || (sluice_core::Clock::now(&clock) / window_ns - first) as usize
}

/// An Envoy RLS request for `domain` with these descriptors and request-level `hits`.
pub fn request(
    domain: &str,
    descriptors: &[&[(&str, &str)]],
    hits: u32,
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry {
                        key: (*k).to_owned(),
                        value: (*v).to_owned(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

/// Names of a process's threads that start with `prefix`, sorted (Linux:
/// `/proc/<pid>/task/*/comm`).
pub fn threads(pid: u32, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// Runs `sluice serve --config config` to its end (a start that must fail) and returns its
/// output.
pub fn serve_to_end(config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(config)
        .env("RUST_LOG", "error")
        .output()
        .expect("run a second sluice serve")
}
