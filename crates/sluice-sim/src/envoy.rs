//! One simulated Envoy's `rate_limit_quota` filter, as Envoy 1.40 enforces assignments.
//!
//! Read from Envoy's source (`source/extensions/filters/http/rate_limit_quota/global_client_impl.cc`
//! and `source/common/common/token_bucket_impl.cc`, `AtomicTokenBucketImpl`):
//!
//! - a token bucket assignment becomes an `AtomicTokenBucketImpl(max_tokens, rate)` with
//!   `rate = tokens_per_fill / fill_interval` in whole seconds (`absl::ToInt64Seconds`); it
//!   starts full (`init_fill`) and refills continuously at `rate` up to `max_tokens` (the
//!   bucket keeps a time: tokens are `min(max_tokens, (now - time) x rate)`, and consuming
//!   moves the time on), so `fill_interval` sets the rate only, not a step;
//! - an assignment that repeats the cached token bucket's numbers (`max_tokens`,
//!   `tokens_per_fill`, `fill_interval`'s nanoseconds) keeps the bucket, any other makes a new
//!   one (`shouldReplaceTokenBucket`); blanket rules allow or deny everything;
//! - measured on the real Envoy 1.40, where the source read above says otherwise: a token
//!   bucket that replaces another takes over the old one's clock (the time its tokens count
//!   from), not full: its tokens are `min(max_tokens, (now - old time) x new rate)`. A drained
//!   bucket replaced by one of a like rate starts about empty (replacements of buckets drained
//!   at 7.5 requests a second, mid-window, admitted their refill alone: within a request, 35
//!   of 35); replaced by one several times faster, the old one's fraction of a token becomes
//!   a few (at a window's start, 0.4 a second to 3.3: 4 to 8 tokens of 16 to 26); an idle one
//!   replaced, full (400 at once). A bucket's first token bucket starts full. (Traced with
//!   `rlqs::two_envoys_hold_a_user_to_the_limit_by_demand` and `SLUICE_TEST_TRACE`.)
//! - every assignment (a repeat too) restarts its expiry timer at its TTL
//!   (`startActionExpirationTimer`); when it fires, the bucket takes its
//!   `expired_assignment_behavior` (the cached token bucket is gone, so the next token bucket
//!   assignment starts full again);
//! - a new bucket's first request follows `no_assignment_behavior`, is counted in its usage
//!   and reported at once, alone (`createBucketImpl`); then every bucket is reported on the
//!   report timer, its counts reset when the report is built, with `time_elapsed` in whole
//!   seconds since its previous report; a report built while the stream is down is dropped
//!   with its counts (`onSendReportsTimer`).
//!
//! The simulated filter uses `ALLOW_ALL` for both fallbacks, as docs/RLQS.md recommends.

use sluice_rls::rlqs::Assignment;

use crate::fleet::NS;

/// A token bucket as `AtomicTokenBucketImpl` keeps it.
#[derive(Clone, Copy, Debug)]
struct TokenBucket {
    max_tokens: f64,
    rate: f64,
    /// When the bucket would have been empty (ns): tokens are `(now - empty_at) x rate`,
    /// at most `max_tokens`.
    empty_at: f64,
}

impl TokenBucket {
    /// A full bucket at `now` (ns).
    fn full(max_tokens: u32, tokens_per_fill: u32, fill_interval_secs: u64, now: u64) -> Self {
        let rate = f64::from(tokens_per_fill) / fill_interval_secs.max(1) as f64 / NS as f64;
        // Envoy's floor on the rate keeps `max_tokens / rate` finite.
        let rate = rate.max(1e-9 / NS as f64);
        let max_tokens = f64::from(max_tokens);
        Self {
            max_tokens,
            rate,
            empty_at: now as f64 - max_tokens / rate,
        }
    }

    /// A bucket of new numbers replacing `old` at `now`: on `old`'s clock, at most its own
    /// `max_tokens`.
    fn replacing(
        old: &TokenBucket,
        (max_tokens, tokens_per_fill, fill_interval_secs): (u32, u32, u64),
        now: u64,
    ) -> Self {
        let mut new = Self::full(max_tokens, tokens_per_fill, fill_interval_secs, now);
        new.empty_at = old.empty_at.max(new.empty_at);
        new
    }

    /// Its tokens at `now`.
    fn tokens(&self, now: u64) -> f64 {
        ((now as f64 - self.empty_at) * self.rate).min(self.max_tokens)
    }

    /// Takes `n` tokens at `now` if the bucket has them.
    fn consume(&mut self, n: u64, now: u64) -> bool {
        let tokens = self.tokens(now);
        if tokens < n as f64 {
            return false;
        }
        self.empty_at = now as f64 - (tokens - n as f64) / self.rate;
        true
    }
}

/// What a bucket enforces now.
#[derive(Clone, Copy, Debug)]
enum Enforced {
    /// No assignment yet, or the last one expired: the fallback (`ALLOW_ALL`).
    Fallback,
    Blanket {
        allow: bool,
    },
    Bucket {
        numbers: Assignment,
        bucket: TokenBucket,
    },
}

/// One bucket of one Envoy.
#[derive(Clone, Debug)]
pub(crate) struct EnvoyBucket {
    enforced: Enforced,
    /// When the current assignment expires (ns).
    expires: u64,
    allowed: u64,
    denied: u64,
    last_report: u64,
}

/// One bucket's usage in a report.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Usage {
    pub(crate) key: u32,
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    /// Whole seconds since the bucket's previous report (`None`: its first report).
    pub(crate) elapsed_s: Option<u64>,
}

impl EnvoyBucket {
    /// A new bucket at `now`, its first request (`cost`) let through by
    /// `no_assignment_behavior`; returns it with that usage for the report sent at once.
    pub(crate) fn new(key: u32, cost: u64, now: u64) -> (Self, Usage) {
        let bucket = Self {
            enforced: Enforced::Fallback,
            expires: u64::MAX,
            allowed: 0,
            denied: 0,
            last_report: now,
        };
        let usage = Usage {
            key,
            allowed: cost,
            denied: 0,
            elapsed_s: None,
        };
        (bucket, usage)
    }

    /// A request costing `cost` at `now`: admitted or not, and counted.
    pub(crate) fn decide(&mut self, cost: u64, now: u64) -> bool {
        if now >= self.expires {
            self.enforced = Enforced::Fallback;
            self.expires = u64::MAX;
        }
        let allow = match &mut self.enforced {
            Enforced::Fallback => true,
            Enforced::Blanket { allow } => *allow,
            Enforced::Bucket { bucket, .. } => bucket.consume(cost, now),
        };
        if allow {
            self.allowed += cost;
        } else {
            self.denied += cost;
        }
        allow
    }

    /// Its usage for a report built at `now`, the counts reset.
    pub(crate) fn report(&mut self, key: u32, now: u64) -> Usage {
        let usage = Usage {
            key,
            allowed: std::mem::take(&mut self.allowed),
            denied: std::mem::take(&mut self.denied),
            elapsed_s: Some(now.saturating_sub(self.last_report) / NS),
        };
        self.last_report = now;
        usage
    }

    /// An assignment arrives at `now`.
    pub(crate) fn assign(&mut self, a: Assignment, now: u64) {
        if now >= self.expires {
            self.enforced = Enforced::Fallback;
        }
        self.enforced = match (a, self.enforced) {
            (Assignment::AllowAll, _) => Enforced::Blanket { allow: true },
            (Assignment::DenyAll { .. }, _) => Enforced::Blanket { allow: false },
            (
                numbers,
                Enforced::Bucket {
                    numbers: old,
                    bucket,
                },
            ) if old.same_bucket(numbers) => Enforced::Bucket { numbers, bucket },
            (
                Assignment::TokenBucket {
                    max_tokens,
                    tokens_per_fill,
                    fill_interval_secs,
                    ..
                },
                previous,
            ) => {
                let numbers = (max_tokens, tokens_per_fill, fill_interval_secs);
                let bucket = match previous {
                    Enforced::Bucket { bucket: old, .. } => {
                        TokenBucket::replacing(&old, numbers, now)
                    }
                    _ => TokenBucket::full(max_tokens, tokens_per_fill, fill_interval_secs, now),
                };
                Enforced::Bucket { numbers: a, bucket }
            }
        };
        self.expires = now.saturating_add(a.ttl().as_nanos() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TB: Assignment = Assignment::TokenBucket {
        max_tokens: 2,
        tokens_per_fill: 10,
        fill_interval_secs: 10,
        ttl: sluice_rls::rlqs::ASSIGNMENT_TTL,
    };

    const MS: u64 = NS / 1000;

    /// Requests admitted one every `every_ms` from `from_ms` until before `to_ms`.
    fn admitted(b: &mut EnvoyBucket, from_ms: u64, to_ms: u64, every_ms: u64) -> u64 {
        (from_ms..to_ms)
            .step_by(every_ms as usize)
            .map(|t| u64::from(b.decide(1, t * MS)))
            .sum()
    }

    #[test]
    fn a_token_bucket_starts_full_and_refills_at_its_rate() {
        let (mut b, _) = EnvoyBucket::new(0, 1, 0);
        b.assign(TB, 0);
        // 2 at once, then 1/s: 2 + 5 over 5 s at most, less the part of a token a request
        // every 130 ms leaves when it finds the bucket short.
        let n = admitted(&mut b, 0, 5000, 130);
        assert!((6..=7).contains(&n), "{n}");
        // A quiet spell (within the TTL) refills it to its 2, no more.
        assert_eq!(admitted(&mut b, 12_000, 12_300, 100), 2);
    }

    #[test]
    fn the_same_numbers_keep_the_bucket_and_new_numbers_keep_its_clock() {
        let (mut b, _) = EnvoyBucket::new(0, 1, 0);
        b.assign(TB, 0);
        assert_eq!(admitted(&mut b, 0, 500, 100), 2);
        b.assign(TB, NS / 2);
        assert_eq!(admitted(&mut b, 500, 900, 100), 0);
        let other = Assignment::TokenBucket {
            max_tokens: 3,
            tokens_per_fill: 10,
            fill_interval_secs: 10,
            ttl: sluice_rls::rlqs::ASSIGNMENT_TTL,
        };
        // A replacing bucket keeps the old one's clock (one token refilled since the drain at
        // the same rate), not its own three.
        b.assign(other, NS);
        assert_eq!(admitted(&mut b, 1000, 1500, 100), 1);
        // Twice the rate on the same clock: what the old one refilled counts double.
        let faster = Assignment::TokenBucket {
            max_tokens: 10,
            tokens_per_fill: 20,
            fill_interval_secs: 10,
            ttl: sluice_rls::rlqs::ASSIGNMENT_TTL,
        };
        b.assign(faster, 2 * NS);
        assert_eq!(admitted(&mut b, 2000, 2050, 10), 2);
        // After a blanket rule, a token bucket starts full.
        b.assign(
            Assignment::DenyAll {
                ttl: sluice_rls::rlqs::ASSIGNMENT_TTL,
            },
            3 * NS,
        );
        b.assign(other, 4 * NS);
        assert_eq!(admitted(&mut b, 4000, 4500, 100), 3);
    }

    #[test]
    fn an_expired_assignment_falls_back_to_allow_all() {
        let (mut b, _) = EnvoyBucket::new(0, 1, 0);
        let deny = Assignment::DenyAll {
            ttl: sluice_rls::rlqs::ASSIGNMENT_TTL,
        };
        b.assign(deny, 0);
        let ttl = deny.ttl().as_secs();
        assert!(!b.decide(1, (ttl - 1) * NS));
        assert!(b.decide(1, ttl * NS));
        let u = b.report(0, (ttl + 1) * NS);
        assert_eq!((u.allowed, u.denied, u.elapsed_s), (1, 1, Some(ttl + 1)));
    }
}
