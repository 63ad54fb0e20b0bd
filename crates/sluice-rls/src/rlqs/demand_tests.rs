//! The demand book's tests.

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

/// Stream `stream`, holding the bucket, its Envoy holding no assignment for it yet.
fn fresh(stream: u64) -> Reporter {
    Reporter {
        stream,
        keep: true,
        holds: None,
    }
}

/// Admitted `allowed` per second, nothing denied.
fn admitted(allowed: f64) -> Asked {
    Asked {
        allowed,
        denied: 0.0,
        rule_rate: 1.0,
        seconds: 5.0,
    }
}

#[test]
fn shares_follow_demand() {
    let book = DemandBook::new(10);
    let k = key("alice");
    // A new bucket: an even part over the open streams until one report interval passed.
    assert_eq!(book.share(("d", &k), (1, true), admitted(90.0), S, 2), 0.5);
    // A tenth of the room evenly, the rest by demand.
    let small = book.share(("d", &k), (2, true), admitted(10.0), 6 * S, 2);
    assert!((small - 0.14).abs() < 1e-9, "{small}");
    let big = book.share(("d", &k), (1, true), admitted(90.0), 7 * S, 2);
    assert!((big - 0.86).abs() < 1e-9, "{big}");
    // A stream whose clients paused still gets its even part.
    let paused = book.share(("d", &k), (2, true), admitted(0.0), 8 * S, 2);
    assert!((paused - 0.05).abs() < 1e-9, "{paused}");
}

#[test]
fn a_stale_demand_counts_as_the_reporting_ones_then_is_forgotten() {
    let book = DemandBook::new(10);
    let k = key("alice");
    book.share(("d", &k), (1, true), admitted(50.0), S, 2);
    // 19 s later stream 1's demand is stale: it may come back with stream 2's clients, so
    // it counts as much as stream 2's.
    assert_eq!(
        book.share(("d", &k), (2, true), admitted(5.0), 20 * S, 2),
        0.5
    );
    // A minute on, it no longer carries the bucket.
    assert_eq!(
        book.share(("d", &k), (2, true), admitted(5.0), 62 * S, 2),
        1.0
    );
}

#[test]
fn silent_rogue_streams_claim_no_more_than_they_asked() {
    let book = DemandBook::new(10);
    let k = key("victim");
    // Sixteen streams report the victim's bucket once, asking for little (denials are
    // bounded by an even part of the rule's rate), then fall silent.
    for rogue in 2..18 {
        book.share(("d", &k), (rogue, true), admitted(0.1), S, 17);
    }
    // 20 s on, the victim's Envoy reports its clients' demand: the rogues count as what
    // they asked, not as much as the victim, and a tenth of the room is split evenly.
    let share = book.share(("d", &k), (1, true), admitted(10.0), 20 * S, 17);
    assert!(share > 0.75, "{share}");
    // Counted as the victim's demand each, they would have left it 1/17.
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

/// A room of `remaining` of 100 per 20 s, `reset_secs` left.
fn room(remaining: u64, reset_secs: u64) -> Room {
    Room {
        remaining,
        reset_after: std::time::Duration::from_secs(reset_secs),
        limit: 100,
        window: std::time::Duration::from_secs(20),
        part: 1.0,
        shared: false,
    }
}

#[test]
fn an_ended_stream_keeps_what_it_admitted_since_its_last_report_out_of_the_room() {
    let k = key("alice");
    let admits = |book: &DemandBook, stream, (remaining, reset), now| {
        book.assignment(
            ("d", &k),
            fresh(stream),
            (admitted(4.0), room(remaining, reset)),
            now,
            2,
        )
        .assignment
        .admits_at_most(REPORT_EVERY)
    };
    let (forgot, kept) = (DemandBook::new(10), DemandBook::new(10));
    for book in [&forgot, &kept] {
        admits(book, 1, (80, 15), S);
        admits(book, 2, (80, 15), S);
    }
    // Stream 1 ends 3 s after its report, its Envoy having admitted 4/s since: 12
    // requests no report will count. Forgotten, they are handed out again; kept, they
    // are out of the room until the window ends.
    forgot.forget("d", 1, [k.clone()].into_iter());
    kept.ended("d", 1, [k.clone()].into_iter(), 4 * S);
    let again = admits(&forgot, 2, (60, 9), 7 * S);
    let out = admits(&kept, 2, (60, 9), 7 * S);
    assert!(out < again, "{out} vs {again}");
    assert_eq!(out, admits(&forgot, 2, (48, 9), 7 * S));
    // The next window: the estimate no longer counts. The last stream's own estimate
    // keeps the bucket in the book until its window ends, then it leaves.
    assert_eq!(
        admits(&kept, 2, (100, 19), 17 * S),
        admits(&forgot, 2, (100, 19), 17 * S)
    );
    kept.ended("d", 2, [k.clone()].into_iter(), 30 * S);
    assert_eq!(kept.len(), 1);
    admits(&kept, 3, (100, 19), 37 * S);
    kept.ended("d", 3, [k.clone()].into_iter(), 57 * S);
    assert_eq!(kept.len(), 0);
}

#[test]
fn a_reports_claimed_seconds_are_capped_by_the_time_since_its_last() {
    let k = key("alice");
    // 50 admitted, reported 1 s into a window after a report 5 s before: honestly over
    // 5 s (40 of them in the window before, given back to the window's last interval), or
    // claiming 1,000 s (nearly all of them).
    let tail = |seconds: f64| {
        let book = DemandBook::new(10);
        let first = Asked {
            allowed: 1.0,
            denied: 0.0,
            rule_rate: 5.0,
            seconds: 5.0,
        };
        book.assignment(("d", &k), fresh(1), (first, room(60, 4)), 96 * S, 1);
        let asked = Asked {
            allowed: 50.0 / seconds,
            denied: 0.0,
            rule_rate: 5.0,
            seconds,
        };
        book.assignment(("d", &k), fresh(1), (asked, room(50, 19)), 101 * S, 1);
        let last = book.assignment(("d", &k), fresh(1), (first, room(10, 4)), 116 * S, 1);
        last.assignment.admits_at_most(REPORT_EVERY)
    };
    let (honest, liar) = (tail(5.0), tail(1000.0));
    assert!(liar <= honest + 2.0, "{liar} vs {honest}");
}

/// A report of 5 s: `allowed` and `denied` per second under a rule of `rule_rate` a second.
fn report(allowed: f64, denied: f64, rule_rate: f64) -> Asked {
    Asked {
        allowed,
        denied,
        rule_rate,
        seconds: 5.0,
    }
}

#[test]
fn denials_add_at_most_what_was_admitted_and_an_even_part_of_the_rate() {
    // Admitted 4/s and denied 4/s: all of it counts.
    let a = report(4.0, 4.0, 2.0);
    assert_eq!(a.demand(2), 8.0);
    // A million denials with nothing admitted: an even part of the rule's rate.
    let rogue = report(0.0, 1e6, 2.0);
    assert_eq!(rogue.demand(2), 1.0);
    // Denials count up to what was admitted and an even part of the rate.
    let held = report(3.0, 100.0, 2.0);
    assert_eq!(held.demand(2), 7.0);
    let bad = report(f64::NAN, f64::INFINITY, -1.0);
    assert_eq!(bad.demand(1), 0.0);
}

#[test]
fn stale_and_unheld_demands_do_not_stay_in_the_book() {
    let book = DemandBook::new(10);
    // A bucket the stream does not hold is shared without entering the book: evenly, as
    // a new one.
    let share = book.share(("d", &key("x")), (1, false), admitted(5.0), S, 2);
    assert_eq!((share, book.len()), (0.5, 0));
    // Beside a kept demand, an unheld one gets its part, and is not kept.
    book.share(("d", &key("a")), (1, true), admitted(30.0), S, 2);
    let share = book.share(("d", &key("a")), (2, false), admitted(10.0), S, 2);
    assert!((share - 0.275).abs() < 1e-9, "{share}");
    assert_eq!(
        book.share(("d", &key("a")), (1, true), admitted(30.0), 6 * S, 2),
        1.0
    );
    // A bucket no one reports again leaves at the next sweep.
    book.share(("d", &key("b")), (1, true), admitted(1.0), S, 2);
    assert_eq!(book.len(), 2);
    book.share(("d", &key("c")), (1, true), admitted(1.0), 70 * S, 2);
    assert_eq!(book.len(), 1);
    // An abandoned bucket is forgotten at once.
    book.forget("d", 1, [key("c")].into_iter());
    assert_eq!(book.len(), 0);
}

#[test]
fn a_new_bucket_is_claimed_whole_and_a_kept_drained_one_its_refill() {
    // Stream 1 (4/s admitted, 4/s denied) takes 85% of the room by demand; stream 2, answered
    // a moment later, reports twice its earlier demand, so the two shares add up to 1.5.
    let k = key("alice");
    let book_with_history = || {
        let book = DemandBook::new(10);
        book.share(("d", &k), (1, true), report(8.0, 0.0, 5.0), S, 2);
        book.share(("d", &k), (2, true), report(1.0, 0.0, 5.0), S, 2);
        book
    };
    let second = |book: &DemandBook| {
        book.assignment(
            ("d", &k),
            fresh(2),
            (report(8.0, 8.0, 5.0), room(60, 14)),
            10 * S + 1_000_000,
            2,
        )
        .assignment
        .admits_at_most(REPORT_EVERY)
    };
    // Envoy 1's first token bucket (it held none): full, so its burst and refill are out of
    // the room.
    let sent = book_with_history();
    let first = sent.assignment(
        ("d", &k),
        fresh(1),
        (report(4.0, 4.0, 5.0), room(60, 14)),
        10 * S,
        2,
    );
    assert!(first.send.is_some());
    let whole = first.assignment.admits_at_most(REPORT_EVERY);
    assert!((45.0..=51.0).contains(&whole), "{first:?}");
    let after_sent = second(&sent);
    assert!(whole + after_sent <= 60.0, "{whole} + {after_sent}");
    // The same numbers again: Envoy 1 keeps its drained bucket, which admits its refill.
    let kept = book_with_history();
    let holds = Some(Sent {
        assignment: first.assignment,
        at: 9 * S,
    });
    let again = kept.assignment(
        ("d", &k),
        Reporter {
            stream: 1,
            keep: true,
            holds,
        },
        (report(4.0, 4.0, 5.0), room(60, 14)),
        10 * S,
        2,
    );
    assert_eq!(again.send, None);
    let refill = first.assignment.refills(REPORT_EVERY);
    let after_kept = second(&kept);
    assert!(
        after_kept > after_sent + 20.0,
        "{after_kept} vs {after_sent}"
    );
    assert!(refill + after_kept <= 60.0, "{refill} + {after_kept}");
}

#[test]
fn a_drained_envoy_sent_new_numbers_is_counted_for_its_old_clock_at_the_new_rate() {
    let tb = |max_tokens, tokens_per_fill| Assignment::TokenBucket {
        max_tokens,
        tokens_per_fill,
        fill_interval_secs: 10,
        ttl: super::super::sizing::ASSIGNMENT_TTL,
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
    let drained = report(4.0, 4.0, 5.0);
    // 3.3 a second, 24 deep: 16.5 refilled over a report interval, 40.5 in all.
    let new = tb(24, 33);
    // From 0.4 a second, the old bucket's fraction of a token is up to 8.25 at the new rate.
    let c = claim(new, Some(tb(1, 4)), drained);
    assert!(close(c, 16.5 + 9.0), "{c}");
    // From a like rate, about a token.
    let c = claim(new, Some(tb(2, 30)), drained);
    assert!(close(c, 16.5 + 2.0), "{c}");
    // Kept (the same numbers): its refill where drained, all of it where not.
    assert!(close(claim(new, Some(new), drained), 16.5));
    assert!(close(claim(new, Some(new), report(4.0, 0.0, 5.0)), 40.5));
    // A first token bucket, or one after a blanket rule, starts full.
    let deny = Assignment::DenyAll {
        ttl: super::super::sizing::ASSIGNMENT_TTL,
    };
    assert!(close(claim(new, Some(deny), drained), 40.5));
    assert!(close(claim(new, None, drained), 40.5));
}

#[test]
fn what_another_stream_likely_spent_since_its_report_is_out_of_the_room_shared() {
    // Two streams at 4/s admitted and 4/s denied each (they use all they get). Stream 1 was
    // answered at 10 s; stream 2's share is taken of the room less what stream 1 likely
    // admitted since: more of it the later stream 2 reports, all of it once stream 1's report
    // interval has passed, and nothing once stream 1's claim has lapsed (1.5 intervals).
    let k = key("alice");
    let at = |age_ms: u64| {
        let book = DemandBook::new(10);
        let busy = report(4.0, 4.0, 5.0);
        book.share(("d", &k), (1, true), busy, S, 2);
        book.share(("d", &k), (2, true), busy, S, 2);
        // Stream 1's second report: it used all it could (its first claim was its whole
        // assignment, and it reported more than that).
        book.assignment(("d", &k), fresh(1), (busy, room(80, 14)), 10 * S, 2);
        book.assignment(
            ("d", &k),
            fresh(2),
            (busy, room(80, 14)),
            10 * S + age_ms * 1_000_000,
            2,
        )
        .assignment
        .admits_at_most(REPORT_EVERY)
    };
    let (fresh_, half, whole, late, lapsed) = (at(1), at(2_500), at(5_000), at(7_000), at(8_000));
    assert!(half < fresh_ && whole < half, "{fresh_} {half} {whole}");
    assert_eq!(late, whole);
    assert!(lapsed > whole, "{lapsed} vs {whole}");
}

#[test]
fn a_stream_that_admits_nothing_is_not_taken_to_have_spent_its_claim() {
    // A rogue stream reports a million denials on a victim's bucket and admits nothing: it
    // gets its bounded share, but the victim's room is not cut by what it could have spent
    // since (an honest one that admits is).
    let k = key("victim");
    let victim_gets = |rogue_admits: f64, age_ms: u64| {
        let book = DemandBook::new(10);
        let rogue = report(rogue_admits, 1e6, 5.0);
        book.share(("d", &k), (1, true), rogue, S, 2);
        book.share(("d", &k), (2, true), report(8.0, 8.0, 5.0), S, 2);
        book.assignment(("d", &k), fresh(1), (rogue, room(75, 15)), 10 * S, 2);
        book.assignment(("d", &k), fresh(1), (rogue, room(75, 15)), 15 * S, 2);
        book.assignment(
            ("d", &k),
            fresh(2),
            (report(8.0, 8.0, 5.0), room(75, 14)),
            15 * S + age_ms * 1_000_000,
            2,
        )
        .assignment
        .admits_at_most(REPORT_EVERY)
    };
    assert_eq!(victim_gets(0.0, 1), victim_gets(0.0, 4_000));
    assert!(victim_gets(20.0, 4_000) < victim_gets(20.0, 1));
}

#[test]
fn an_expired_assignment_is_not_held() {
    // Envoy dropped an assignment past its time to live: the next one is sent, and counted
    // as a first bucket (full).
    let k = key("alice");
    let book = DemandBook::new(10);
    let drained = report(4.0, 4.0, 5.0);
    let first = book.assignment(("d", &k), fresh(1), (drained, room(60, 14)), 10 * S, 1);
    let holds = Some(Sent {
        assignment: first.assignment,
        at: 10 * S,
    });
    let reporter = Reporter {
        stream: 1,
        keep: true,
        holds,
    };
    let ttl = first.assignment.ttl().as_nanos() as u64;
    let later = book.assignment(
        ("d", &k),
        reporter,
        (drained, room(60, 14)),
        10 * S + ttl,
        1,
    );
    assert!(later.send.is_some(), "{later:?}");
}

#[test]
fn spare_room_is_split_half_evenly_where_the_streams_ask_for_less() {
    // 100 a 20 s window, all left: an allowance of 75 over the next report interval. Two
    // streams asking 1 and 4 a second (5 and 20 over the interval) leave 50 spare: half of
    // it evenly, half by demand.
    let r = room(100, 20);
    let quiet = with_spare(r, 0.0, (1.0, 5.0), 2.0);
    let busy = with_spare(r, 0.0, (4.0, 5.0), 2.0);
    assert!(
        (quiet * 75.0 - (5.0 + 50.0 * (0.25 + 0.5 * 0.2))).abs() < 1e-9,
        "{quiet}"
    );
    assert!(
        (busy * 75.0 - (20.0 + 50.0 * (0.25 + 0.5 * 0.8))).abs() < 1e-9,
        "{busy}"
    );
    assert!((quiet + busy - 1.0).abs() < 1e-9);
    // Asking for the allowance or more: the share by demand stands.
    assert_eq!(with_spare(r, 0.3, (6.0, 15.0), 2.0), 0.3);
    assert_eq!(with_spare(r, 0.3, (f64::NAN, 1.0), 2.0), 0.3);
}

#[test]
fn rogue_streams_that_admit_nothing_leave_a_victim_its_demand_and_half_the_spare() {
    // Ten rogue streams report a million denials each on a victim's bucket and admit nothing
    // (each claims an even part of the rule's 5 a second: 0.45); the victim admits 2 a
    // second. Together they ask for 32.7 over a report interval, less than the allowance of
    // 75: the victim gets its own 10 and at least half the spare by demand (2 of 6.5).
    let k = key("victim");
    let book = DemandBook::new(100);
    let rogue = report(0.0, 1e6, 5.0);
    let victim = report(2.0, 0.0, 5.0);
    for at in [S, 6 * S] {
        for s in 1..=10 {
            book.share(("d", &k), (s, true), rogue, at, 11);
        }
        book.share(("d", &k), (99, true), victim, at, 11);
    }
    let got = book
        .assignment(("d", &k), fresh(99), (victim, room(100, 20)), 10 * S, 11)
        .assignment
        .admits_at_most(REPORT_EVERY);
    let (asked, spare) = (
        5.0 * (2.0 + 10.0 * 5.0 / 11.0),
        75.0 - 5.0 * (2.0 + 50.0 / 11.0),
    );
    let floor = 10.0 + 0.5 * spare * 10.0 / asked;
    assert!(got >= floor - 1.0, "{got} vs {floor}");
}
