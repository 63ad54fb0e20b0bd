//! One `redis-server`: plain, TLS, or writing every command to disk.

use std::path::PathBuf;
use std::process::{Child, Command};

use crate::ports::free_port;
use crate::process::{Ready, spawn_redis};
use crate::resp::raw_command;
use crate::tls::{ca_certificate, make_certificates, tls_args};

/// A `redis-server` started on a free loopback port, with persistence off, killed on drop.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    persistent: bool,
    tls: bool,
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

    /// Starts a server that speaks only TLS on its port, with a certificate for 127.0.0.1
    /// signed by a CA made by `openssl` for this server (clients are not asked for
    /// certificates). Its
    /// [`RedisServer::url`] is `rediss://127.0.0.1:<port>/`; clients must trust
    /// [`RedisServer::tls_certificate`].
    pub fn start_tls() -> Self {
        let mut server = Self::new(false, true);
        make_certificates(&server.dir);
        server.spawn();
        server
    }

    fn start_with(persistent: bool) -> Self {
        let mut server = Self::new(persistent, false);
        server.spawn();
        server
    }

    fn new(persistent: bool, tls: bool) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("sluice-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create redis dir");
        Self {
            port,
            dir,
            child: None,
            persistent,
            tls,
        }
    }

    fn spawn(&mut self) {
        let mut args: Vec<String> = Vec::new();
        if self.tls {
            // The TLS port only: a plain `--port 0` listens on nothing.
            args.extend(["--port".into(), "0".into()]);
            args.extend(tls_args(&self.dir, self.port));
        }
        if self.persistent {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"].map(String::from));
        }
        // A TLS server cannot be pinged in plain text: listening is enough.
        let ready = if self.tls {
            Ready::Listening
        } else {
            Ready::Answering
        };
        self.child = Some(spawn_redis(self.port, &self.dir, &args, ready));
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The certificate (PEM) of the CA that signed the TLS server's certificate, to trust as
    /// a root.
    pub fn tls_certificate(&self) -> Vec<u8> {
        ca_certificate(&self.dir)
    }

    /// `redis://127.0.0.1:<port>/` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        if self.tls {
            format!("rediss://127.0.0.1:{}/", self.port)
        } else {
            format!("redis://127.0.0.1:{}/", self.port)
        }
    }

    /// Kills the server with SIGKILL and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server's process (SIGSTOP): its connections stay open and take commands, but
    /// nothing is run or answered until [`RedisServer::resume`]; a client's call times out
    /// with its request sent.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server run again (SIGCONT): it runs what it was sent meanwhile.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the server is not running");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {} failed", child.id());
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
