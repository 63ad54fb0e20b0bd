//! Free loopback ports, and waiting for a condition.

use std::net::TcpListener;
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

/// `127.0.0.1:<port>` for each port.
pub(crate) fn loopback(ports: &[u16]) -> Vec<String> {
    ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
}
