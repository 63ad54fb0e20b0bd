//! A small network of test hosts in network namespaces the test makes itself: one host for
//! the store and one per instance, each joined to this (the test's) namespace by a veth pair.
//! Instances reach the store only through a [`DelayLink`] relay here, one per instance, so
//! each instance's path to the store can be slowed, cut (a silent drop of its packets) or made
//! lossy on its own; the test reaches each instance directly.
//!
//! Addresses (`A` is the lab's number): the store host is `10.A.0.2`; instance `i` is
//! `10.A.{i+1}.2` and reaches the store at `10.A.{i+1}.1:6379` (its relay).
//!
//! Needs root and iproute2; `iptables` for cuts and loss. Everything is removed on drop.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::link::DelayLink;
use crate::ports::wait_until;

/// The store's port on its host.
pub const STORE_PORT: u16 = 6379;

/// The network (see the module documentation).
pub struct Lab {
    id: u8,
    instances: usize,
    links: Vec<DelayLink>,
    children: Vec<Child>,
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

fn must(command: &mut Command) {
    let out = run(command);
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

fn ip(args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(args);
    c
}

impl Lab {
    /// Makes the store host and `instances` instance hosts. Fails with a clear message when
    /// namespaces cannot be made (not root, no iproute2): never a silent skip.
    pub fn new(instances: usize) -> Self {
        assert!((1..=50).contains(&instances), "a lab has 1 to 50 instances");
        let id = Self::claim();
        let mut lab = Self {
            id,
            instances,
            links: Vec::new(),
            children: Vec::new(),
        };
        for host in 0..=instances {
            lab.join(host);
        }
        for i in 0..instances {
            let relay = SocketAddr::from((lab.router_addr(i + 1), STORE_PORT));
            let store = SocketAddr::from((lab.store_host(), STORE_PORT));
            let link = DelayLink::start(relay, store)
                .unwrap_or_else(|e| panic!("cannot start the relay on {relay}: {e}"));
            lab.links.push(link);
        }
        lab
    }

    /// Takes a lab number no other lab on this machine uses (its store namespace's name is
    /// the claim: `ip netns add` fails for a name that exists).
    fn claim() -> u8 {
        let start = (std::process::id() % 50) as u8;
        for k in 0..50u8 {
            let id = 200 + (start + k) % 50;
            let out = run(&mut ip(&["netns", "add", &format!("sl{id}h0")]));
            if out.status.success() {
                return id;
            }
            let err = String::from_utf8_lossy(&out.stderr);
            if !err.contains("exists") {
                panic!(
                    "cannot create a network namespace (`ip netns add` said: {}); the network drills need root and iproute2",
                    err.trim()
                );
            }
        }
        panic!("no free lab number: remove stale `sl2*` namespaces (`ip netns list`)");
    }

    /// Host `h` (0: the store; `i + 1`: instance `i`): its namespace and veth pair.
    fn join(&self, h: usize) {
        let ns = self.ns(h);
        if h > 0 {
            must(&mut ip(&["netns", "add", &ns]));
        }
        let (outside, inside) = (self.veth(h, 'r'), self.veth(h, 'n'));
        // A pair left by an earlier lab of this number whose namespace is still being torn
        // down by the kernel.
        let _ = run(&mut ip(&["link", "del", &outside]));
        must(&mut ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &inside,
        ]));
        must(&mut ip(&["link", "set", &inside, "netns", &ns]));
        let router = format!("{}/24", self.router_addr(h));
        let host = format!("{}/24", self.host_addr(h));
        must(&mut ip(&["addr", "add", &router, "dev", &outside]));
        must(&mut ip(&["link", "set", &outside, "up"]));
        must(&mut self.exec_args(h, &["ip", "addr", "add", &host, "dev", &inside]));
        must(&mut self.exec_args(h, &["ip", "link", "set", &inside, "up"]));
        must(&mut self.exec_args(h, &["ip", "link", "set", "lo", "up"]));
    }

    fn ns(&self, h: usize) -> String {
        format!("sl{}h{h}", self.id)
    }

    fn veth(&self, h: usize, side: char) -> String {
        format!("sl{}{side}{h}", self.id)
    }

    fn router_addr(&self, h: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.id, h as u8, 1)
    }

    fn host_addr(&self, h: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.id, h as u8, 2)
    }

    /// The store host's address (the test reaches it directly).
    pub fn store_host(&self) -> Ipv4Addr {
        self.host_addr(0)
    }

    /// Instance `i`'s address (where the test reaches its listeners).
    pub fn instance_host(&self, i: usize) -> Ipv4Addr {
        self.host_addr(i + 1)
    }

    /// Where instance `i` reaches the store (its relay).
    pub fn store_addr_for(&self, i: usize) -> SocketAddr {
        SocketAddr::from((self.router_addr(i + 1), STORE_PORT))
    }

    fn exec_args(&self, h: usize, args: &[&str]) -> Command {
        let mut c = ip(&["netns", "exec", &self.ns(h)]);
        c.args(args);
        c
    }

    /// A command run on instance `i`'s host.
    pub fn on_instance(&self, i: usize, program: &str) -> Command {
        let mut c = ip(&["netns", "exec", &self.ns(i + 1), program]);
        c.stdin(Stdio::null());
        c
    }

    /// Starts `redis-server` on the store host (no persistence: the drills never restart it,
    /// and an fsync per write would make the disk, not the network, the slow part) and waits
    /// until it answers.
    pub fn start_store(&mut self, dir: &std::path::Path) {
        std::fs::create_dir_all(dir).expect("create the store's directory");
        let port = STORE_PORT.to_string();
        let child = ip(&["netns", "exec", &self.ns(0), "redis-server"])
            .args([
                "--port",
                &port,
                "--bind",
                "0.0.0.0",
                "--protected-mode",
                "no",
            ])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server on the store host");
        self.children.push(child);
        assert!(
            wait_until(Duration::from_secs(10), || self
                .store_command(&["PING"])
                .contains("PONG")),
            "redis-server did not come up on the store host"
        );
    }

    /// Runs a command on the store (`redis-cli` from here); returns its output.
    pub fn store_command(&self, args: &[&str]) -> String {
        let out = run(Command::new("redis-cli")
            .args(["-h", &self.store_host().to_string(), "-p"])
            .arg(STORE_PORT.to_string())
            .args(args));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Sets the latency of instance `i`'s path to the store, each way.
    pub fn set_latency(&self, i: usize, delay: Duration) {
        self.links[i].set_delay(delay);
    }

    /// Cuts (`true`) or heals instance `i`'s path to the store: its packets are dropped
    /// silently, as in a partition (calls time out; nothing is refused).
    pub fn cut(&self, i: usize, cut: bool) {
        self.store_rules(i + 1, cut, &[]);
    }

    /// Drops `percent` of instance `i`'s packets to and from the store, at random (0 removes it).
    pub fn loss(&self, i: usize, percent: u32) {
        self.store_rules(i + 1, false, &[]);
        if percent > 0 {
            let p = format!("{:.4}", f64::from(percent) / 100.0);
            self.store_rules(
                i + 1,
                true,
                &["-m", "statistic", "--mode", "random", "--probability", &p],
            );
        }
    }

    /// Cuts (`true`) or heals the store host from everyone (its packets dropped silently).
    pub fn store_down(&self, down: bool) {
        self.store_rules(0, down, &[]);
    }

    /// On host `h`: drops its store traffic (`extra` narrows it) when `on`, or removes every
    /// rule.
    fn store_rules(&self, h: usize, on: bool, extra: &[&str]) {
        if !on {
            must(&mut self.exec_args(h, &["iptables", "-F"]));
            return;
        }
        let port = STORE_PORT.to_string();
        // The store host serves the port; an instance's host calls it.
        let (incoming, outgoing) = if h == 0 {
            ("--dport", "--sport")
        } else {
            ("--sport", "--dport")
        };
        for (chain, side) in [("INPUT", incoming), ("OUTPUT", outgoing)] {
            let mut args = vec!["iptables", "-A", chain, "-p", "tcp", side, &port];
            args.extend_from_slice(extra);
            args.extend(["-j", "DROP"]);
            must(&mut self.exec_args(h, &args));
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.links.clear();
        for h in 0..=self.instances {
            // Deleting this end removes the pair at once (a namespace's teardown is lazy).
            let _ = run(&mut ip(&["link", "del", &self.veth(h, 'r')]));
            let _ = run(&mut ip(&["netns", "del", &self.ns(h)]));
        }
    }
}
