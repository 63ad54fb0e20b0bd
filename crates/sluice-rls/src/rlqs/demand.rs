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
//! together, while what an Envoy admits is paid for out of the room (it is counted).
//!
//! A demand older than three report intervals is stale: the Envoy may have stopped asking, or
//! gone quiet with its clients and be about to come back with the others (a client behind a
//! balancer bursts on every Envoy at once). For a minute ([`CARRIER_MEMORY`]) a stale demand
//! still tells that its stream carries the bucket, and it counts as a demand like the
//! reporting stream's own (at most its own last one, so a rogue stream that asked for little
//! claims no more by falling silent): each Envoy that meets the returning burst takes an even part, where
//! counting only the fresh demands gave the first to report the whole room, the second half of
//! it, and so on. A bucket no stream reported within that minute is new: for its first report
//! interval, before every Envoy carrying it has reported, a stream's share is at most an even
//! part over the open streams. A tenth of the room ([`EVEN_FLOOR`]) is split evenly among the
//! streams carrying the bucket, the rest by demand.
//!
//! A stream that ends takes what its Envoy admitted since its last report with it (Envoy 1.40
//! sends no last report), and the window's room would be handed out again: nodes leaving one
//! by one took a window 2.3% over its limit in the simulator. So the book keeps an estimate of
//! it out of the room until that window ends ([`Unreported`]): the stream's last reported
//! admissions per second over the time since that report (at most a report interval), and no
//! more than its assignment let it admit.
//!
//! Each stream's answer also notes its claim: what its Envoy can admit until its next report,
//! as Envoy keeps its buckets ([`claim`]). Another stream's share is taken of the room less
//! what the streams answered before it have likely admitted since ([`likely_spent`]: no report
//! counted that yet), and no stream gets more than the others' claims leave.
//!
//! A stream's demands leave the book when it ends, when a bucket is abandoned or no longer
//! limited, and after [`CARRIER_MEMORY`] (when the bucket is reported again, and in a sweep
//! of the whole book at most once per three report intervals); a bucket a stream does not hold
//! (beyond its `max_buckets_per_stream`) never enters it: its share is read without being
//! kept. The book holds at most `max_keys` buckets; a bucket beyond them is shared evenly
//! among the open streams.

use std::collections::HashMap;
use std::sync::Mutex;

use sluice_core::Nanos;

use super::bucket::BucketKey;
use super::carry::{Carried, Unreported};
use super::renew::{self, Sent};
use super::sizing::{Assignment, REPORT_EVERY, Room, allowance, assign};

/// A second.
const S: Nanos = 1_000_000_000;

/// How long a stream that reported a bucket is taken to carry it.
pub const CARRIER_MEMORY: std::time::Duration = std::time::Duration::from_secs(60);

/// The part of a bucket's room split evenly among the streams carrying it, the rest by their
/// demands: a stream that admitted nothing in its last report interval (its clients paused)
/// still gets a few requests, where a share of nothing was `DENY_ALL` until its next report.
pub const EVEN_FLOOR: f64 = 0.1;

/// What a stream's Envoy can admit until its next report once it holds `after`, where it held
/// `held` before the answer. A bucket it keeps (the same numbers, or nothing sent) goes on:
/// about empty where it denied requests since its previous report (its refill), else up to
/// its burst too. A new token bucket takes over the old one's clock in Envoy 1.40 (measured:
/// drained buckets replaced mid-window admitted their refill alone, and at a window's start,
/// where the rate jumps, a few tokens more): a drained one starts with the old one's fraction
/// of a token at the new rate, at most `new rate / old rate` tokens (rounded up, and no more
/// than its burst); one that replaces no token bucket (a first one, or after a blanket rule)
/// or one that was not drained starts full.
fn claim(after: Assignment, held: Option<Assignment>, asked: Asked) -> f64 {
    let refill = after.refills(REPORT_EVERY);
    let whole = after.admits_at_most(REPORT_EVERY);
    let drained = asked.denied > 0.0;
    let claim = match held {
        Some(old) if old.same_bucket(after) => {
            if drained {
                refill
            } else {
                whole
            }
        }
        Some(old @ Assignment::TokenBucket { .. }) if drained => {
            let second = std::time::Duration::from_secs(1);
            let ratio = after.refills(second) / old.refills(second).max(1e-9);
            refill + (whole - refill).min(ratio.ceil())
        }
        _ => whole,
    };
    if claim.is_finite() {
        claim.clamp(0.0, 1e12)
    } else {
        1e12
    }
}

/// What a stream answered `age` ago has likely admitted since: the part of its `claim` it
/// used last time (`used`: what its last report counted of what it could admit before it),
/// over the part of the report interval gone (all of it once the interval has passed, until
/// its report counts it). A stream that reports denials but admits nothing takes no more of
/// the others' room through this than through its share.
fn likely_spent(claim: f64, used: f64, age: Nanos) -> f64 {
    let interval = REPORT_EVERY.as_nanos() as f64;
    let spent = claim * used.clamp(0.0, 1.0) * (age as f64 / interval).min(1.0);
    if spent.is_finite() {
        spent.max(0.0)
    } else {
        0.0
    }
}

/// The part of the spare room split evenly among the streams carrying a bucket, the rest by
/// demand.
const SPARE_EVEN: f64 = 0.5;

/// A stream's share of `room`'s allowance where the streams together ask for less than it
/// (`own` and `total` demands per second, over `carriers` streams): what its demand asks for
/// over a report interval and a part of the rest, [`SPARE_EVEN`] of it split evenly and the
/// rest by demand, so that every stream's demand is met (split by demand alone, the spare went
/// mostly to the busiest stream, and a burst on a quiet one met a bucket of its tenth).
/// Otherwise `share`, by demand.
fn with_spare(room: Room, share: f64, (own, total): (f64, f64), carriers: f64) -> f64 {
    let h = REPORT_EVERY.as_secs_f64();
    let whole = allowance(room, REPORT_EVERY) * room.part.clamp(0.0, 1.0);
    let asked = total * h;
    if !(whole > 0.0 && asked < whole && carriers >= 1.0 && own.is_finite() && asked.is_finite()) {
        return share;
    }
    let by_demand = if asked > 0.0 {
        own * h / asked
    } else {
        1.0 / carriers
    };
    let spare = (whole - asked) * (SPARE_EVEN / carriers + (1.0 - SPARE_EVEN) * by_demand);
    ((own * h + spare) / whole).clamp(0.0, 1.0)
}

/// A stream reporting a bucket.
#[derive(Clone, Copy, Debug)]
pub struct Reporter {
    /// The stream's id.
    pub stream: u64,
    /// Whether the stream holds the bucket (beyond its `max_buckets_per_stream` it does not:
    /// its demand is read, not kept).
    pub keep: bool,
    /// The assignment last sent to it for the bucket (what its Envoy holds), and when.
    pub holds: Option<Sent>,
}

/// A report's answer for one bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Answer {
    /// The stream's assignment now.
    pub assignment: Assignment,
    /// What the answer carries ([`renew::answer`]): nothing where Envoy keeps what it holds.
    pub send: Option<Assignment>,
}

/// One stream's demand for one bucket.
#[derive(Clone, Copy, Debug)]
struct Demand {
    stream: u64,
    per_second: f64,
    /// What it reported admitted, per second.
    allowed: f64,
    at: Nanos,
    /// What its Envoy can admit until its next report, as it holds its bucket after the
    /// answer at `at` ([`claim`]).
    claim: f64,
    /// The part of its previous claim its report at `at` counted admitted (1 for a first
    /// report: it may spend all of it).
    used: f64,
    /// When the window of the report at `at` ends (`at` where no rule limits the bucket).
    window_ends: Nanos,
}

impl Demand {
    /// What its Envoy admitted since this report, as estimated when its stream ended at
    /// `now`: its admissions per second over the time since (at most a report interval), no
    /// more than its assignment let it admit.
    fn unreported(&self, now: Nanos) -> f64 {
        let since = now
            .saturating_sub(self.at)
            .min(REPORT_EVERY.as_nanos() as u64);
        (self.allowed * since as f64 / 1e9).min(self.claim)
    }
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
    /// The seconds the report covers (0: a bucket's first report, of the request that made
    /// it).
    pub seconds: f64,
}

impl Asked {
    /// A report's `allowed` and `denied` requests over `elapsed` seconds (at least one: Envoy's
    /// first report of a bucket has none, and its times are whole seconds), under `room`'s rule.
    pub fn per_second(allowed: u64, denied: u64, elapsed: f64, room: Room) -> Self {
        let seconds = if elapsed.is_finite() {
            elapsed.max(0.0)
        } else {
            0.0
        };
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
            seconds,
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
    keys: HashMap<(String, BucketKey), Entry>,
    swept: Nanos,
}

/// A bucket's demands, when a stream first reported it, and what ended streams took with
/// them.
#[derive(Debug, Default)]
struct Entry {
    first: Nanos,
    demands: Vec<Demand>,
    unreported: Unreported,
    carried: Carried,
}

impl Entry {
    fn new(first: Nanos) -> Self {
        Self {
            first,
            ..Self::default()
        }
    }

    /// Whether it still says anything at `now`.
    fn live(&self, now: Nanos) -> bool {
        !self.demands.is_empty() || self.unreported.at(now) > 0.0
    }
}

impl Book {
    /// Drops demands older than `forget_before`, and buckets left without any.
    fn sweep(&mut self, now: Nanos, forget_before: Nanos) {
        self.swept = now;
        self.keys.retain(|_, entry| {
            entry.demands.retain(|d| d.at >= forget_before);
            entry.live(now)
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
    /// evenly when the book is full). The door and the simulator take the assignment
    /// ([`assignment`](Self::assignment)); the share alone is for the tests.
    #[cfg(test)]
    fn share(
        &self,
        bucket: (&str, &BucketKey),
        stream: (u64, bool),
        asked: Asked,
        now: Nanos,
        open_streams: usize,
    ) -> f64 {
        let (stream, keep) = stream;
        let reporter = Reporter {
            stream,
            keep,
            holds: None,
        };
        self.update(bucket, reporter, (asked, None), now, open_streams)
            .0
    }

    /// Notes the `reporter` stream's demand for a bucket (unless it does not hold the bucket;
    /// `open_streams` divides it evenly when the book is full), and returns its answer under
    /// `room`: its share of the room, and no more than the other streams' assignments have
    /// left unclaimed. What another stream's Envoy can admit until its next report (due a
    /// report interval after its last answer; counted for half an interval more, in case it is
    /// late) is out of the room until that report counts it: two Envoys answered a moment
    /// apart each took their share of the same room, and together more than it.
    pub fn assignment(
        &self,
        bucket: (&str, &BucketKey),
        reporter: Reporter,
        (asked, room): (Asked, Room),
        now: Nanos,
        open_streams: usize,
    ) -> Answer {
        let (_, answer) = self.update(bucket, reporter, (asked, Some(room)), now, open_streams);
        answer.unwrap_or(Answer {
            assignment: Assignment::AllowAll,
            send: Some(Assignment::AllowAll),
        })
    }

    fn update(
        &self,
        (domain, key): (&str, &BucketKey),
        reporter: Reporter,
        (asked, room): (Asked, Option<Room>),
        now: Nanos,
        open_streams: usize,
    ) -> (f64, Option<Answer>) {
        let Reporter {
            stream,
            keep,
            holds,
        } = reporter;
        // An assignment past its time to live is gone from Envoy (its next token bucket starts
        // full): nothing is held.
        let holds = holds.filter(|h| h.expires() > now);
        let even = 1.0 / open_streams.max(1) as f64;
        let interval = REPORT_EVERY.as_nanos() as u64;
        let stale_before = now.saturating_sub(3 * interval);
        // A claim stands until its stream's next report, due a report interval after it;
        // half an interval more for one that comes late.
        let claims_after = now.saturating_sub(interval + interval / 2);
        let forget_before = now.saturating_sub(CARRIER_MEMORY.as_nanos() as u64);
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        if now.saturating_sub(book.swept) >= 3 * interval {
            book.sweep(now, forget_before);
        }
        let full = book.keys.len() >= self.max_keys;
        let k = (domain.to_owned(), key.clone());
        let mut unkept = Entry::new(now);
        let entry = match book.keys.get_mut(&k) {
            Some(e) => e,
            None if !keep => &mut unkept,
            None if full => {
                let answer = room.map(|r| {
                    let assignment = assign(Some(r), even);
                    Answer {
                        assignment,
                        send: renew::answer(holds, assignment, now),
                    }
                });
                return (even, answer);
            }
            None => book.keys.entry(k).or_insert(Entry::new(now)),
        };
        // A report covers at most the time since this stream's previous one (and a new
        // stream's, two report intervals): `time_elapsed` is the client's word.
        let covers = entry
            .demands
            .iter()
            .find(|d| d.stream == stream)
            .map_or(2 * interval, |d| now.saturating_sub(d.at).saturating_add(S))
            .min(2 * interval);
        let used = entry
            .demands
            .iter()
            .find(|d| d.stream == stream && d.claim > 0.0)
            .map_or(1.0, |d| {
                let counted = asked.allowed * asked.seconds.max(1.0);
                if counted.is_finite() {
                    (counted / d.claim).clamp(0.0, 1.0)
                } else {
                    1.0
                }
            });
        entry
            .demands
            .retain(|d| d.at >= forget_before && d.stream != stream);
        let (fresh, stale): (Vec<&Demand>, Vec<&Demand>) =
            entry.demands.iter().partition(|d| d.at >= stale_before);
        let streams = entry.demands.len() + 1;
        let own = asked.demand(streams);
        let others: f64 = fresh.iter().map(|d| d.per_second).sum();
        let claims: Vec<&Demand> = fresh
            .iter()
            .copied()
            .filter(|d| d.at > claims_after)
            .collect();
        // What the other streams' Envoys can admit until their next reports, and what they
        // have likely admitted of it since their last ones: no report counted that yet, so the
        // room read now is short of it (two Envoys reporting a moment apart: the first to
        // report would otherwise share out what the second had spent, and leave it nothing).
        let unreported = entry.unreported.at(now);
        let claimed = claims.iter().map(|d| d.claim).sum::<f64>() + unreported;
        let spent = claims
            .iter()
            .map(|d| likely_spent(d.claim, d.used, now.saturating_sub(d.at)))
            .sum::<f64>()
            + unreported;
        let carriers = (fresh.len() + stale.len() + 1) as f64;
        // A stale stream counts as much as this one's demand, at most its own last one: a
        // stream that asked for little (a rogue one reporting denials on someone's bucket,
        // bounded above) cannot claim more by falling silent.
        let returning: f64 = stale.iter().map(|d| d.per_second.min(own)).sum();
        let by_demand = match others + own + returning {
            total if total > 0.0 => own / total,
            _ => 1.0 / carriers,
        };
        let share = EVEN_FLOOR / carriers + (1.0 - EVEN_FLOOR) * by_demand;
        let new = now.saturating_sub(entry.first) < interval;
        let share = if new { share.min(even) } else { share };
        if let Some(r) = room {
            let allowed = asked.allowed * asked.seconds;
            let seconds = asked.seconds.min(covers as f64 / S as f64);
            entry.carried.add(allowed, seconds, r, now);
        }
        let room = room.map(|r| entry.carried.spendable(r, REPORT_EVERY, now));
        let answer = room.map(|r| {
            let room_now = Room {
                remaining: r.remaining.saturating_sub(spent.round() as u64),
                ..r
            };
            let share = with_spare(room_now, share, (own, others + own + returning), carriers);
            let share = if new { share.min(even) } else { share };
            let mine = assign(Some(room_now), share);
            let unclaimed = Room {
                remaining: r.remaining.saturating_sub(claimed.ceil() as u64),
                ..r
            };
            let left = assign(Some(unclaimed), 1.0);
            let at_most = |a: Assignment| a.admits_at_most(REPORT_EVERY);
            let assignment = if at_most(left) < at_most(mine) {
                left
            } else {
                mine
            };
            let assignment = if asked.denied > 0.0 && !r.shared {
                assignment.drained()
            } else {
                assignment
            };
            Answer {
                assignment,
                send: renew::answer(holds, assignment, now),
            }
        });
        if keep {
            let allowed = asked.allowed;
            entry.demands.push(Demand {
                stream,
                per_second: own,
                allowed: if allowed.is_finite() {
                    allowed.max(0.0)
                } else {
                    0.0
                },
                at: now,
                used,
                claim: answer.map_or(0.0, |a| {
                    let held = holds.map(|h| h.assignment);
                    let after = a.send.or(held).unwrap_or(a.assignment);
                    claim(after, held, asked)
                }),
                window_ends: room.map_or(now, |r| {
                    now.saturating_add(r.reset_after.as_nanos().min(u64::MAX as u128) as u64)
                }),
            });
        }
        (share, answer)
    }

    /// Forgets a stream's demands for `keys` it abandoned or that no rule limits any more.
    pub fn forget(&self, domain: &str, stream: u64, keys: impl Iterator<Item = BucketKey>) {
        self.remove(domain, stream, keys, None);
    }

    /// Forgets the demands of a stream that ended at `now` for the buckets it held (`keys`),
    /// keeping what it admitted since its last reports out of their rooms until their windows
    /// end ([`Unreported`]).
    pub fn ended(
        &self,
        domain: &str,
        stream: u64,
        keys: impl Iterator<Item = BucketKey>,
        now: Nanos,
    ) {
        self.remove(domain, stream, keys, Some(now));
    }

    fn remove(
        &self,
        domain: &str,
        stream: u64,
        keys: impl Iterator<Item = BucketKey>,
        ended: Option<Nanos>,
    ) {
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            let k = (domain.to_owned(), key);
            let Some(entry) = book.keys.get_mut(&k) else {
                continue;
            };
            if let Some(now) = ended {
                let gone = entry.demands.iter().find(|d| d.stream == stream).copied();
                if let Some(d) = gone {
                    // At most a minute: a window of a day would keep the bucket in the book
                    // for the day.
                    let until = d
                        .window_ends
                        .min(now.saturating_add(CARRIER_MEMORY.as_nanos() as u64));
                    entry.unreported.add(d.unreported(now), until, now);
                }
            }
            entry.demands.retain(|d| d.stream != stream);
            let live = match ended {
                Some(now) => entry.live(now),
                None => !entry.demands.is_empty(),
            };
            if !live {
                book.keys.remove(&k);
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
#[path = "demand_tests.rs"]
mod tests;
