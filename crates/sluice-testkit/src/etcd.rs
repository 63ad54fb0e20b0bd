//! Real `etcd` servers on free loopback ports: one member, or a cluster of several, plain or
//! TLS, optionally with authentication on. Killed on drop; their data lives in a temporary
//! directory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::ports::{free_port, wait_until};
use crate::tls::{ca_certificate, make_certificates};

/// One member of an [`EtcdCluster`].
struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// An etcd cluster of one or more members started here.
pub struct EtcdCluster {
    dir: PathBuf,
    members: Vec<Member>,
    tls: bool,
    /// `root`'s password once [`EtcdCluster::enable_auth`] ran.
    root_password: Option<String>,
    /// More `etcd` arguments for every member.
    extra: Vec<String>,
}

/// Whether `etcd` is installed (the README's test command installs Debian's `etcd-server`).
pub fn etcd_available() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl EtcdCluster {
    /// One plain-text member.
    pub fn start() -> Self {
        Self::start_with(1, false)
    }

    /// `members` plain-text members forming one cluster.
    pub fn start_cluster(members: usize) -> Self {
        Self::start_with(members, false)
    }

    /// One member that speaks only TLS to clients, with a certificate for 127.0.0.1 signed by
    /// a CA made for it ([`EtcdCluster::tls_certificate`]).
    pub fn start_tls() -> Self {
        Self::start_with(1, true)
    }

    /// One plain-text member whose login tokens expire after `secs` seconds unused (etcd's
    /// `--auth-token-ttl`, 300 by default).
    pub fn start_with_token_ttl(secs: u32) -> Self {
        Self::start_full(1, false, vec!["--auth-token-ttl".into(), secs.to_string()])
    }

    fn start_with(count: usize, tls: bool) -> Self {
        Self::start_full(count, tls, Vec::new())
    }

    fn start_full(count: usize, tls: bool, extra: Vec<String>) -> Self {
        let first = free_port();
        let dir = std::env::temp_dir().join(format!("sluice-etcd-{}-{first}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create etcd dir");
        if tls {
            make_certificates(&dir);
        }
        let members = (0..count)
            .map(|i| Member {
                name: format!("m{i}"),
                client: if i == 0 { first } else { free_port() },
                peer: free_port(),
                child: None,
            })
            .collect();
        let mut cluster = Self {
            dir,
            members,
            tls,
            root_password: None,
            extra,
        };
        for i in 0..count {
            cluster.spawn(i);
        }
        cluster.wait_healthy();
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let scheme = if self.tls { "https" } else { "http" };
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect();
        let member = &self.members[i];
        let data = self.dir.join(&member.name);
        let client_url = format!("{scheme}://127.0.0.1:{}", member.client);
        let peer_url = format!("http://127.0.0.1:{}", member.peer);
        let log = std::fs::File::create(self.dir.join(format!("{}.log", member.name)))
            .expect("create etcd log");
        let mut command = Command::new("etcd");
        command
            .args(["--name", &member.name])
            .args(["--data-dir", &data.display().to_string()])
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "sluice-test"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(&self.extra);
        if self.tls {
            let file = |name: &str| self.dir.join(name).display().to_string();
            command
                .args(["--cert-file", &file("cert.pem")])
                .args(["--key-file", &file("key.pem")]);
        }
        let child = command.stdout(Stdio::null()).stderr(log).spawn().expect(
            "etcd is not installed: run the README test command, which installs etcd-server",
        );
        self.members[i].child = Some(child);
    }

    fn wait_healthy(&self) {
        let up = wait_until(Duration::from_secs(20), || {
            self.etcdctl_quiet(&["endpoint", "health"]).is_some()
        });
        assert!(
            up,
            "etcd did not become healthy; see the logs in {}",
            self.dir.display()
        );
    }

    /// Every member's client address, `127.0.0.1:<port>`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect()
    }

    /// The CA certificate (PEM) the TLS member's certificate is signed by.
    pub fn tls_certificate(&self) -> Vec<u8> {
        ca_certificate(&self.dir)
    }

    /// Turns authentication on: a `root` user, and `user` with `password` allowed to read and
    /// write keys starting with `sluice:` only.
    pub fn enable_auth(&mut self, user: &str, password: &str) {
        let root = "r00t-pass";
        self.etcdctl(&["user", "add", &format!("root:{root}")]);
        self.etcdctl(&["user", "add", &format!("{user}:{password}")]);
        self.etcdctl(&["role", "add", "sluice"]);
        self.etcdctl(&[
            "role",
            "grant-permission",
            "sluice",
            "--prefix=true",
            "readwrite",
            "sluice:",
        ]);
        self.etcdctl(&["user", "grant-role", user, "sluice"]);
        self.etcdctl(&["auth", "enable"]);
        self.root_password = Some(root.to_owned());
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts killed member `i` again on its ports with its data (what etcd had made durable
    /// survives, as after a crash), and waits until the cluster is healthy.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_healthy();
    }

    /// Stops member `i` (SIGSTOP): its connections stay open and take requests, but nothing is
    /// answered until [`EtcdCluster::resume`].
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Lets a paused member run again (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        let child = self.members[i]
            .child
            .as_ref()
            .expect("the member is not running");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {} failed", child.id());
    }

    /// Runs `etcdctl` against the cluster (as `root` once authentication is on) and returns
    /// its output; panics when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        self.etcdctl_quiet(args)
            .unwrap_or_else(|| panic!("etcdctl {args:?} failed"))
    }

    /// [`EtcdCluster::etcdctl`] with `input` on its standard input (`etcdctl txn`).
    pub fn etcdctl_with_input(&self, args: &[&str], input: &str) -> String {
        self.etcdctl_run(args, Some(input))
            .unwrap_or_else(|| panic!("etcdctl {args:?} failed"))
    }

    fn etcdctl_quiet(&self, args: &[&str]) -> Option<String> {
        self.etcdctl_run(args, None)
    }

    /// `etcdctl`'s global flags for this cluster as it is now (its live members, its CA, the
    /// root login): for a thread that runs `etcdctl` itself (with `ETCDCTL_API=3`) while the
    /// test goes on.
    pub fn etcdctl_flags(&self) -> Vec<String> {
        let live: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect();
        let mut flags = vec![
            format!("--endpoints={}", live.join(",")),
            "--dial-timeout=2s".into(),
            "--command-timeout=5s".into(),
        ];
        if self.tls {
            flags.push(format!("--cacert={}", self.dir.join("ca.pem").display()));
        }
        if let Some(root) = &self.root_password {
            flags.push(format!("--user=root:{root}"));
        }
        flags
    }

    fn etcdctl_run(&self, args: &[&str], input: Option<&str>) -> Option<String> {
        let mut command = Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .args(self.etcdctl_flags())
            .args(args);
        let out = match input {
            None => command.output().ok()?,
            Some(input) => {
                use std::io::Write as _;
                let mut child = command
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .ok()?;
                child.stdin.take()?.write_all(input.as_bytes()).ok()?;
                child.wait_with_output().ok()?
            }
        };
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
