//! A fleet of real `sluice serve` processes on one real Redis, and a simulator scenario's
//! traffic replayed against it in real time, tallied per key and window the way the simulator
//! tallies its own runs. The real side of `examples/fleet_vs_sim.rs` and of the first-window
//! test in `tests/fleet.rs`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Clock, SystemClock};
use sluice_testkit::{RedisServer, free_port, wait_until};

/// One `sluice serve` of a fleet: its configuration, and its process while it runs.
pub struct Instance {
    process: Process,
    dir: PathBuf,
    pub http: u16,
    pub admin: u16,
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Process::Running(mut child) | Process::Stopping(mut child) =
            std::mem::replace(&mut self.process, Process::NotStarted)
        {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::env::var_os("SLUICE_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Where an instance's `sluice serve` is.
enum Process {
    NotStarted,
    Running(Child),
    /// Signalled to stop: it may still be making its last flush (reaped when dropped).
    Stopping(Child),
}

/// How an instance is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: a last flush, then it takes itself off the fleet's list.
    Term,
    /// SIGKILL: gone at once, what it counted since its last flush lost.
    Kill,
}

impl Instance {
    /// Writes its configuration (rules `rules`, `extra` appended to `sluice.yaml`) on free
    /// ports; it starts with [`Instance::spawn`].
    fn configure(i: usize, store: &str, rules: &str, extra: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "sluice-fleet-{}-{i}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(dir.join("rules")).unwrap();
        std::fs::write(dir.join("rules/sim.yaml"), rules).unwrap();
        let (http, grpc, admin) = (free_port(), free_port(), free_port());
        std::fs::write(
            dir.join("sluice.yaml"),
            format!(
                "store: {store}\nlisten:\n  http: 127.0.0.1:{http}\n  grpc: 127.0.0.1:{grpc}\n  admin: 127.0.0.1:{admin}\nrules: [rules/]\n{extra}"
            ),
        )
        .unwrap();
        Instance {
            process: Process::NotStarted,
            dir,
            http,
            admin,
        }
    }

    /// Starts its `sluice serve` (`bin`), logging to `serve.log` in its directory.
    pub fn spawn(&mut self, bin: &Path) {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("serve.log"))
            .unwrap();
        let child = Command::new(bin)
            .args(["serve", "--config"])
            .arg(self.dir.join("sluice.yaml"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sluice serve");
        self.process = Process::Running(child);
    }

    /// Stops its process, if it runs. `Term` does not wait (a replay goes on while the
    /// instance makes its last flush); the process is reaped when the instance is dropped.
    pub fn signal(&mut self, signal: Signal) {
        let Process::Running(mut child) = std::mem::replace(&mut self.process, Process::NotStarted)
        else {
            return;
        };
        match signal {
            Signal::Term => {
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
            }
            Signal::Kill => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        self.process = Process::Stopping(child);
    }

    /// Whether its process was started and not stopped.
    pub fn running(&self) -> bool {
        matches!(self.process, Process::Running(_))
    }

    /// The end of its log (for a failing check).
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default();
        let start = log.len().saturating_sub(2_000);
        log[log.floor_char_boundary(start)..].to_owned()
    }
}

/// A Redis and `nodes` instances of `bin` serving `rules` (domain `sim`) with `extra` appended
/// to each `sluice.yaml`.
pub struct Fleet {
    pub instances: Vec<Instance>,
    pub redis: RedisServer,
    bin: PathBuf,
}

impl Fleet {
    /// Starts every instance.
    pub fn start(bin: &Path, nodes: usize, rules: &str, extra: &str) -> Self {
        Self::start_some(bin, nodes, rules, extra, |_| true)
    }

    /// Configures `nodes` instances and starts those `first` names; the others start with
    /// [`Fleet::apply`].
    pub fn start_some(
        bin: &Path,
        nodes: usize,
        rules: &str,
        extra: &str,
        first: impl Fn(usize) -> bool,
    ) -> Self {
        let redis = RedisServer::start();
        let mut instances: Vec<Instance> = (0..nodes)
            .map(|i| Instance::configure(i, &redis.url(), rules, extra))
            .collect();
        for (i, instance) in instances.iter_mut().enumerate() {
            if first(i) {
                instance.spawn(bin);
            }
        }
        let fleet = Self {
            instances,
            redis,
            bin: bin.to_owned(),
        };
        for instance in fleet.instances.iter().filter(|i| i.running()) {
            fleet.wait_until_up(instance);
        }
        fleet
    }

    fn wait_until_up(&self, instance: &Instance) {
        assert!(
            wait_until(Duration::from_secs(15), || {
                std::net::TcpStream::connect(("127.0.0.1", instance.http)).is_ok()
            }),
            "sluice serve did not come up: {}",
            instance.log_tail()
        );
    }

    /// Makes `change` to the fleet: starts, stops or kills its instance.
    pub fn apply(&mut self, change: &Change) {
        let instance = &mut self.instances[change.node];
        match change.kind {
            ChangeKind::Join => instance.spawn(&self.bin),
            ChangeKind::Leave => instance.signal(Signal::Term),
            ChangeKind::Crash => instance.signal(Signal::Kill),
        }
    }

    /// Waits (up to 30 s) until every running instance has heard from the store that all of
    /// them are live (`sluice_fleet_instances` on its admin listener): until then an instance
    /// shares a limit among fewer instances than there are. Panics, with the logs, when they
    /// do not.
    pub fn wait_until_all_known(&self) {
        let n = self.instances.iter().filter(|i| i.running()).count();
        let known = |i: &Instance| {
            !i.running()
                || admin_metrics(i.admin)
                    .lines()
                    .find_map(|l| l.strip_prefix("sluice_fleet_instances "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    == Some(n as f64)
        };
        assert!(
            wait_until(Duration::from_secs(30), || self.instances.iter().all(known)),
            "the instances did not all learn of each other; they logged:\n{}",
            self.logs()
        );
    }

    pub fn http_ports(&self) -> Vec<u16> {
        self.instances.iter().map(|i| i.http).collect()
    }

    /// Redis commands the store has processed so far, as the simulator counts them (each
    /// command a script runs included; `INFO` and the connection's own set-up left out).
    pub fn store_commands(&self) -> u64 {
        let info = self.redis.command("INFO commandstats");
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter(|l| {
                !["info:", "hello:", "client|", "select:", "ping:", "config|"]
                    .iter()
                    .any(|skip| l.starts_with(skip))
            })
            .filter_map(|l| {
                l.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    pub fn logs(&self) -> String {
        self.instances
            .iter()
            .enumerate()
            .map(|(i, x)| format!("node-{i}:\n{}", x.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A change to a fleet during a replay: an instance joins (starts), leaves (SIGTERM) or
/// crashes (SIGKILL) at a time from the replay's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub at_ns: u64,
    pub node: usize,
    pub kind: ChangeKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Join,
    Leave,
    Crash,
}

/// How long before its join time an instance is started: `sluice serve` takes a few hundred
/// milliseconds to listen and announce itself, and the simulator's node takes traffic from its
/// join time on.
pub const JOIN_LEAD: Duration = Duration::from_secs(1);

/// A scenario's joins after the start, leaves and crashes, in time order (a join at
/// [`JOIN_LEAD`] before the node's join time; nodes joining at the start are started before
/// the replay, see [`Fleet::start_some`]).
pub fn changes(nodes: &sluice_sim::NodeSpec) -> Vec<Change> {
    let lead = JOIN_LEAD.as_nanos() as u64;
    let mut out = Vec::new();
    for node in 0..nodes.count {
        let join_ns = nodes.join_ns(node);
        if join_ns > 0 {
            out.push(Change {
                at_ns: join_ns.saturating_sub(lead),
                node,
                kind: ChangeKind::Join,
            });
        }
        out.extend(nodes.leave_ns(node).map(|at_ns| Change {
            at_ns,
            node,
            kind: ChangeKind::Leave,
        }));
        out.extend(nodes.crash_ns(node).map(|at_ns| Change {
            at_ns,
            node,
            kind: ChangeKind::Crash,
        }));
    }
    out.sort_by_key(|c| c.at_ns);
    out
}

/// An instance's `/metrics` (empty when it does not answer).
fn admin_metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let request = "GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n";
    let mut out = String::new();
    if stream.write_all(request.as_bytes()).is_ok() {
        stream.read_to_string(&mut out).ok();
    }
    out
}

/// A key's requests in one window (numbered from the replay's start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    pub offered: u64,
    pub admitted: u64,
}

/// What a replay saw: per (key, window) offered and admitted, and requests that failed.
#[derive(Debug, Default)]
pub struct Replayed {
    pub counts: BTreeMap<(String, u64), Count>,
    /// Requests that got neither 200 nor 429 (none expected).
    pub failed: u64,
    /// Requests sent later than 20 ms after their time (a busy machine).
    pub late: u64,
}

impl Replayed {
    /// Admitted per window, all keys together.
    pub fn admitted_by_window(&self, windows: u64) -> Vec<u64> {
        let mut out = vec![0; windows as usize];
        for ((_, w), c) in &self.counts {
            if let Some(slot) = out.get_mut(*w as usize) {
                *slot += c.admitted;
            }
        }
        out
    }

    /// The figures per class of keys (see `sluice_sim::classes`).
    pub fn classes(&self, limit: u64) -> Vec<sluice_sim::classes::ClassReport> {
        sluice_sim::classes::by_class(
            self.counts.iter().map(|((key, _), c)| {
                (
                    key.as_str(),
                    sluice_sim::classes::WindowCount {
                        offered: c.offered,
                        admitted: c.admitted,
                    },
                )
            }),
            limit,
        )
    }

    /// Over-admission of each key-window in % of `limit`, split as the simulator's report
    /// splits it: (first windows, the others). A key's first window is one whose key had no
    /// request in the window before.
    pub fn over_pct(&self, limit: u64) -> (Vec<f64>, Vec<f64>) {
        let (mut first, mut warm) = (Vec::new(), Vec::new());
        for ((key, w), c) in &self.counts {
            let pct = c.admitted.saturating_sub(limit) as f64 * 100.0 / limit as f64;
            let before = w
                .checked_sub(1)
                .and_then(|p| self.counts.get(&(key.clone(), p)));
            if before.is_some_and(|b| b.offered > 0) {
                warm.push(pct);
            } else {
                first.push(pct);
            }
        }
        first.sort_by(f64::total_cmp);
        warm.sort_by(f64::total_cmp);
        (first, warm)
    }
}

#[path = "fleet_http.rs"]
mod http_check;

use http_check::{Answer, Sender, check, connect};

/// A request as sent: its key and tenant, when it was sent (wall clock, ns), its answer, whether
/// it went out late.
type Sent = (String, Option<String>, u64, Option<Answer>, bool);

/// Sends `requests` (times from the start of a window) to `ports` (request `node` goes to
/// `ports[node]`) in real time, starting at the next window boundary of the wall clock (the
/// instances' windows are aligned to it, as the simulator's are to its start), and tallies
/// each request in the window that decided it: the one whose end its answer names (the time
/// it was answered plus its time until reset), or, for an answer without one, the window of
/// the moment it was sent. (Tallied by the moment it was sent, a request held up at a window's
/// end on a busy machine, counted in the next window, looked like an over-admission of the
/// window it was sent in.)
pub async fn replay(ports: &[u16], requests: &[sluice_sim::Request], window: Duration) -> Replayed {
    replay_changing(ports, requests, window, &[], |_| {}).await
}

/// [`replay`], making each of `changes` (times from the replay's start, in order) with `apply`
/// at its time. Instances not listening at the start get their connections when they are
/// first sent a request.
pub async fn replay_changing(
    ports: &[u16],
    requests: &[sluice_sim::Request],
    window: Duration,
    changes: &[Change],
    mut apply: impl FnMut(&Change),
) -> Replayed {
    let clock = SystemClock::new();
    let window_ns = window.as_nanos() as u64;
    let now = clock.now();
    let mut start_ns = (now / window_ns + 1) * window_ns;
    if start_ns - now < 300_000_000 {
        start_ns += window_ns;
    }
    // One pool of keep-alive connections per instance.
    let pools: Vec<Arc<tokio::sync::Mutex<Vec<Sender>>>> = ports
        .iter()
        .map(|_| Arc::new(tokio::sync::Mutex::new(Vec::new())))
        .collect();
    for (pool, &port) in pools.iter().zip(ports) {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            continue;
        }
        let mut senders = pool.lock().await;
        for _ in 0..4 {
            senders.push(connect(port).await);
        }
    }
    tokio::time::sleep(Duration::from_nanos(start_ns.saturating_sub(clock.now()))).await;
    let base = tokio::time::Instant::now();
    let base_ns = clock.now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut out = Replayed::default();
    let mut tally = |(key, tenant, sent, answer, late): Sent| {
        let window = match answer {
            // The end of the deciding window, to the nearest window boundary.
            Some((_, Some(until_reset), answered)) => {
                let end = answered.saturating_add(until_reset.as_nanos() as u64);
                ((end.saturating_sub(start_ns) + window_ns / 2) / window_ns).saturating_sub(1)
            }
            _ => sent.saturating_sub(start_ns) / window_ns,
        };
        let count = out.counts.entry((key, window)).or_default();
        count.offered += 1;
        match answer {
            Some((decided, ..)) => {
                count.admitted += u64::from(decided.user);
                if let (Some(tenant), Some(allowed)) = (tenant, decided.tenant) {
                    let count = out.counts.entry((tenant, window)).or_default();
                    count.offered += 1;
                    count.admitted += u64::from(allowed);
                }
            }
            None => out.failed += 1,
        }
        out.late += u64::from(late);
    };
    let mut changes = changes.iter().peekable();
    for r in requests {
        while let Some(change) = changes.next_if(|c| c.at_ns <= r.t_ns) {
            tokio::time::sleep_until(base + Duration::from_nanos(change.at_ns)).await;
            apply(change);
        }
        tokio::time::sleep_until(base + Duration::from_nanos(r.t_ns)).await;
        let (pool, port) = (pools[r.node].clone(), ports[r.node]);
        let (key, tenant, cost, due) = (r.key.clone(), r.tenant.clone(), r.cost, r.t_ns);
        tasks.spawn(async move {
            let sent = SystemClock::new().now();
            let taken = pool.lock().await.pop();
            let mut sender = match taken {
                Some(s) => s,
                None => connect(port).await,
            };
            let answer = check(&mut sender, port, (&key, tenant.as_deref()), cost)
                .await
                .map(|(decided, until_reset)| (decided, until_reset, SystemClock::new().now()));
            if answer.is_some() {
                pool.lock().await.push(sender);
            }
            let late = sent.saturating_sub(base_ns) > due + 20_000_000;
            (key, tenant, sent, answer, late)
        });
        while let Some(done) = tasks.try_join_next() {
            tally(done.expect("request task"));
        }
    }
    for change in changes {
        tokio::time::sleep_until(base + Duration::from_nanos(change.at_ns)).await;
        apply(change);
    }
    while let Some(done) = tasks.join_next().await {
        tally(done.expect("request task"));
    }
    out
}
