//! A network link with adjustable latency: a TCP relay that holds every chunk of bytes for the
//! current delay before passing it on, in each direction. This machine's kernel has no `netem`,
//! so the network drills add latency here, in the path between an instance and the store.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use sluice_core::{Clock, SystemClock};

/// A relay from `listen` to `target` (see the module documentation).
pub struct DelayLink {
    delay_ns: Arc<AtomicU64>,
    stopped: Arc<AtomicBool>,
    listen: SocketAddr,
}

impl DelayLink {
    /// Listens on `listen` (a port of its own) and relays each connection to `target`.
    pub fn start(listen: SocketAddr, target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen)?;
        let delay_ns = Arc::new(AtomicU64::new(0));
        let stopped = Arc::new(AtomicBool::new(false));
        let (delay, stop) = (delay_ns.clone(), stopped.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                for (from, to) in [(&client, &server), (&server, &client)] {
                    if let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) {
                        pump(from, to, delay.clone());
                    }
                }
            }
        });
        Ok(Self {
            delay_ns,
            stopped,
            listen,
        })
    }

    /// The latency each chunk gets from now on (each direction).
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ns
            .store(delay.as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Drop for DelayLink {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.listen, Duration::from_millis(100));
    }
}

/// Relays `from` to `to`, each chunk held until its read time plus the delay.
fn pump(mut from: TcpStream, mut to: TcpStream, delay_ns: Arc<AtomicU64>) {
    let (tx, rx) = mpsc::channel::<(u64, Vec<u8>)>();
    std::thread::spawn(move || {
        let clock = SystemClock::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = clock.now() + delay_ns.load(Ordering::Relaxed);
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        let clock = SystemClock::new();
        for (due, bytes) in rx {
            let now = clock.now();
            if due > now {
                std::thread::sleep(Duration::from_nanos(due - now));
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
