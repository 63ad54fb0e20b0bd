//! Network drills: Redis and three `sluice serve` instances on separate test hosts in network
//! namespaces this test makes (`sluice_testkit::Lab`), under the faults a real network has: an
//! instance cut off from Redis mid-window, 500 ms of latency, 5% packet loss, a store that
//! flaps, a key spray, and SIGTERM while Redis is unreachable. After each, Redis holds exactly
//! the counts the instances admitted (nothing lost, nothing twice), and no synced-mode request
//! waited on the store. These are the short versions; `scripts/drill-network.sh` runs the long
//! ones (docs/RELIABILITY.md).

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_testkit::{Lab, wait_until};
use tokio::time::Instant;

const INSTANCES: usize = 3;

/// How much longer the faults last than in the suite (`SLUICE_DRILL_SCALE`, default 1), and
/// how many keys the spray sends (`SLUICE_DRILL_SPRAY`, default 30,000):
/// `scripts/drill-network.sh` runs the long drills this way.
fn scale() -> u32 {
    std::env::var("SLUICE_DRILL_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s) * scale()
}
/// Synced, a flush a second; high enough that every request is admitted: the drills check
/// counting, not limiting. The window (and so its keys' two-window life in Redis) outlasts the
/// longest drill: counts of a window whose keys are gone are rightly not sent.
const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 10m, requests_per_unit: 1000000, spans: 600, mode: synced }\n  - key: victim\n    rate_limit: { window: 1m, requests_per_unit: 5, spans: 6, mode: synced, small_limits: share }\n";

struct Instance {
    child: Option<Child>,
    dir: PathBuf,
}

struct Fleet {
    lab: Lab,
    instances: Vec<Instance>,
    root: PathBuf,
}

impl Fleet {
    fn start(name: &str) -> Self {
        let mut lab = Lab::new(INSTANCES);
        let root = std::env::temp_dir().join(format!("sluice-net-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        lab.start_store(&root.join("redis"));
        let mut fleet = Self {
            lab,
            instances: Vec::new(),
            root,
        };
        for i in 0..INSTANCES {
            let dir = fleet.root.join(format!("sluice-{i}"));
            std::fs::create_dir_all(dir.join("rules")).unwrap();
            std::fs::write(dir.join("rules/edge.yaml"), RULES).unwrap();
            std::fs::write(
                dir.join("sluice.yaml"),
                format!(
                    "store: redis://{}/\nlisten: {{ http: 0.0.0.0:8080, grpc: 0.0.0.0:8081, admin: 0.0.0.0:9090 }}\nrules: [rules/]\nexpected_instances: {INSTANCES}\nstate_dir: state\nshutdown_timeout: 2s\n",
                    fleet.lab.store_addr_for(i)
                ),
            )
            .unwrap();
            fleet.instances.push(Instance { child: None, dir });
            fleet.spawn(i);
        }
        fleet
    }

    fn spawn(&mut self, i: usize) {
        let dir = &self.instances[i].dir;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("serve.log"))
            .unwrap();
        let child = self
            .lab
            .on_instance(i, env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--config"])
            .arg(dir.join("sluice.yaml"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sluice serve on its host");
        self.instances[i].child = Some(child);
        let ready = format!("http://{}:9090/readyz", self.lab.instance_host(i));
        assert!(
            wait_until(Duration::from_secs(15), || http_ok(&ready)),
            "instance {i} did not become ready: {}",
            self.log(i)
        );
    }

    fn terminate(&mut self, i: usize) {
        let child = self.instances[i].child.as_mut().expect("running");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let mut exited = None;
        wait_until(Duration::from_secs(15), || {
            exited = child.try_wait().ok().flatten();
            exited.is_some()
        });
        let exited = exited.unwrap_or_else(|| panic!("instance {i} did not stop: {}", self.log(i)));
        assert!(exited.success(), "{exited:?}: {}", self.log(i));
        self.instances[i].child = None;
    }

    fn log(&self, i: usize) -> String {
        let log =
            std::fs::read_to_string(self.instances[i].dir.join("serve.log")).unwrap_or_default();
        // The whole log, for a long drill that failed.
        if let Ok(keep) = std::env::var("SLUICE_DRILL_KEEP_LOGS") {
            let _ = std::fs::write(format!("{keep}-{i}.log"), &log);
            let url = format!("http://{}:9090/metrics", self.lab.instance_host(i));
            if let Ok(out) = std::process::Command::new("curl")
                .args(["-s", "-m", "2", &url])
                .output()
            {
                let _ = std::fs::write(format!("{keep}-{i}.metrics"), &out.stdout);
            }
        }
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    async fn client(&self, i: usize) -> RateLimitServiceClient<tonic::transport::Channel> {
        let url = format!("http://{}:8081", self.lab.instance_host(i));
        RateLimitServiceClient::connect(url)
            .await
            .expect("grpc connect")
    }

    /// Redis's count for the descriptor key `key` over every window: the sum of its counter
    /// keys (not the instance hashes or the receipts' markers).
    fn stored(&self, key: &str) -> u64 {
        // One call: the sum is taken in Redis (a spray has tens of thousands of keys).
        const SUM: &str = "local s = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do if not string.find(k, ':n$') and not string.find(k, ':r:') then s = s + (tonumber(redis.call('GET', k)) or 0) end end return s";
        let pattern = format!("*{key}*");
        let sum = self.lab.store_command(&["EVAL", SUM, "0", &pattern]);
        sum.trim()
            .parse()
            .unwrap_or_else(|_| panic!("EVAL answered {sum:?}"))
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for instance in &mut self.instances {
            if let Some(mut child) = instance.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn http_ok(url: &str) -> bool {
    std::process::Command::new("curl")
        .args(["-sf", "-m", "1", url])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn request(key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// What the traffic saw.
#[derive(Default)]
struct Seen {
    admitted: AtomicU64,
    slowest_us: AtomicU64,
}

/// Each instance gets one request every 5 ms for `user` until `stop`.
async fn traffic(fleet: &Fleet, user: &'static str, stop: Arc<AtomicBool>) -> Arc<Seen> {
    let seen = Arc::new(Seen::default());
    let mut tasks = Vec::new();
    for i in 0..INSTANCES {
        let mut client = fleet.client(i).await;
        let (seen, stop) = (seen.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = client.should_rate_limit(request("user", user)).await;
                let took = t.elapsed().as_micros() as u64;
                seen.slowest_us.fetch_max(took, Ordering::Relaxed);
                if r.expect("a check failed").into_inner().overall_code == 1 {
                    seen.admitted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    tokio::spawn(async move {
        for t in tasks {
            t.await.unwrap();
        }
    });
    seen
}

/// Runs traffic for `user` while `fault` plays out, then waits for Redis to hold exactly what
/// was admitted, and checks no request waited on the store.
async fn drill<F, Fut>(fleet: &Fleet, user: &'static str, fault: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let stop = Arc::new(AtomicBool::new(false));
    let seen = traffic(fleet, user, stop.clone()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    fault().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let admitted = seen.admitted.load(Ordering::Relaxed);
    assert!(admitted > 0);
    let mut stored = 0;
    let settled = wait_until(Duration::from_secs(20), || {
        stored = fleet.stored(user);
        stored == admitted
    });
    assert!(
        settled,
        "Redis holds {stored} of {admitted} admitted: {}",
        (0..INSTANCES)
            .map(|i| fleet.log(i))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // A request that waited on the store would take at least the store's 500 ms timeout.
    let slowest = Duration::from_micros(seen.slowest_us.load(Ordering::Relaxed));
    println!(
        "drill {user}: {admitted} admitted, Redis holds {stored}, slowest request {:.1} ms",
        slowest.as_secs_f64() * 1e3
    );
    assert!(
        slowest < Duration::from_millis(250),
        "a synced-mode request took {slowest:?}: it waited on the store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_cut_off_from_redis_mid_window_loses_and_doubles_nothing() {
    let fleet = Fleet::start("cut");
    drill(&fleet, "cut", || async {
        fleet.lab.cut(0, true);
        tokio::time::sleep(secs(3)).await;
        fleet.lab.cut(0, false);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_second_of_latency_to_redis_never_reaches_the_request_path() {
    let fleet = Fleet::start("latency");
    drill(&fleet, "slow", || async {
        (0..INSTANCES).for_each(|i| fleet.lab.set_latency(i, Duration::from_millis(500)));
        tokio::time::sleep(secs(4)).await;
        (0..INSTANCES).for_each(|i| fleet.lab.set_latency(i, Duration::ZERO));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_percent_packet_loss_loses_and_doubles_nothing() {
    let fleet = Fleet::start("loss");
    drill(&fleet, "lossy", || async {
        (0..INSTANCES).for_each(|i| fleet.lab.loss(i, 5));
        tokio::time::sleep(secs(4)).await;
        (0..INSTANCES).for_each(|i| fleet.lab.loss(i, 0));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_flaps_every_two_seconds_loses_and_doubles_nothing() {
    let fleet = Fleet::start("flap");
    drill(&fleet, "flap", || async {
        for _ in 0..3 * scale() {
            fleet.lab.store_down(true);
            tokio::time::sleep(Duration::from_secs(2)).await;
            fleet.lab.store_down(false);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_spray_in_one_span_reaches_redis_whole_while_requests_flow() {
    let sprayed: u64 = std::env::var("SLUICE_DRILL_SPRAY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30_000)
        / 60
        * 60;
    let fleet = Fleet::start("spray");
    drill(&fleet, "watch", || async {
        let mut client = fleet.client(1).await;
        for chunk in 0..sprayed / 60 {
            let descriptors = (0..60)
                .map(|k| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "victim".into(),
                        value: format!("v{}", chunk * 60 + k),
                    }],
                    ..Default::default()
                })
                .collect();
            let r = RateLimitRequest {
                domain: "edge".into(),
                descriptors,
                hits_addend: 1,
            };
            client.should_rate_limit(r).await.expect("spray request");
        }
    })
    .await;
    let mut stored = 0;
    assert!(
        wait_until(Duration::from_secs(20), || {
            stored = fleet.stored("victim");
            stored == sprayed
        }),
        "Redis holds {stored} sprayed counts of {sprayed}: {}",
        fleet.log(1)
    );
    println!("drill spray: {sprayed} keys sprayed into one span, Redis holds {stored}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_redis_unreachable_spills_and_the_restart_delivers_exactly_once() {
    let mut fleet = Fleet::start("sigterm");
    let mut client = fleet.client(0).await;
    let mut admitted = 0;
    for _ in 0..40 {
        let r = client
            .should_rate_limit(request("user", "term"))
            .await
            .unwrap();
        admitted += u64::from(r.into_inner().overall_code == 1);
    }
    fleet.lab.cut(0, true);
    fleet.terminate(0);
    let spill = fleet.instances[0].dir.join("state/spill.json");
    assert!(spill.exists(), "{}", fleet.log(0));
    fleet.lab.cut(0, false);
    fleet.spawn(0);
    let mut stored = 0;
    assert!(
        wait_until(Duration::from_secs(20), || {
            stored = fleet.stored("term");
            stored == admitted
        }),
        "Redis holds {stored} of {admitted}: {}",
        fleet.log(0)
    );
    assert!(!spill.exists(), "delivered, the spill is gone");
    println!(
        "drill sigterm: {admitted} admitted, spilled at SIGTERM, Redis holds {stored} after the restart"
    );
}
