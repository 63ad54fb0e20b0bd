//! A Redis Cluster: three masters with a replica each.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::ports::{free_port, loopback, wait_until};
use crate::process::{Ready, kill_child, spawn_redis};
use crate::resp::raw_command;
use crate::tls::{ca_certificate, make_certificates, tls_args};

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
                Some(spawn_redis(
                    p,
                    &dir.join(p.to_string()),
                    &args,
                    Ready::Answering,
                ))
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
        sluice_store::RedisTarget::Cluster(sluice_store::ClusterTarget {
            nodes: loopback(self.tls_ports.as_ref().unwrap_or(&self.ports)),
            auth: None,
            tls: self.tls_ports.is_some(),
        })
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
