//! Test fixtures: real `redis-server` processes on free loopback ports, started and stopped by
//! the test that owns them. Nothing here talks to a server it did not start.
//!
//! ```no_run
//! let mut redis = sluice_testkit::RedisServer::start();
//! let url = redis.url();          // redis://127.0.0.1:<free port>/
//! redis.kill();                   // SIGKILL, as a crash would
//! redis.restart();                // same port, empty data
//! ```

pub mod conformance;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Where [`free_port`] looks: below Linux's ephemeral range (32768-60999), which the kernel
/// hands out both for `bind(0)` and for every outgoing connection's local port. A port taken
/// from that range could be taken again by any client's connection before the server that
/// was meant to listen on it binds it (seen: `bind: Address already in use` under load).
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A free TCP port on 127.0.0.1 outside the ephemeral range. Each process walks
/// [`TEST_PORTS`] from its own random start and never hands out a port twice, so parallel test
/// processes rarely meet; a port that does not bind is skipped.
pub fn free_port() -> u16 {
    use std::hash::BuildHasher as _;
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
    let span = u32::from(TEST_PORTS.end - TEST_PORTS.start);
    let next = NEXT.get_or_init(|| {
        let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        AtomicU32::new((random % u64::from(span)) as u32)
    });
    for _ in 0..span {
        let port = TEST_PORTS.start + (next.fetch_add(1, Ordering::Relaxed) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {TEST_PORTS:?}")
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
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::from("-ERR connection refused");
    };
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
    stream
        .write_all(format!("{command}\r\n").as_bytes())
        .expect("write to test redis");
    let mut buf = vec![0u8; 64 * 1024];
    let n = stream.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Like [`raw_command`], logging in with `password` first when there is one.
pub fn raw_command_as(port: u16, password: Option<&str>, command: &str) -> String {
    let Some(password) = password else {
        return raw_command(port, command);
    };
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::from("-ERR connection refused");
    };
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
    let mut ok = [0u8; 5];
    if stream
        .write_all(format!("AUTH {password}\r\n").as_bytes())
        .is_err()
        || stream.read_exact(&mut ok).is_err()
        || &ok != b"+OK\r\n"
    {
        return String::from("-ERR AUTH failed");
    }
    if stream
        .write_all(format!("{command}\r\n").as_bytes())
        .is_err()
    {
        return String::from("-ERR write failed");
    }
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
        let mut command = Command::new("redis-server");
        if self.tls {
            command
                .args(["--port", "0"])
                .args(tls_args(&self.dir, self.port));
        } else {
            command.args(["--port", &self.port.to_string()]);
        }
        let child = command
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
            // A TLS server cannot be pinged in plain text: listening is enough.
            let up = if self.tls {
                std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            } else {
                ping(self.port)
            };
            if up {
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

/// A CA (`ca.pem`) and a certificate for 127.0.0.1 signed by it (`cert.pem`, `key.pem`) in
/// `dir`, made by `openssl` (a self-signed server certificate is refused by webpki as a CA used
/// as an end entity).
pub fn make_certificates(dir: &std::path::Path) {
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n")
        .expect("write the certificate extensions");
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl is needed for the TLS fixture");
        assert!(status.success(), "openssl {args:?} failed");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=sluice-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "key.pem",
        "-out",
        "server.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        "-out",
        "cert.pem",
    ]);
}

/// The CA certificate (PEM) [`make_certificates`] wrote in `dir`.
fn ca_certificate(dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(dir.join("ca.pem")).expect("a TLS fixture has a CA certificate")
}

/// `redis-server` arguments for a TLS port with the certificates of [`make_certificates`]
/// (clients are not asked for certificates).
fn tls_args(dir: &std::path::Path, tls_port: u16) -> Vec<String> {
    let file = |name: &str| dir.join(name).display().to_string();
    vec![
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        file("cert.pem"),
        "--tls-key-file".into(),
        file("key.pem"),
        "--tls-ca-cert-file".into(),
        file("ca.pem"),
        "--tls-auth-clients".into(),
        "no".into(),
    ]
}

/// `127.0.0.1:<port>` for each port.
fn loopback(ports: &[u16]) -> Vec<String> {
    ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
}

/// Waits up to `timeout` for `condition`, polling every 50 ms.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let steps = (timeout.as_millis() / 50).max(1);
    for _ in 0..steps {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    condition()
}

fn spawn_redis<S: AsRef<std::ffi::OsStr>>(port: u16, dir: &std::path::Path, extra: &[S]) -> Child {
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
        TcpStream::connect(("127.0.0.1", port)).is_ok() && {
            let reply = raw_command(port, "PING");
            reply.starts_with("+PONG") || reply.starts_with("-NOAUTH")
        }
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

fn kill_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// A master, one replica and three Sentinels on free loopback ports, monitoring `mymaster`.
pub struct RedisSentinel {
    dir: PathBuf,
    /// Master and replica ports, in start order (the master first).
    pub data_ports: [u16; 2],
    /// Sentinel ports.
    pub sentinel_ports: [u16; 3],
    children: Vec<Option<Child>>,
    /// `requirepass` of the Sentinels, and of the master and replica.
    sentinel_password: Option<String>,
    data_password: Option<String>,
    /// With [`RedisSentinel::start_tls`]: the TLS ports of the master and replica, then of the
    /// three Sentinels (in the order of `data_ports` and `sentinel_ports`).
    pub tls_ports: Option<([u16; 2], [u16; 3])>,
}

impl RedisSentinel {
    /// The monitored master's name.
    pub const MASTER: &'static str = "mymaster";

    /// Starts the servers and waits until every Sentinel knows the master and its replica.
    pub fn start() -> Self {
        Self::start_with_passwords(None, None)
    }

    /// Like [`RedisSentinel::start`], with `requirepass` on the Sentinels and/or on the data
    /// nodes (the Sentinels then log in to each other and to the data nodes).
    pub fn start_with_passwords(sentinel: Option<&str>, data: Option<&str>) -> Self {
        Self::start_with(sentinel, data, false)
    }

    /// Like [`RedisSentinel::start`], with TLS everywhere the store goes: the master, the
    /// replica and the Sentinels each get a TLS port beside their plain one (the fixture's own
    /// commands use the plain ones), replication and the Sentinels' links run over TLS
    /// (`tls-replication`), and the Sentinels monitor and name the master by its TLS port.
    /// [`RedisSentinel::target`] names the Sentinels' TLS ports with TLS to both; clients must
    /// trust [`RedisSentinel::tls_certificate`] (the certificates of [`RedisServer::start_tls`]).
    pub fn start_tls() -> Self {
        Self::start_with(None, None, true)
    }

    fn start_with(sentinel: Option<&str>, data: Option<&str>, tls: bool) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "sluice-sentinel-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("create sentinel dir");
        let master = free_port();
        let replica = free_port();
        let tls_ports = tls.then(|| {
            make_certificates(&dir);
            (
                [free_port(), free_port()],
                [free_port(), free_port(), free_port()],
            )
        });
        // The port the master is monitored, replicated and named by.
        let master_announced = tls_ports.map_or(master, |(data, _)| data[0]);
        let mut common: Vec<String> = data.map_or_else(Vec::new, |p| {
            ["--requirepass", p, "--masterauth", p]
                .map(str::to_owned)
                .into()
        });
        if tls {
            common.extend(["--tls-replication", "yes"].map(str::to_owned));
        }
        let node_args = |i: usize| {
            let mut args = common.clone();
            if let Some((data, _)) = tls_ports {
                args.extend(tls_args(&dir, data[i]));
            }
            if i == 1 {
                args.extend([
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    master_announced.to_string(),
                ]);
            }
            args
        };
        let (master_args, replica_args) = (node_args(0), node_args(1));
        let mut children = vec![
            Some(spawn_redis(master, &dir.join("master"), &master_args)),
            Some(spawn_redis(replica, &dir.join("replica"), &replica_args)),
        ];
        let sentinel_ports = [free_port(), free_port(), free_port()];
        for (i, port) in sentinel_ports.into_iter().enumerate() {
            let sdir = dir.join(format!("sentinel-{port}"));
            std::fs::create_dir_all(&sdir).expect("create sentinel dir");
            let conf = sdir.join("sentinel.conf");
            let mut text = format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {} 127.0.0.1 {master_announced} 2\nsentinel down-after-milliseconds {m} 1000\nsentinel failover-timeout {m} 4000\nsentinel parallel-syncs {m} 1\n",
                sdir.display(),
                Self::MASTER,
                m = Self::MASTER
            );
            if let Some((_, sentinels)) = tls_ports {
                // The same settings as the data nodes' arguments, as configuration lines.
                for pair in tls_args(&dir, sentinels[i]).chunks(2) {
                    text.push_str(&format!("{} {}\n", &pair[0][2..], pair[1]));
                }
                text.push_str("tls-replication yes\n");
            }
            if let Some(p) = data {
                text.push_str(&format!("sentinel auth-pass {} {p}\n", Self::MASTER));
            }
            if let Some(p) = sentinel {
                text.push_str(&format!("requirepass {p}\nsentinel sentinel-pass {p}\n"));
            }
            std::fs::write(&conf, text).expect("write sentinel.conf");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server (sentinel mode) is not installed");
            children.push(Some(child));
            if !wait_until(Duration::from_secs(5), || {
                raw_command_as(port, sentinel, "PING").starts_with("+PONG")
            }) {
                children.iter_mut().for_each(kill_child);
                panic!("sentinel on {port} did not start");
            }
        }
        let setup = Self {
            dir,
            data_ports: [master, replica],
            sentinel_ports,
            children,
            sentinel_password: sentinel.map(str::to_owned),
            data_password: data.map(str::to_owned),
            tls_ports,
        };
        let replica_announced = setup.announced(replica);
        let ready = wait_until(Duration::from_secs(15), || {
            setup.sentinel_ports.iter().all(|&p| {
                setup
                    .sentinel_command(p, &format!("SENTINEL REPLICAS {}", Self::MASTER))
                    .contains(&replica_announced.to_string())
            }) && setup
                .data_command(replica, "INFO replication")
                .contains("master_link_status:up")
                // The replica acknowledges writes (Sluice waits for that on every flush).
                && setup.data_command(master, "SET sluice-fixture 1").starts_with("+OK")
                && setup.data_command(master, "WAIT 1 1000").starts_with(":1")
        });
        let _ = setup.data_command(master, "DEL sluice-fixture");
        assert!(ready, "sentinel setup did not become ready");
        setup
    }

    /// A command to one of the Sentinels (logged in when they have a password).
    pub fn sentinel_command(&self, port: u16, command: &str) -> String {
        raw_command_as(port, self.sentinel_password.as_deref(), command)
    }

    /// A command to the master or the replica (logged in when they have a password).
    pub fn data_command(&self, port: u16, command: &str) -> String {
        raw_command_as(port, self.data_password.as_deref(), command)
    }

    /// The port a data node is known by to the Sentinels and the store (its TLS port with TLS).
    fn announced(&self, data_port: u16) -> u16 {
        match self.tls_ports {
            Some((tls, _)) => tls[usize::from(data_port != self.data_ports[0])],
            None => data_port,
        }
    }

    /// The Sentinel ports the store is given (the TLS ones with TLS).
    fn store_sentinel_ports(&self) -> [u16; 3] {
        self.tls_ports.map_or(self.sentinel_ports, |(_, s)| s)
    }

    /// The certificate (PEM) of the CA that signed every node's certificate (TLS setups).
    pub fn tls_certificate(&self) -> Vec<u8> {
        ca_certificate(&self.dir)
    }

    /// The store target for this setup (db 0; the fixture's passwords, no ACL users; TLS to the
    /// data nodes and the Sentinels with [`RedisSentinel::start_tls`]).
    pub fn target(&self) -> sluice_store::RedisTarget {
        let tls = self.tls_ports.is_some();
        sluice_store::RedisTarget::Sentinel {
            sentinels: loopback(&self.store_sentinel_ports()),
            master: Self::MASTER.to_owned(),
            auth: self.data_password.clone().map(|p| (None, p)),
            db: 0,
            tls,
            sentinel_auth: self.sentinel_password.clone().map(|p| (None, p)),
            sentinel_tls: tls,
        }
    }

    /// The (plain) port of the server the Sentinels currently name as master.
    pub fn master_port(&self) -> Option<u16> {
        let reply = self.sentinel_command(
            self.sentinel_ports[0],
            &format!("SENTINEL GET-MASTER-ADDR-BY-NAME {}", Self::MASTER),
        );
        self.data_ports
            .into_iter()
            .find(|&p| reply.contains(&format!("\r\n{}\r\n", self.announced(p))))
    }

    /// Forces a failover and waits until the Sentinels name the other server as master and it
    /// accepts writes. Returns the new master's port.
    pub fn failover(&self) -> u16 {
        let old = self.master_port().expect("no master");
        let new = if old == self.data_ports[0] {
            self.data_ports[1]
        } else {
            self.data_ports[0]
        };
        let reply = self.sentinel_command(
            self.sentinel_ports[0],
            &format!("SENTINEL FAILOVER {}", Self::MASTER),
        );
        assert!(reply.starts_with("+OK"), "failover refused: {reply}");
        let done = wait_until(Duration::from_secs(20), || {
            self.master_port() == Some(new) && self.data_command(new, "ROLE").contains("master")
        });
        assert!(done, "failover did not complete");
        new
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for child in &mut self.children {
            kill_child(child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of three masters with one replica each, on free loopback ports.
pub struct RedisCluster {
    dir: PathBuf,
    /// All node ports (plain text; the fixture's own commands use them).
    pub ports: Vec<u16>,
    /// With [`RedisCluster::start_tls`]: each node's TLS port, in the order of `ports`.
    pub tls_ports: Option<Vec<u16>>,
    children: Vec<Option<Child>>,
}

impl RedisCluster {
    /// Starts six nodes, joins them with `redis-cli --cluster create`, waits for `cluster_state:ok`.
    /// A machine under load (a cold CI build running every test at once) can make one attempt
    /// fail; it is retried twice on fresh ports, and the last failure says what redis-cli said.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Like [`RedisCluster::start`], with TLS between the nodes (`tls-cluster`,
    /// `tls-replication`) and a TLS port on each node beside its plain one, with the
    /// certificates of [`RedisServer::start_tls`]. [`RedisCluster::target`] names the TLS
    /// ports, so the nodes announce their TLS ports to the store (`CLUSTER SLOTS`,
    /// redirections); clients must trust [`RedisCluster::tls_certificate`].
    pub fn start_tls() -> Self {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Self {
        let mut errors = Vec::new();
        for _ in 0..3 {
            match Self::try_start(tls) {
                Ok(cluster) => return cluster,
                Err(e) => errors.push(e),
            }
        }
        panic!(
            "could not start a Redis Cluster in 3 attempts:\n{}",
            errors.join("\n")
        );
    }

    fn try_start(tls: bool) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!(
            "sluice-cluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("create cluster dir");
        let ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
        // The cluster bus gets its own free port: the default (port + 10000) can be taken, or
        // above 65535 for an ephemeral port.
        let bus_ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
        let tls_ports: Option<Vec<u16>> = tls.then(|| {
            make_certificates(&dir);
            (0..6).map(|_| free_port()).collect()
        });
        let children = ports
            .iter()
            .zip(&bus_ports)
            .enumerate()
            .map(|(i, (&p, &bus))| {
                let mut args: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("nodes-{p}.conf"),
                    "--cluster-port",
                    &bus.to_string(),
                    "--cluster-node-timeout",
                    "1500",
                ]
                .map(str::to_owned)
                .into();
                if let Some(tls_ports) = &tls_ports {
                    args.extend(tls_args(&dir, tls_ports[i]));
                    args.extend(
                        ["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned),
                    );
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Some(spawn_redis(p, &dir.join(p.to_string()), &args))
            })
            .collect();
        // From here on, dropping `cluster` stops the nodes and removes the directory.
        let cluster = Self {
            dir,
            ports,
            tls_ports,
            children,
        };
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli is not installed: run the README test command, which installs it");
        if !output.status.success() {
            let said = String::from_utf8_lossy(&output.stdout);
            let tail: Vec<&str> = said.lines().rev().take(8).collect();
            return Err(format!(
                "redis-cli --cluster create failed ({}): {} {}",
                output.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | "),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        // Ready when every node sees a healthy cluster and every replica has synced (a replica
        // that never synced cannot take over from its master).
        let ok = wait_until(Duration::from_secs(30), || {
            cluster.ports.iter().all(|&p| {
                raw_command(p, "CLUSTER INFO").contains("cluster_state:ok") && {
                    let info = raw_command(p, "INFO replication");
                    info.contains("role:master") || info.contains("master_link_status:up")
                }
            }) && cluster.master_ports().len() == 3
        });
        if !ok {
            return Err("cluster did not reach cluster_state:ok with synced replicas".into());
        }
        Ok(cluster)
    }

    /// The store target for this cluster (no auth; the TLS ports with [`RedisCluster::start_tls`]).
    pub fn target(&self) -> sluice_store::RedisTarget {
        sluice_store::RedisTarget::Cluster {
            nodes: loopback(self.tls_ports.as_ref().unwrap_or(&self.ports)),
            auth: None,
            tls: self.tls_ports.is_some(),
        }
    }

    /// The certificate (PEM) of the CA that signed the nodes' certificate (TLS clusters).
    pub fn tls_certificate(&self) -> Vec<u8> {
        ca_certificate(&self.dir)
    }

    /// Ports of the current masters.
    pub fn master_ports(&self) -> Vec<u16> {
        self.ports
            .iter()
            .copied()
            .filter(|&p| {
                self.children[self.index(p)].is_some() && raw_command(p, "ROLE").contains("master")
            })
            .collect()
    }

    fn index(&self, port: u16) -> usize {
        self.ports
            .iter()
            .position(|&p| p == port)
            .expect("unknown port")
    }

    /// Kills the master on `port` and waits until its replica has taken over.
    pub fn kill_master_and_wait_failover(&mut self, port: u16) {
        let i = self.index(port);
        kill_child(&mut self.children[i]);
        let alive: Vec<u16> = self.ports.iter().copied().filter(|&p| p != port).collect();
        let ok = wait_until(Duration::from_secs(30), || {
            alive
                .iter()
                .all(|&p| raw_command(p, "CLUSTER INFO").contains("cluster_state:ok"))
                && self.master_ports().len() == 3
        });
        assert!(ok, "replica did not take over from {port}");
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            kill_child(child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
