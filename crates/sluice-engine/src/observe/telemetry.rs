//! Every metric family Sluice exports, in one place: its kind, its help text and the label
//! values known in advance. [`describe_metrics`] gives each family its `# HELP` and registers
//! every series whose labels are known at start at zero, so alerts and dashboards find them
//! before the first event (no `absent()` tricks). docs/OPERATIONS.md lists the same families.

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge};

/// A metric family's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up; the name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets (`_bucket`, `_sum`, `_count`).
    Histogram,
}

/// One metric family.
#[derive(Clone, Copy, Debug)]
pub struct MetricFamily {
    /// Its name, with its unit (`_seconds`) and `_total` for counters, as Prometheus names go.
    pub name: &'static str,
    /// Its kind.
    pub kind: MetricKind,
    /// Its `# HELP` line.
    pub help: &'static str,
    /// Label sets registered at start (one series each); empty with a label-less family means
    /// the single series is registered. Families whose labels name rules or listeners appear
    /// once the rule or listener exists.
    pub start: &'static [&'static [(&'static str, &'static str)]],
}

const fn family(
    name: &'static str,
    kind: MetricKind,
    help: &'static str,
    start: &'static [&'static [(&'static str, &'static str)]],
) -> MetricFamily {
    MetricFamily {
        name,
        kind,
        help,
        start,
    }
}

use MetricKind::{Counter, Gauge, Histogram};

/// No labels: the one series is registered at start.
const PLAIN: &[&[(&str, &str)]] = &[&[]];
/// Labels not known at start (rules, listeners): nothing registered up front.
const LATER: &[&[(&str, &str)]] = &[];

/// Histogram buckets for store round trips and flushes, in seconds.
pub const FLUSH_BUCKETS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// Histogram buckets for one decision (every rule of a request), in seconds.
pub const DECISION_BUCKETS: &[f64] = &[
    0.000_000_25,
    0.000_000_5,
    0.000_001,
    0.000_002_5,
    0.000_005,
    0.000_01,
    0.000_025,
    0.000_05,
    0.000_1,
    0.001,
    0.01,
    0.1,
];

/// Every family, sorted by name.
pub const METRIC_FAMILIES: &[MetricFamily] = &[
    family(
        "sluice_accept_errors_total",
        Counter,
        "Connections a listener failed to accept (label listener).",
        LATER,
    ),
    family(
        "sluice_adhoc_keys",
        Gauge,
        "Keys all ad-hoc limits of /v1/acquire keep, at the last count (their budget is api.adhoc_max_keys).",
        LATER,
    ),
    family(
        "sluice_adhoc_keys_evicted_total",
        Counter,
        "Ad-hoc keys evicted (oldest of the largest shape) to make room for a new key at the ad-hoc key budget or a shape's 100,000 keys.",
        PLAIN,
    ),
    family(
        "sluice_adhoc_shapes_evicted_total",
        Counter,
        "Ad-hoc limit shapes forgotten to stay within their budget.",
        PLAIN,
    ),
    family(
        "sluice_admin_host_refused_total",
        Counter,
        "Admin requests refused because their Host was not an address, localhost or a name in access.admin_hosts.",
        PLAIN,
    ),
    family(
        "sluice_blocked_keys",
        Gauge,
        "Keys of a rule blocked because the store reported them over their limit (a synced rule's flush, or a store decision: exact mode, a synced rule's small limit), at the last flush (label rule).",
        LATER,
    ),
    family(
        "sluice_build_info",
        Gauge,
        "Always 1; the labels say which build runs (version, commit, build_date).",
        LATER,
    ),
    family(
        "sluice_clock_offset_seconds",
        Gauge,
        "The store's clock minus this instance's, as the flushes measured it.",
        PLAIN,
    ),
    family(
        "sluice_clock_readings_ignored_total",
        Counter,
        "Readings of the store's clock not trusted (label reason).",
        &[
            &[("reason", "slow_round_trip")],
            &[("reason", "out_of_range")],
            &[("reason", "unconfirmed_jump")],
        ],
    ),
    family(
        "sluice_connections_refused_total",
        Counter,
        "Connections refused because a listener was at its connection limit (label listener).",
        LATER,
    ),
    family(
        "sluice_decision_duration_seconds",
        Histogram,
        "Time to decide one request over all its rules, sampled one request in 16.",
        PLAIN,
    ),
    family(
        "sluice_decisions_total",
        Counter,
        "Decisions per rule (labels domain, rule, outcome: allowed, denied, shadow_denied, quota_exceeded (over a quota_mode limit; the request was denied only when every quota-mode rule it matched was over); reason of a denial: local_budget, estimate, global_block, fallback, exact, cached_over_limit, store_error, cost_exceeds_limit). A rule after an enforcing denial in the same request is not counted.",
        LATER,
    ),
    family(
        "sluice_detailed_decisions_total",
        Counter,
        "Decisions per descriptor value of rules with detailed_metric: true (labels domain, rule, value, outcome); the first 100 values of a rule have their own series, later ones share value=\"_other\", values are cut to 128 bytes.",
        LATER,
    ),
    family(
        "sluice_early_syncs_total",
        Counter,
        "Keys flushed early because their span's safe share was spent.",
        PLAIN,
    ),
    family(
        "sluice_evicted_keys_total",
        Counter,
        "Idle keys a rule forgot (label rule).",
        LATER,
    ),
    family(
        "sluice_exact_breaker_fast_failures_total",
        Counter,
        "Exact-mode requests answered by the open circuit breaker without a store call.",
        PLAIN,
    ),
    family(
        "sluice_exact_breaker_opened_total",
        Counter,
        "Times the exact-mode circuit breaker opened.",
        PLAIN,
    ),
    family(
        "sluice_exact_breaker_state",
        Gauge,
        "The exact-mode circuit breaker: 0 closed, 1 open, 2 half-open.",
        PLAIN,
    ),
    family(
        "sluice_fleet_instances",
        Gauge,
        "Instances that announced themselves on the store within 90 s, this one included (0: not known yet).",
        PLAIN,
    ),
    family(
        "sluice_flush_chunks_total",
        Counter,
        "Pipelines of flushes (label result: answered, failed, not_sent).",
        &[
            &[("result", "answered")],
            &[("result", "failed")],
            &[("result", "not_sent")],
        ],
    ),
    family(
        "sluice_flush_doubts_settled_total",
        Counter,
        "Flushes whose outcome was unknown, settled by their receipt (label outcome: landed, lost).",
        &[&[("outcome", "landed")], &[("outcome", "lost")]],
    ),
    family(
        "sluice_flush_duration_seconds",
        Histogram,
        "Time of one flush to the store, every pipeline included.",
        PLAIN,
    ),
    family(
        "sluice_flush_items_held_total",
        Counter,
        "Counts kept back from a flush (label reason: unsettled, store_failed).",
        &[&[("reason", "unsettled")], &[("reason", "store_failed")]],
    ),
    family(
        "sluice_flush_items_total",
        Counter,
        "Keys sent in flushes.",
        PLAIN,
    ),
    family(
        "sluice_flushes_total",
        Counter,
        "Flushes to the store (label result: ok, error); the span sync's success and failure.",
        &[&[("result", "ok")], &[("result", "error")]],
    ),
    family(
        "sluice_live_instances",
        Gauge,
        "The most instances any key of a synced rule heard from at the last flush (label rule).",
        LATER,
    ),
    family(
        "sluice_node_estimate",
        Gauge,
        "The largest node estimate of a synced rule's keys at the last flush (label rule).",
        LATER,
    ),
    family(
        "sluice_overflow_checks_total",
        Counter,
        "Requests for keys beyond a rule's key cap, decided by its fixed-memory sketch (label rule).",
        LATER,
    ),
    family(
        "sluice_overflow_noise_floor",
        Gauge,
        "The cost an average cell of a rule's overflow sketch holds from other keys this window (its count-mean-min noise floor; label rule): a key spray raises it, and a key in the sketch may be admitted up to 6 x its square root beyond its limit.",
        LATER,
    ),
    family(
        "sluice_reloads_total",
        Counter,
        "Configuration reloads (label result: ok, error).",
        &[&[("result", "ok")], &[("result", "error")]],
    ),
    family(
        "sluice_request_body_timeouts_total",
        Counter,
        "Requests whose body did not arrive within listeners.body_read_timeout (label listener).",
        PLAIN,
    ),
    family(
        "sluice_requests_shed_total",
        Counter,
        "Requests a listener turned away (label listener: http, grpc, admin, gateway; reason: in_flight, every slot taken; waiting, dropped from a full waiting room while its body was still arriving).",
        PLAIN,
    ),
    family(
        "sluice_requests_total",
        Counter,
        "Answers of the front doors (label door: grpc, json, acquire, acquire_batch, refill, gateway, other; result: ok, over_limit, client_error, shed, bad_gateway, gateway_timeout, server_error). Requests refused before routing (connection limits, timeouts) are counted apart.",
        LATER,
    ),
    family(
        "sluice_responses_cut_total",
        Counter,
        "Gateway responses cut because the client read nothing of them for listeners.idle_timeout (its upstream connection is freed).",
        PLAIN,
    ),
    family(
        "sluice_rlqs_assignments_total",
        Counter,
        "Assignments decided on RLQS streams, one per bucket per report (label strategy: token_bucket, deny_all, allow_all and abandon, sent; unchanged, decided again but not sent: Envoy keeps the one it has).",
        LATER,
    ),
    family(
        "sluice_rlqs_refused_total",
        Counter,
        "What the RLQS door turned away (label reason: streams, a stream beyond all peers' `rlqs.max_streams`; streams_per_peer, a stream beyond a peer's; bucket_id, a bucket id refused (too many entries, a key too long, empty); buckets_per_stream, a bucket usage beyond a stream's buckets; send_timeout, a stream ended because its peer read no answer).",
        LATER,
    ),
    family(
        "sluice_rlqs_reports_total",
        Counter,
        "Usage reports counted on RLQS streams (Envoy sends one per new bucket, then one every 5 s).",
        PLAIN,
    ),
    family(
        "sluice_rlqs_streams_total",
        Counter,
        "RLQS streams opened (StreamRateLimitQuotas calls taken; an Envoy holds one for as long as it runs, and opens another after a failed one).",
        PLAIN,
    ),
    family(
        "sluice_rlqs_usage_total",
        Counter,
        "Requests Envoys reported as admitted on RLQS streams (label result: counted, in the same counters as every door; over, beyond the room and recorded all the same by synced rules; uncounted, beyond the room of a local or exact rule, which take no count without a decision).",
        LATER,
    ),
    family(
        "sluice_small_limit_calls_spent_total",
        Counter,
        "Requests of a synced rule whose limit is too small to share that its key's share decided because the rule's store calls for the second (exact.small_limit_calls) were spent (label rule).",
        LATER,
    ),
    family(
        "sluice_spill_pending_counts",
        Gauge,
        "Counts of an earlier run's spill not delivered to the store yet.",
        PLAIN,
    ),
    family(
        "sluice_spill_replayed_counts_total",
        Counter,
        "Counts of an earlier run's spill delivered or dropped (label outcome: landed, expired).",
        &[&[("outcome", "landed")], &[("outcome", "expired")]],
    ),
    family(
        "sluice_spilled_counts_total",
        Counter,
        "Counts written to the state directory at shutdown because the store did not take them.",
        PLAIN,
    ),
    family(
        "sluice_store_errors_total",
        Counter,
        "Store errors (label kind: unavailable, timeout, bad_reply, refused, read_only, redirected).",
        &[
            &[("kind", "unavailable")],
            &[("kind", "timeout")],
            &[("kind", "bad_reply")],
            &[("kind", "refused")],
            &[("kind", "read_only")],
            &[("kind", "redirected")],
        ],
    ),
    family(
        "sluice_store_up",
        Gauge,
        "1 while the shared store answers (or the store is the embedded memory store), 0 after a flush or probe failed as a whole.",
        PLAIN,
    ),
    family(
        "sluice_tls_handshake_failures_total",
        Counter,
        "TLS handshakes that failed or timed out (label listener).",
        LATER,
    ),
    family(
        "sluice_tracked_keys",
        Gauge,
        "Keys a rule tracks (label rule).",
        LATER,
    ),
    family(
        "sluice_unauthorized_total",
        Counter,
        "Requests refused for a missing or wrong bearer token.",
        PLAIN,
    ),
];

/// Gives every family its `# HELP` and registers the series known at start at zero (the store
/// as up, the breaker closed, `sluice_build_info` with the build's labels). Call once, after
/// the recorder is installed.
pub fn describe_metrics(build: BuildInfo) {
    for f in METRIC_FAMILIES {
        match f.kind {
            Counter => describe_counter!(f.name, f.help),
            Gauge => describe_gauge!(f.name, f.help),
            Histogram => describe_histogram!(f.name, Unit::Seconds, f.help),
        }
        for labels in f.start {
            let labels: Vec<(&'static str, &'static str)> = labels.to_vec();
            match f.kind {
                Counter => counter!(f.name, &labels).increment(0),
                Gauge if f.name == "sluice_store_up" => gauge!(f.name, &labels).set(1.0),
                Gauge => gauge!(f.name, &labels).set(0.0),
                Histogram => {
                    let _registered = metrics::histogram!(f.name, &labels);
                }
            }
        }
    }
    gauge!(
        "sluice_build_info",
        "version" => build.version,
        "commit" => build.commit,
        "build_date" => build.build_date
    )
    .set(1.0);
}

/// Which build runs: the labels of `sluice_build_info` (the binary knows them; the engine only
/// exports them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildInfo {
    /// The crate version, e.g. `0.1.0`.
    pub version: &'static str,
    /// The git commit it was built from (12 hex digits), or `unknown`.
    pub commit: &'static str,
    /// The build date, `YYYY-MM-DD` (UTC), or `unknown`.
    pub build_date: &'static str,
}

/// Times one decision in [`DECISION_SAMPLE`] for `sluice_decision_duration_seconds`: reading a
/// precise clock twice and recording costs more than a local decision itself, so most
/// decisions are not timed.
pub(crate) struct DecisionTimer(Option<sluice_core::Nanos>);

/// One decision in this many is timed (per thread).
pub const DECISION_SAMPLE: u32 = 16;

fn precise_clock() -> &'static sluice_core::SystemClock {
    static CLOCK: std::sync::OnceLock<sluice_core::SystemClock> = std::sync::OnceLock::new();
    CLOCK.get_or_init(sluice_core::SystemClock::new)
}

impl DecisionTimer {
    pub(crate) fn start() -> Self {
        use sluice_core::Clock as _;
        thread_local! {
            static SEEN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        let sampled = SEEN.with(|seen| {
            let n = seen.get().wrapping_add(1);
            seen.set(n);
            n % DECISION_SAMPLE == 0
        });
        Self(sampled.then(|| precise_clock().now()))
    }

    pub(crate) fn finish(self) {
        use sluice_core::Clock as _;
        if let Some(start) = self.0 {
            let took = precise_clock().now().saturating_sub(start);
            metrics::histogram!("sluice_decision_duration_seconds").record(took as f64 / 1e9);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_follow_the_prometheus_naming_conventions() {
        let mut names: Vec<&str> = METRIC_FAMILIES.iter().map(|f| f.name).collect();
        let sorted = {
            let mut s = names.clone();
            s.sort_unstable();
            s
        };
        assert_eq!(names, sorted, "sorted by name");
        names.dedup();
        assert_eq!(names.len(), METRIC_FAMILIES.len(), "no name twice");
        for f in METRIC_FAMILIES {
            assert!(f.name.starts_with("sluice_"), "{}", f.name);
            assert_eq!(
                f.kind == Counter,
                f.name.ends_with("_total"),
                "{}: counters and only counters end in _total",
                f.name
            );
            if f.kind == Histogram {
                assert!(f.name.ends_with("_seconds"), "{}: a unit", f.name);
            }
            assert!(f.help.ends_with('.') && f.help.len() > 20, "{}", f.name);
        }
    }
}
