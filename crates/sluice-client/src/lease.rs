//! Token leases: the client takes tokens for a (user, item) in batches and hands them out
//! with no call per use, as the throttling-service design's `acquire_token` / `refill_token`
//! pair intends ("the client needs to batch-apply for tokens to reduce pressure on throttling
//! service; when a client acquires N tokens but only consumes M < N, the extra tokens are
//! refilled").
//!
//! - A batch is sized from the observed use rate (uses per second times
//!   [`LeaseOptions::hold`]), between [`LeaseOptions::min_batch`] and
//!   [`LeaseOptions::max_batch`].
//! - Near the limit a batch shrinks: never more than a quarter of what the server said was
//!   left, and down to single acquires, so one client cannot hoard a user's quota.
//! - Unused tokens go back (`/v1/refill`) when a lease expires ([`LeaseOptions::ttl`]), when
//!   [`Leases::close`] is called (at shutdown), and, best effort, when [`Leases`] is dropped
//!   inside a Tokio runtime.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use sluice_core::{Clock, CoarseClock};

use crate::{ClientError, SluiceClient};

/// How leases are sized and kept.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// The smallest batch (1: every acquire may be a single token).
    pub min_batch: u64,
    /// The largest batch.
    pub max_batch: u64,
    /// A batch covers this long at the observed use rate.
    pub hold: Duration,
    /// Tokens not used this long after their batch was taken go back.
    pub ttl: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            min_batch: 1,
            max_batch: 100,
            hold: Duration::from_secs(1),
            ttl: Duration::from_secs(5),
        }
    }
}

/// What the leases did: uses handed out and calls made to the servers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Uses allowed.
    pub allowed: u64,
    /// Uses denied.
    pub denied: u64,
    /// `/v1/acquire` calls.
    pub acquires: u64,
    /// `/v1/refill` calls.
    pub refills: u64,
    /// Tokens given back.
    pub returned: u64,
}

#[derive(Default)]
struct Counters {
    allowed: AtomicU64,
    denied: AtomicU64,
    acquires: AtomicU64,
    refills: AtomicU64,
    returned: AtomicU64,
}

/// One (user, item)'s lease.
#[derive(Default)]
struct Lease {
    /// Tokens held, not yet handed out.
    tokens: u64,
    /// When the held tokens go back (ns, coarse clock).
    expires_at: u64,
    /// Uses per second, smoothed.
    rate: f64,
    /// The last use (ns), for the rate.
    last_use: u64,
    /// What the server said was left after the last batch.
    server_left: Option<u64>,
}

type Key = (String, String);

/// Leases over one [`SluiceClient`]. Share it behind an `Arc`; all methods take `&self`.
pub struct Leases {
    client: Arc<SluiceClient>,
    options: LeaseOptions,
    clock: CoarseClock,
    leases: Mutex<HashMap<Key, Lease>>,
    counters: Counters,
}

impl Leases {
    /// Leases over `client`.
    pub fn new(client: Arc<SluiceClient>, options: LeaseOptions) -> Self {
        Self {
            client,
            options,
            clock: CoarseClock::new(),
            leases: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    /// One use of `item` by `user`: `true` when allowed. Served from the lease when it holds
    /// a token (no call); otherwise a batch is acquired.
    ///
    /// # Errors
    /// When no server answers, or one rejects the request.
    pub async fn take(&self, user: &str, item: &str) -> Result<bool, ClientError> {
        let now = self.clock.now();
        let (batch, expired) = {
            let mut leases = self.leases.lock();
            let lease = leases
                .entry((user.to_owned(), item.to_owned()))
                .or_default();
            observe(lease, now);
            if lease.tokens > 0 && now < lease.expires_at {
                lease.tokens -= 1;
                self.counters.allowed.fetch_add(1, Ordering::Relaxed);
                return Ok(true);
            }
            let expired = std::mem::take(&mut lease.tokens);
            (self.batch(lease), expired)
        };
        if expired > 0 {
            self.give_back(user, item, expired).await?;
        }
        let mut amount = batch;
        loop {
            self.counters.acquires.fetch_add(1, Ordering::Relaxed);
            let answer = self.client.acquire(user, item, amount, None).await?.value;
            if answer.allowed {
                let mut leases = self.leases.lock();
                let lease = leases
                    .entry((user.to_owned(), item.to_owned()))
                    .or_default();
                lease.tokens += amount - 1;
                lease.expires_at = self.clock.now() + nanos(self.options.ttl);
                lease.server_left = answer.remaining;
                self.counters.allowed.fetch_add(1, Ordering::Relaxed);
                return Ok(true);
            }
            if amount == 1 {
                self.leases
                    .lock()
                    .entry((user.to_owned(), item.to_owned()))
                    .or_default()
                    .server_left = Some(0);
                self.counters.denied.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
            // The batch did not fit: near the limit, one token at a time.
            amount = 1;
        }
    }

    /// The next batch for `lease`: the observed rate over `hold`, within the bounds, and at
    /// most a quarter of what the server said was left.
    fn batch(&self, lease: &Lease) -> u64 {
        let o = &self.options;
        let wanted = (lease.rate * o.hold.as_secs_f64()).ceil() as u64;
        let mut batch = wanted.clamp(o.min_batch.max(1), o.max_batch.max(1));
        if let Some(left) = lease.server_left {
            batch = batch.min((left / 4).max(1));
        }
        batch
    }

    /// Gives back the tokens of leases past their `ttl`; returns how many went back. Call it
    /// now and then (or let [`Leases::take`] do it for the keys it meets).
    ///
    /// # Errors
    /// When a refill cannot reach a server; the other leases are still returned.
    pub async fn return_expired(&self) -> Result<u64, ClientError> {
        let now = self.clock.now();
        let due: Vec<(Key, u64)> = {
            let mut leases = self.leases.lock();
            leases
                .iter_mut()
                .filter(|(_, l)| l.tokens > 0 && now >= l.expires_at)
                .map(|(k, l)| (k.clone(), std::mem::take(&mut l.tokens)))
                .collect()
        };
        self.return_all(due).await
    }

    /// Gives back every token held (at shutdown). Returns how many went back.
    ///
    /// # Errors
    /// When a refill cannot reach a server; the other leases are still returned.
    pub async fn close(&self) -> Result<u64, ClientError> {
        let held = self.drain();
        self.return_all(held).await
    }

    fn drain(&self) -> Vec<(Key, u64)> {
        let mut leases = self.leases.lock();
        leases
            .iter_mut()
            .filter(|(_, l)| l.tokens > 0)
            .map(|(k, l)| (k.clone(), std::mem::take(&mut l.tokens)))
            .collect()
    }

    async fn return_all(&self, held: Vec<(Key, u64)>) -> Result<u64, ClientError> {
        let mut returned = 0;
        let mut first_error = None;
        for ((user, item), tokens) in held {
            match self.give_back(&user, &item, tokens).await {
                Ok(()) => returned += tokens,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(returned),
        }
    }

    async fn give_back(&self, user: &str, item: &str, tokens: u64) -> Result<(), ClientError> {
        self.counters.refills.fetch_add(1, Ordering::Relaxed);
        self.client.refill(user, item, tokens, None).await?;
        self.counters.returned.fetch_add(tokens, Ordering::Relaxed);
        Ok(())
    }

    /// What the leases did so far.
    pub fn stats(&self) -> LeaseStats {
        let c = &self.counters;
        LeaseStats {
            allowed: c.allowed.load(Ordering::Relaxed),
            denied: c.denied.load(Ordering::Relaxed),
            acquires: c.acquires.load(Ordering::Relaxed),
            refills: c.refills.load(Ordering::Relaxed),
            returned: c.returned.load(Ordering::Relaxed),
        }
    }

    /// Tokens held now, all leases together.
    pub fn held(&self) -> u64 {
        self.leases.lock().values().map(|l| l.tokens).sum()
    }
}

impl Drop for Leases {
    /// Best effort: inside a Tokio runtime, the tokens still held go back on a spawned task.
    fn drop(&mut self) {
        let held = self.drain();
        if held.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            runtime.spawn(async move {
                for ((user, item), tokens) in held {
                    let _ = client.refill(&user, &item, tokens, None).await;
                }
            });
        }
    }
}

/// Updates the lease's smoothed use rate with a use at `now`.
fn observe(lease: &mut Lease, now: u64) {
    if lease.last_use > 0 && now > lease.last_use {
        let gap = (now - lease.last_use) as f64 / 1e9;
        let instant = 1.0 / gap.max(1e-3);
        lease.rate = if lease.rate == 0.0 {
            instant
        } else {
            0.8 * lease.rate + 0.2 * instant
        };
    }
    lease.last_use = now;
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
