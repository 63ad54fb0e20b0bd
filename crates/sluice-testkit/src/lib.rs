//! Test fixtures: real `redis-server` processes on free loopback ports, started and stopped by
//! the test that owns them. Nothing here talks to a server it did not start.
//!
//! ```no_run
//! let mut redis = sluice_testkit::RedisServer::start();
//! let url = redis.url();          // redis://127.0.0.1:<free port>/
//! redis.kill();                   // SIGKILL, as a crash would
//! redis.restart();                // same port, empty data
//! ```

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A free TCP port on 127.0.0.1 (bound and released; the kernel does not reuse it at once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port on 127.0.0.1")
}

/// Whether `redis-server` is installed (the README's test command installs it when missing).
pub fn redis_available() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Sends `PING` and waits for `+PONG`.
pub fn ping(port: u16) -> bool {
    let Ok(mut stream) =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// Sends one inline command and returns the raw reply (for assertions in tests).
pub fn raw_command(port: u16, command: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to test redis");
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
    stream
        .write_all(format!("{command}\r\n").as_bytes())
        .expect("write to test redis");
    let mut buf = vec![0u8; 64 * 1024];
    let n = stream.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// A `redis-server` started on a free loopback port, with persistence off, killed on drop.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    persistent: bool,
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Starts a server that writes every command to an append-only file (`appendfsync
    /// always`), so a restart after [`RedisServer::kill`] keeps every acknowledged write, as a
    /// production master with AOF would.
    pub fn start_persistent() -> Self {
        Self::start_with(true)
    }

    fn start_with(persistent: bool) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("sluice-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create redis dir");
        let mut server = Self {
            port,
            dir,
            child: None,
            persistent,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", if self.persistent { "yes" } else { "no" }])
            .args(["--appendfsync", "always"])
            .args(["--dir", &self.dir.display().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "redis-server is not installed: run the README test command, which installs it",
            );
        self.child = Some(child);
        for _ in 0..200 {
            if ping(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "redis-server on port {} did not answer PING within 2 s",
            self.port
        );
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server with SIGKILL and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (with no data unless started persistent).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs one command (inline protocol) and returns the raw reply.
    pub fn command(&self, command: &str) -> String {
        raw_command(self.port, command)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
