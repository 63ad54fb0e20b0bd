//! Each Envoy's demand for each bucket, across the streams of this instance: the shares an
//! assignment divides the room by.
//!
//! A stream's demand for a bucket is what it reported per second since its previous report:
//! what it admitted, and what it denied (what its clients asked for beyond it) up to a bound.
//! Denied requests cost an Envoy nothing to report, so without a bound a rogue Envoy that
//! reports a million denials on a victim's bucket would take nearly all of its room. A
//! stream's denials add at most what it admitted plus an even part of the rule's rate (its
//! limit per second over the streams reporting the bucket). An Envoy held at `DENY_ALL` can
//! still claim its even part and come back; Envoys over the limit together keep their whole
//! demand while their denials stay within that (two Envoys at 3x a limit each deny twice
//! what they admit: admitted plus half the rate covers it), so their shares stay as steady as
//! their clients; and rogue Envoys that admit nothing claim less than the rule's rate all
//! together, while what an Envoy admits is paid for out of the room (it is counted). Demands
//! older than three report intervals are forgotten (an Envoy that stopped reporting a bucket
//! no longer asks for it): when the bucket is reported again, and in a sweep of the whole book
//! at most once per three report intervals. A stream's demands leave the book when it ends,
//! when a bucket is abandoned or no longer limited, and a bucket a stream does not hold
//! (beyond its `max_buckets_per_stream`) never enters it: its share is read without being
//! kept. The book holds at most `max_keys` buckets; a bucket beyond them is shared evenly
//! among the open streams.

use std::collections::HashMap;
use std::sync::Mutex;

use sluice_core::Nanos;

use super::bucket::BucketKey;
use super::sizing::{REPORT_EVERY, Room};

/// One stream's demand for one bucket.
#[derive(Clone, Copy, Debug)]
struct Demand {
    stream: u64,
    per_second: f64,
    at: Nanos,
}

/// What a stream reported for a bucket, per second, and its rule's rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Asked {
    /// Requests admitted per second.
    pub allowed: f64,
    /// Requests denied per second.
    pub denied: f64,
    /// The rule's limit per second.
    pub rule_rate: f64,
}

impl Asked {
    /// A report's `allowed` and `denied` requests over `elapsed` seconds (at least one: Envoy's
    /// first report of a bucket has none, and its times are whole seconds), under `room`'s rule.
    pub fn per_second(allowed: u64, denied: u64, elapsed: f64, room: Room) -> Self {
        let elapsed = elapsed.max(1.0);
        let window = room.window.as_secs_f64();
        Self {
            allowed: allowed as f64 / elapsed,
            denied: denied as f64 / elapsed,
            rule_rate: if window > 0.0 {
                room.limit as f64 / window
            } else {
                0.0
            },
        }
    }

    /// The demand it stands for among `streams` streams reporting the bucket.
    fn demand(self, streams: usize) -> f64 {
        let clean = |x: f64| if x.is_finite() { x.max(0.0) } else { 0.0 };
        let (allowed, denied) = (clean(self.allowed), clean(self.denied));
        let even = clean(self.rule_rate) / streams.max(1) as f64;
        allowed + denied.min(allowed + even)
    }
}

/// The book of demands.
#[derive(Debug)]
pub struct DemandBook {
    book: Mutex<Book>,
    max_keys: usize,
}

#[derive(Debug, Default)]
struct Book {
    keys: HashMap<(String, BucketKey), Vec<Demand>>,
    swept: Nanos,
}

impl Book {
    /// Drops demands older than `forget_before`, and buckets left without any.
    fn sweep(&mut self, now: Nanos, forget_before: Nanos) {
        self.swept = now;
        self.keys.retain(|_, demands| {
            demands.retain(|d| d.at >= forget_before);
            !demands.is_empty()
        });
    }
}

impl DemandBook {
    /// A book of at most `max_keys` buckets.
    pub fn new(max_keys: usize) -> Self {
        Self {
            book: Mutex::new(Book::default()),
            max_keys,
        }
    }

    /// Notes `stream`'s demand for a bucket (unless `keep` is false: a bucket the stream does
    /// not hold) and returns its share of the bucket's demand (`open_streams` divides it
    /// evenly when the book is full).
    pub fn share(
        &self,
        (domain, key): (&str, &BucketKey),
        (stream, keep): (u64, bool),
        asked: Asked,
        now: Nanos,
        open_streams: usize,
    ) -> f64 {
        let even = 1.0 / open_streams.max(1) as f64;
        let forget_after = 3 * REPORT_EVERY.as_nanos() as u64;
        let forget_before = now.saturating_sub(forget_after);
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        if now.saturating_sub(book.swept) >= forget_after {
            book.sweep(now, forget_before);
        }
        let full = book.keys.len() >= self.max_keys;
        let k = (domain.to_owned(), key.clone());
        let mut unkept = Vec::new();
        let demands = match book.keys.get_mut(&k) {
            Some(d) => d,
            None if !keep => &mut unkept,
            None if full => return even,
            None => book.keys.entry(k).or_default(),
        };
        demands.retain(|d| d.at >= forget_before && d.stream != stream);
        let per_second = asked.demand(demands.len() + 1);
        let others: f64 = demands.iter().map(|d| d.per_second).sum();
        let streams = demands.len() + 1;
        if keep {
            demands.push(Demand {
                stream,
                per_second,
                at: now,
            });
        }
        let total = others + per_second;
        if total <= 0.0 {
            return 1.0 / streams as f64;
        }
        per_second / total
    }

    /// Forgets a stream's demands for `keys` (it ended, or abandoned them).
    pub fn forget(&self, domain: &str, stream: u64, keys: impl Iterator<Item = BucketKey>) {
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            let k = (domain.to_owned(), key);
            if let Some(demands) = book.keys.get_mut(&k) {
                demands.retain(|d| d.stream != stream);
                if demands.is_empty() {
                    book.keys.remove(&k);
                }
            }
        }
    }

    /// Buckets in the book.
    pub fn len(&self) -> usize {
        self.book
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys
            .len()
    }

    /// Whether the book holds no bucket.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RlsOptions;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;

    fn key(user: &str) -> BucketKey {
        let id = BucketId {
            bucket: [("user".to_owned(), user.to_owned())].into(),
        };
        super::super::bucket::Bucket::read(&id, &RlsOptions::default())
            .unwrap()
            .key
    }

    const S: u64 = 1_000_000_000;

    /// Admitted `allowed` per second, nothing denied.
    fn admitted(allowed: f64) -> Asked {
        Asked {
            allowed,
            denied: 0.0,
            rule_rate: 1.0,
        }
    }

    #[test]
    fn shares_follow_demand() {
        let book = DemandBook::new(10);
        let k = key("alice");
        assert_eq!(book.share(("d", &k), (1, true), admitted(90.0), S, 2), 1.0);
        let small = book.share(("d", &k), (2, true), admitted(10.0), S, 2);
        assert!((small - 0.1).abs() < 1e-9, "{small}");
        let big = book.share(("d", &k), (1, true), admitted(90.0), 2 * S, 2);
        assert!((big - 0.9).abs() < 1e-9, "{big}");
    }

    #[test]
    fn old_demand_is_forgotten() {
        let book = DemandBook::new(10);
        let k = key("alice");
        book.share(("d", &k), (1, true), admitted(50.0), S, 2);
        assert_eq!(
            book.share(("d", &k), (2, true), admitted(50.0), 20 * S, 2),
            1.0
        );
    }

    #[test]
    fn a_full_book_shares_evenly_and_ended_streams_leave_it() {
        let book = DemandBook::new(1);
        book.share(("d", &key("a")), (1, true), admitted(5.0), S, 4);
        assert_eq!(
            book.share(("d", &key("b")), (1, true), admitted(5.0), S, 4),
            0.25
        );
        assert_eq!(book.len(), 1);
        book.forget("d", 1, [key("a")].into_iter());
        assert_eq!(book.len(), 0);
    }

    #[test]
    fn denials_add_at_most_what_was_admitted_and_an_even_part_of_the_rate() {
        // Admitted 4/s and denied 4/s: all of it counts.
        let a = Asked {
            allowed: 4.0,
            denied: 4.0,
            rule_rate: 2.0,
        };
        assert_eq!(a.demand(2), 8.0);
        // A million denials with nothing admitted: an even part of the rule's rate.
        let rogue = Asked {
            allowed: 0.0,
            denied: 1e6,
            rule_rate: 2.0,
        };
        assert_eq!(rogue.demand(2), 1.0);
        // Denials count up to what was admitted and an even part of the rate.
        let held = Asked {
            allowed: 3.0,
            denied: 100.0,
            rule_rate: 2.0,
        };
        assert_eq!(held.demand(2), 7.0);
        let bad = Asked {
            allowed: f64::NAN,
            denied: f64::INFINITY,
            rule_rate: -1.0,
        };
        assert_eq!(bad.demand(1), 0.0);
    }

    #[test]
    fn stale_and_unheld_demands_do_not_stay_in_the_book() {
        let book = DemandBook::new(10);
        // A bucket the stream does not hold is shared without entering the book.
        let share = book.share(("d", &key("x")), (1, false), admitted(5.0), S, 2);
        assert_eq!((share, book.len()), (1.0, 0));
        // Beside a kept demand, an unheld one gets its part, and is not kept.
        book.share(("d", &key("a")), (1, true), admitted(30.0), S, 2);
        let share = book.share(("d", &key("a")), (2, false), admitted(10.0), S, 2);
        assert!((share - 0.25).abs() < 1e-9, "{share}");
        assert_eq!(
            book.share(("d", &key("a")), (1, true), admitted(30.0), S, 2),
            1.0
        );
        // A bucket no one reports again leaves at the next sweep.
        book.share(("d", &key("b")), (1, true), admitted(1.0), S, 2);
        assert_eq!(book.len(), 2);
        book.share(("d", &key("c")), (1, true), admitted(1.0), 40 * S, 2);
        assert_eq!(book.len(), 1);
        // An abandoned bucket is forgotten at once.
        book.forget("d", 1, [key("c")].into_iter());
        assert_eq!(book.len(), 0);
    }
}
