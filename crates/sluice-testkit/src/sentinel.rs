//! A master, a replica and three Sentinels.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::ports::{free_port, loopback, wait_until};
use crate::process::{Ready, kill_child, spawn_redis};
use crate::resp::raw_command_as;
use crate::tls::{ca_certificate, make_certificates, tls_args};

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
            Some(spawn_redis(
                master,
                &dir.join("master"),
                &master_args,
                Ready::Answering,
            )),
            Some(spawn_redis(
                replica,
                &dir.join("replica"),
                &replica_args,
                Ready::Answering,
            )),
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
        let login = |password: &Option<String>| {
            password
                .as_ref()
                .map(|p| sluice_store::Credentials::new(None, p.as_str()))
        };
        sluice_store::RedisTarget::Sentinel(sluice_store::SentinelTarget {
            sentinels: loopback(&self.store_sentinel_ports()),
            master: Self::MASTER.to_owned(),
            auth: login(&self.data_password),
            db: 0,
            tls,
            sentinel_auth: login(&self.sentinel_password),
            sentinel_tls: tls,
        })
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
