//! What a reload changes: the rules and defaults (a new engine), the Envoy and HTTP API
//! answers (`api.domain`, `rls.response_headers`) and each running gateway's policy and
//! upstream. Settings read only at start (the store, listeners, bounds, tokens, new or removed
//! gateways) stay as they are, and the reload's answer and log name each one.

use std::net::SocketAddr;

use sluice_config::{Gateway, ServiceConfig};

/// The changes a new config makes to the running one, by whether a reload applies them.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Changes {
    /// Applied by this reload (besides the rules, which the engine reports).
    pub applied: Vec<String>,
    /// Read at start: the running value stays until a restart.
    pub need_restart: Vec<String>,
}

/// `running`: the settings in effect (the start's, with every earlier reload's applied part).
pub(crate) fn changes(running: &ServiceConfig, new: &ServiceConfig) -> Changes {
    let mut need_restart = settings_read_at_start(running, new);
    need_restart.extend(gateways_read_at_start(running, new));
    Changes {
        applied: applied(running, new),
        need_restart,
    }
}

/// What this reload applies: the answers' settings and the running gateways' policies.
fn applied(running: &ServiceConfig, new: &ServiceConfig) -> Vec<String> {
    let mut out = Vec::new();
    let mut applied = |changed: bool, what: &str| {
        if changed {
            out.push(what.to_owned());
        }
    };
    applied(running.api_domain != new.api_domain, "api.domain");
    applied(
        running.rls_response_headers != new.rls_response_headers,
        "rls.response_headers",
    );
    applied(running.headers != new.headers, "headers");
    for g in &new.gateways {
        if let Some(old) = running.gateways.iter().find(|o| o.listen == g.listen) {
            let fields = gateway_changes(old, g);
            if !fields.is_empty() {
                out.push(format!("gateway {} ({})", g.listen, fields.join(", ")));
            }
        }
    }
    out
}

/// The service's settings read only at start that differ.
fn settings_read_at_start(running: &ServiceConfig, new: &ServiceConfig) -> Vec<String> {
    let mut out = Vec::new();
    let mut restart = |changed: bool, what: &str| {
        if changed {
            out.push(what.to_owned());
        }
    };
    restart(running.store != new.store, "store");
    restart(running.store_ca_file != new.store_ca_file, "store_ca_file");
    restart(running.listen.http != new.listen.http, "listen.http");
    restart(running.listen.grpc != new.listen.grpc, "listen.grpc");
    restart(running.listen.admin != new.listen.admin, "listen.admin");
    restart(running.api_workers != new.api_workers, "api.workers");
    restart(
        running.expected_instances != new.expected_instances,
        "expected_instances",
    );
    restart(
        running.max_keys_per_rule != new.max_keys_per_rule,
        "max_keys_per_rule",
    );
    restart(
        running.flush_chunk_items != new.flush_chunk_items,
        "flush_chunk_items",
    );
    restart(running.store_timeout != new.store_timeout, "store_timeout");
    restart(
        running.flush_timeout_per_key != new.flush_timeout_per_key,
        "flush_timeout_per_key",
    );
    restart(running.exact != new.exact, "exact");
    restart(
        running.lifecycle.shutdown_timeout != new.lifecycle.shutdown_timeout,
        "shutdown_timeout",
    );
    restart(
        running.lifecycle.state_dir != new.lifecycle.state_dir,
        "state_dir",
    );
    restart(running.listeners != new.listeners, "listeners");
    restart(running.rlqs != new.rlqs, "rlqs");
    restart(running.access != new.access, "access");
    restart(running.geoip != new.geoip, "geoip");
    out
}

/// Gateways added or removed, and running gateways whose worker count changed.
fn gateways_read_at_start(running: &ServiceConfig, new: &ServiceConfig) -> Vec<String> {
    let mut out = Vec::new();
    let listens = |gs: &[Gateway]| gs.iter().map(|g| g.listen).collect::<Vec<SocketAddr>>();
    let (old, now) = (listens(&running.gateways), listens(&new.gateways));
    for added in now.iter().filter(|l| !old.contains(l)) {
        out.push(format!("gateway {added} (new)"));
    }
    for removed in old.iter().filter(|l| !now.contains(l)) {
        out.push(format!("gateway {removed} (removed; still serving)"));
    }
    for g in &new.gateways {
        if let Some(old) = running.gateways.iter().find(|o| o.listen == g.listen)
            && old.workers != g.workers
        {
            out.push(format!("gateway {} (workers)", g.listen));
        }
    }
    out
}

/// The fields of a gateway that differ (those a reload applies).
fn gateway_changes(old: &Gateway, new: &Gateway) -> Vec<&'static str> {
    let mut fields = Vec::new();
    let mut diff = |changed: bool, field| {
        if changed {
            fields.push(field);
        }
    };
    diff(old.upstream != new.upstream, "upstream");
    diff(old.domain != new.domain, "domain");
    diff(old.headers != new.headers, "headers");
    diff(old.routes != new.routes, "routes");
    diff(
        old.upstream_timeout != new.upstream_timeout,
        "upstream_timeout",
    );
    diff(
        old.refund_upstream_failures != new.refund_upstream_failures,
        "refund_upstream_failures",
    );
    diff(old.trusted_hops != new.trusted_hops, "trusted_hops");
    let (was, is) = (old.path_matching, new.path_matching);
    diff(
        was.case_sensitive != is.case_sensitive,
        "case_sensitive_paths",
    );
    diff(
        was.strict_trailing_slash != is.strict_trailing_slash,
        "strict_trailing_slash",
    );
    diff(
        was.strict_path_parameters != is.strict_path_parameters,
        "strict_path_parameters",
    );
    diff(was.strict_head != is.strict_head, "strict_head");
    diff(
        was.strict_query_separators != is.strict_query_separators,
        "strict_query_separators",
    );
    diff(
        was.strict_query_names != is.strict_query_names,
        "strict_query_names",
    );
    diff(
        was.ignore_method_override != is.ignore_method_override,
        "ignore_method_override",
    );
    fields
}

/// `new` with every setting a reload does not apply taken from `running`: what is in effect
/// after the reload.
pub(crate) fn in_effect(running: &ServiceConfig, new: &ServiceConfig) -> ServiceConfig {
    let mut effect = running.clone();
    effect.rules = new.rules.clone();
    effect.rule_paths = new.rule_paths.clone();
    effect.defaults = new.defaults.clone();
    effect.api_domain = new.api_domain.clone();
    effect.rls_response_headers = new.rls_response_headers;
    effect.adhoc_max_keys = new.adhoc_max_keys;
    effect.headers = new.headers;
    for g in &mut effect.gateways {
        if let Some(n) = new.gateways.iter().find(|n| n.listen == g.listen) {
            let workers = g.workers;
            *g = n.clone();
            g.workers = workers;
        }
    }
    effect
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> ServiceConfig {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sluice-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{n}.yaml"));
        std::fs::write(&file, text).unwrap();
        // Parsed as text: these configs have gateways and no rules.
        sluice_config::parse_service(&file, text).unwrap()
    }

    const BASE: &str = "store: memory://
headers: ietf
gateways:
  - listen: 127.0.0.1:18000
    upstream: http://127.0.0.1:3000
    domain: edge
    routes:
      - match: { path_prefix: / }
        rate_limits:
          - actions:
              - request_headers: { header_name: x-user-id, descriptor_key: user }
";

    #[test]
    fn header_route_and_api_changes_are_applied_listeners_need_a_restart() {
        let running = config(BASE);
        let new = config(
            &BASE
                .replace(
                    "headers: ietf",
                    "headers: both\nlisten: { http: 127.0.0.1:18080 }",
                )
                .replace("x-user-id", "x-api-user")
                .replace(
                    "upstream: http://127.0.0.1:3000",
                    "upstream: http://127.0.0.1:3001\n    upstream_timeout: 5s\n    workers: 3",
                ),
        );
        let c = changes(&running, &new);
        assert_eq!(
            c.applied,
            [
                "headers",
                "gateway 127.0.0.1:18000 (upstream, headers, routes, upstream_timeout)"
            ]
        );
        assert_eq!(
            c.need_restart,
            ["listen.http", "gateway 127.0.0.1:18000 (workers)"]
        );
        // What is in effect afterwards: the new routes, the old listener and workers; a
        // second reload of the same file applies nothing new and still names the restart.
        let effect = in_effect(&running, &new);
        assert_eq!(effect.gateways[0].routes, new.gateways[0].routes);
        assert_eq!(effect.gateways[0].workers, None);
        assert_eq!(effect.listen.http, running.listen.http);
        let again = changes(&effect, &new);
        assert!(again.applied.is_empty(), "{again:?}");
        assert_eq!(again.need_restart, c.need_restart);
    }

    #[test]
    fn gateways_added_or_removed_need_a_restart() {
        let running = config(BASE);
        let new = config(&BASE.replace("18000", "18001"));
        let c = changes(&running, &new);
        assert!(c.applied.is_empty(), "{c:?}");
        assert_eq!(
            c.need_restart,
            [
                "gateway 127.0.0.1:18001 (new)",
                "gateway 127.0.0.1:18000 (removed; still serving)"
            ]
        );
        assert_eq!(changes(&running, &running), Changes::default());
    }
}
