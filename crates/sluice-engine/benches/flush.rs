//! Flush of 100k dirty keys to a local `redis-server` (started here on a free port), memory per
//! tracked synced key, and a 10M-key spray at a rule capped at 1M keys.
//! Run: `cargo bench -p sluice-engine --bench flush`

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::now_or_never;
use sluice_core::Decision;
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_store::{
    CounterStore, ExactRequest, FlushItem, FlushReceipt, FlushReply, FlushTime, MemoryStore,
    RedisStore, RedisStoreOptions, StoreFuture,
};

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 4096
}

fn rules(policy: &str, limit: u64) -> sluice_config::RuleSet {
    let yaml = format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: minute, requests_per_unit: {limit}, mode: synced, policy: {policy} }}\n"
    );
    sluice_config::RuleSet::new(vec![
        sluice_config::parse_domain(Path::new("b.yaml"), &yaml).unwrap(),
    ])
    .unwrap()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // Each part in its own process gives honest resident-memory figures; with no argument
    // all three run in this order (spray first, while the heap is fresh).
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let run = |part: &str| only.as_deref().is_none_or(|o| o == part);
    let clock = ManualClock::new(1_800_000_000_000_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    if run("spray") {
        spray(&shared);
    }
    if run("memory") {
        memory_per_key(&clock, &shared);
    }
    if run("flush") {
        flush(&clock, &shared);
    }
}

fn spray(shared: &Arc<dyn Clock>) {
    let memory = Arc::new(MemoryStore::new(shared.clone()));
    let engine = Engine::new(
        &rules("predictive", 1_000_000),
        &Default::default(),
        memory,
        shared.clone(),
        EngineOptions {
            max_keys_per_rule: 1_000_000,
            ..EngineOptions::default()
        },
    );
    let before = rss_bytes();
    let mut peak = before;
    for i in 0..10_000_000u32 {
        let user = format!("s{i:08}");
        now_or_never(engine.check("d", &[[("user", user.as_str())]], 1)).unwrap();
        if i % 1_000_000 == 999_999 {
            peak = peak.max(rss_bytes());
            println!(
                "spray: {} M keys sent, resident +{:.1} MiB",
                (i + 1) / 1_000_000,
                (rss_bytes() - before) as f64 / 1048576.0
            );
        }
    }
    println!(
        "spray: peak resident growth {:.1} MiB for 10M distinct keys at a rule capped at 1M keys",
        (peak - before) as f64 / 1048576.0
    );
}

fn memory_per_key(clock: &ManualClock, shared: &Arc<dyn Clock>) {
    let memory = Arc::new(MemoryStore::new(shared.clone()));
    let engine = Engine::new(
        &rules("predictive", 1_000_000),
        &Default::default(),
        memory,
        shared.clone(),
        EngineOptions::default(),
    );
    let before = rss_bytes();
    for i in 0..1_000_000u32 {
        let user = format!("u{i:07}");
        now_or_never(engine.check("d", &[[("user", user.as_str())]], 1)).unwrap();
        if std::env::var_os("TRACE_RSS").is_some() && i % 50_000 == 49_999 {
            println!(
                "{} keys: {:.1} MiB",
                i + 1,
                (rss_bytes() - before) as f64 / 1048576.0
            );
        }
    }
    let after = rss_bytes();
    println!(
        "memory/synced: 1M tracked keys (8-byte values) add {:.1} MiB = {:.0} bytes per key",
        (after - before) as f64 / 1048576.0,
        (after - before) as f64 / 1e6
    );
    // The sweep that forgets them: one flush sends the counts, the flush three windows later
    // finds every key idle and removes it (each removal retires the entry for reclamation).
    now_or_never(engine.flush());
    clock.advance(Duration::from_secs(240));
    let start = quanta::Instant::now();
    let report = now_or_never(engine.flush());
    println!(
        "memory/synced: the sweep evicting {} idle keys took {:.1} ms",
        report.evicted,
        start.elapsed().as_secs_f64() * 1e3
    );
}

fn flush(clock: &ManualClock, shared: &Arc<dyn Clock>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = sluice_testkit::RedisServer::start();
    let options = RedisStoreOptions {
        timeout: Duration::from_secs(10),
        ..RedisStoreOptions::default()
    };
    let store = Arc::new(Recording {
        inner: RedisStore::open(&redis.url(), options).unwrap(),
        last: Mutex::new((Vec::new(), None)),
        copy_ns: AtomicU64::new(0),
    });
    // `predictive` alone on its keys exchanges entries only on a key's first flush in a window;
    // `predictive-shared`: a second instance counts the same keys (flushed before each
    // measured flush), far below their limit, so entries go only with a key's first flush in
    // the window; `predictive-shared-near-limit`: the same at a limit of 3 a minute, so every
    // flush exchanges entries (three commands per key: the worst case).
    for (name, policy, instances, limit) in [
        ("reactive", "reactive", 1, 1_000_000),
        ("predictive", "predictive", 1, 1_000_000),
        ("predictive-shared", "predictive", 2, 1_000_000),
        ("predictive-shared-near-limit", "predictive", 2, 3),
    ] {
        // `FLUSH_VARIANT=predictive-shared` runs one variant (for a profiler).
        if std::env::var("FLUSH_VARIANT").is_ok_and(|v| v != name) {
            continue;
        }
        let make = |node: &str| {
            Engine::new(
                &rules(policy, limit),
                &Default::default(),
                store.clone(),
                shared.clone(),
                EngineOptions {
                    follow_store_clock: false,
                    node_id: Some(format!("{name}-{node}")),
                    ..EngineOptions::default()
                },
            )
        };
        // Each variant starts on a window boundary: round 0 is the keys' first flush in the
        // window (it also sets TTLs and reads the previous window), rounds 1-4 are steady.
        let window = 60_000_000_000;
        clock.set((clock.now() / window + 1) * window);
        let engine = make("a");
        let other = (instances > 1).then(|| make("b"));
        let keys: Vec<String> = (0..100_000).map(|i| format!("{name}-{i}")).collect();
        let mut times = Vec::new();
        let mut floors = Vec::new();
        let mut cpu = Vec::new();
        for round in 0..5 {
            for k in &keys {
                now_or_never(engine.check("d", &[[("user", k.as_str())]], 1)).unwrap();
            }
            if let Some(other) = &other {
                for k in &keys {
                    now_or_never(other.check("d", &[[("user", k.as_str())]], 1)).unwrap();
                }
                rt.block_on(other.flush());
            }
            // The recording starts with the measured flush (the other instance's is not in it).
            *store.last.lock().unwrap() = (Vec::new(), None);
            store.copy_ns.store(0, Ordering::Relaxed);
            let commands_before = commands_processed(&redis);
            let cpu_before = cpu_ns();
            let start = quanta::Instant::now();
            let report = rt.block_on(engine.flush());
            // Less the copy the recording store made of the items (same thread: CPU and wall).
            let copy = Duration::from_nanos(store.copy_ns.load(Ordering::Relaxed));
            let took = start.elapsed().saturating_sub(copy);
            cpu.push((cpu_ns() - cpu_before).saturating_sub(copy.as_nanos() as u64) as f64 / 1e6);
            let commands = commands_processed(&redis).saturating_sub(commands_before + 1);
            assert_eq!(report.failed, 0, "{report:?}");
            println!(
                "flush/{name} round {round}: {} keys in {:.1} ms ({:.1} ms of this process's CPU), {} round trip(s), {:.2} commands per key",
                report.items,
                took.as_secs_f64() * 1e3,
                cpu[round],
                report.round_trips,
                commands as f64 / report.items.max(1) as f64
            );
            times.push(took.as_secs_f64() * 1e3);
            // The same commands again, as bytes over a plain socket, replies not parsed: what
            // Redis alone takes for them (the keys exist now; counts are added twice, which no
            // later round reads).
            let (sent, receipt) = store.last.lock().unwrap().clone();
            floors.push(redis_alone(
                redis.port(),
                &sluice_store::packed_flush(&sent, receipt.as_ref()),
            ));
            clock.advance(Duration::from_secs(10));
        }
        times.sort_by(f64::total_cmp);
        floors.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        println!(
            "flush/{name}: median {:.1} ms for 100k keys ({:.1} ms of this process's CPU); Redis alone (the same commands over a plain socket, replies unparsed): median {:.1} ms",
            times[2], cpu[2], floors[2]
        );
    }
}

/// Keeps the items of the flush (all its chunks) so the bench can replay them, with the first
/// chunk's receipt, and how long copying them took (the bench takes it off the flush's time).
struct Recording {
    inner: RedisStore,
    last: Mutex<(Vec<FlushItem>, Option<FlushReceipt>)>,
    copy_ns: AtomicU64,
}

impl CounterStore for Recording {
    fn flush_timed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: Option<&'a FlushReceipt>,
        time: FlushTime,
    ) -> StoreFuture<'a, FlushReply> {
        let start = quanta::Instant::now();
        let mut last = self.last.lock().unwrap();
        last.0.extend_from_slice(items);
        if last.1.is_none() {
            last.1 = receipt.cloned();
        }
        drop(last);
        self.copy_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.inner.flush_timed(items, receipt, time)
    }

    fn landed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: &'a FlushReceipt,
    ) -> StoreFuture<'a, Vec<Option<bool>>> {
        self.inner.landed(items, receipt)
    }

    fn exact<'a>(&'a self, request: &'a ExactRequest) -> StoreFuture<'a, Decision> {
        self.inner.exact(request)
    }

    fn time(&self) -> StoreFuture<'_, u64> {
        self.inner.time()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Milliseconds from writing `commands` (one pipeline) to a new connection until the last
/// reply arrives: a final `ECHO` marks the end, and nothing else is parsed.
fn redis_alone(port: u16, commands: &[u8]) -> f64 {
    use std::io::{Read, Write};
    const MARK: &[u8] = b"$12\r\nsluice-floor\r\n";
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket.set_nodelay(true).unwrap();
    let writer = socket.try_clone().unwrap();
    let start = quanta::Instant::now();
    // Written from a second thread: Redis answers while it reads, and a writer that does not
    // read meanwhile would fill both socket buffers and stall.
    let payload = [commands, b"*2\r\n$4\r\nECHO\r\n$12\r\nsluice-floor\r\n"].concat();
    let sender = std::thread::spawn(move || (&writer).write_all(&payload).unwrap());
    let mut buffer = vec![0; 1 << 20];
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let n = socket.read(&mut buffer).unwrap();
        assert!(n > 0, "Redis closed the connection");
        tail.extend_from_slice(&buffer[..n]);
        if tail.ends_with(MARK) {
            break;
        }
        let keep = tail.len().saturating_sub(MARK.len());
        tail.drain(..keep);
    }
    let took = start.elapsed();
    sender.join().unwrap();
    took.as_secs_f64() * 1e3
}

/// CPU time of all this process's threads so far, in nanoseconds (`/proc/self/task/*/schedstat`):
/// what the engine and redis-rs spend on a flush, whatever Redis and the VM's neighbours do.
fn cpu_ns() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
                .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// The server's count of commands processed so far (`INFO stats`).
fn commands_processed(redis: &sluice_testkit::RedisServer) -> u64 {
    redis
        .command("INFO stats")
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
