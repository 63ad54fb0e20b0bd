//! `sluice status --admin URL`: a running instance's `/status.json` as terminal tables.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::BodyExt as _;
use serde_json::Value;

/// The most of an answer read: a status is bounded (ten keys per rule), a larger answer is not
/// a Sluice status.
const MAX_ANSWER: usize = 16 << 20;

/// Which admin listener `sluice status` asks, and with which token file: what the flags say,
/// else what `config` says, else the default listener (127.0.0.1:9090) without a token.
pub(crate) fn target(
    admin: Option<String>,
    config: Option<&Path>,
    token_file: Option<std::path::PathBuf>,
) -> anyhow::Result<(String, Option<std::path::PathBuf>)> {
    let config = config.map(sluice_config::load).transpose()?;
    let admin = admin.unwrap_or_else(|| {
        let listen = config.as_ref().map_or_else(
            || sluice_config::Listen::default().admin,
            |c| c.listen.admin,
        );
        // A listener on every address answers on loopback.
        let ip = match listen.ip() {
            std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
            ip => ip,
        };
        std::net::SocketAddr::new(ip, listen.port()).to_string()
    });
    let token_file = token_file.or_else(|| config.and_then(|c| c.access.admin_token_file.clone()));
    Ok((admin, token_file))
}

/// Fetches `admin`'s `/status.json` (with the bearer token in `token_file`, if any).
pub(crate) async fn fetch(admin: &str, token_file: Option<&Path>) -> anyhow::Result<Value> {
    let (uri, status, body) =
        get(admin, "/status.json", token_file, Duration::from_secs(10)).await?;
    anyhow::ensure!(
        status.is_success(),
        "{uri} answered {status}: {}",
        String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
    );
    serde_json::from_slice(&body).with_context(|| format!("{uri} did not answer a status"))
}

/// `GET path` on the admin listener `admin` (an address or `http://` URL), within `timeout`:
/// the URI asked, the answer's status and its body (at most [`MAX_ANSWER`] bytes).
pub(crate) async fn get(
    admin: &str,
    path: &str,
    token_file: Option<&Path>,
    timeout: Duration,
) -> anyhow::Result<(http::Uri, http::StatusCode, hyper::body::Bytes)> {
    let base = admin.trim_end_matches('/');
    let base = if base.contains("://") {
        base.to_owned()
    } else {
        format!("http://{base}")
    };
    anyhow::ensure!(
        base.starts_with("http://"),
        "--admin {admin}: only http:// admin listeners can be read (put the status behind TLS with a proxy, or read it from the instance's host)"
    );
    let uri: http::Uri = format!("{base}{path}")
        .parse()
        .with_context(|| format!("--admin {admin} is not an address"))?;
    let mut request = http::Request::get(uri.clone());
    if let Some(file) = token_file {
        let token = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read the token file {}", file.display()))?;
        request = request.header("authorization", format!("Bearer {}", token.trim()));
    }
    let request = request.body(http_body_util::Empty::<hyper::body::Bytes>::new())?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let response = tokio::time::timeout(timeout, client.request(request))
        .await
        .with_context(|| format!("{uri} did not answer within {} s", timeout.as_secs_f64()))?
        .with_context(|| format!("cannot reach {uri}"))?;
    let status = response.status();
    let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot read the answer of {uri}: {e}"))?
        .to_bytes();
    Ok((uri, status, body))
}

fn num(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::Number(n) => n
            .as_f64()
            .filter(|f| f.fract() != 0.0)
            .map_or_else(|| n.to_string(), |f| format!("{f:.1}")),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Columns padded to their widest cell.
fn table(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The status as text: the instance, the store, then one table per rule with traffic.
pub(crate) fn render(s: &Value) -> String {
    // An instance older than the build fields shows its version alone.
    let build = match (s["commit"].as_str(), s["build_date"].as_str()) {
        (Some(commit), Some(date)) => format!(" (commit {commit}, built {date})"),
        _ => String::new(),
    };
    let mut out = format!(
        "sluice {}{build} instance {}, up {} s, config {}\n",
        num(&s["version"]),
        num(&s["node"]),
        num(&s["uptime_s"]),
        num(&s["config"]["file"]),
    );
    if let Some(r) = s["config"]["last_reload"].as_object() {
        out.push_str(&format!(
            "last reload ({}): {} {}\n",
            num(&r["trigger"]),
            if r["ok"] == Value::Bool(true) {
                "ok"
            } else {
                "FAILED"
            },
            num(&r["message"])
        ));
    }
    out.push('\n');
    out.push_str(&store_table(&s["store"]));
    let rules = s["rules"].as_array().cloned().unwrap_or_default();
    let rates = s["rates"].as_array().cloned().unwrap_or_default();
    out.push('\n');
    out.push_str(&rules_table(&rules, &rates));
    for r in rules.iter().filter(|r| r["note"].is_string()) {
        out.push_str(&format!("  {}: {}\n", num(&r["id"]), num(&r["note"])));
    }
    for r in &rules {
        let keys = r["heavy_keys"].as_array().cloned().unwrap_or_default();
        if keys.is_empty() {
            continue;
        }
        out.push('\n');
        out.push_str(&heavy_keys_table(r, &keys));
    }
    out
}

/// The store's health and flushes, one row.
fn store_table(st: &Value) -> String {
    table(&[
        vec![
            "store".into(),
            "live instances".into(),
            "flushes ok".into(),
            "failed".into(),
            "last flush ms".into(),
            "clock offset ms".into(),
            "breaker".into(),
        ],
        vec![
            num(&st["health"]),
            num(&st["fleet_instances"]),
            num(&st["flushes"]["answered"]),
            num(&st["flushes"]["failed"]),
            num(&st["flushes"]["last_took_ms"]),
            num(&st["clock_offset_ms"]),
            num(&st["exact_breaker"]),
        ],
    ])
}

/// One row per rule: its mode, limit and rates.
fn rules_table(rules: &[Value], rates: &[Value]) -> String {
    let mut rows = vec![vec![
        "rule".into(),
        "mode".into(),
        "policy".into(),
        "limit".into(),
        "allowed/s".into(),
        "denied/s".into(),
        "shadow/s".into(),
        "keys".into(),
    ]];
    for (r, rate) in rules.iter().zip(rates.iter()) {
        // The policy column only says what the mode does not (`local local` said nothing).
        let policy = if r["policy"] == r["mode"] {
            String::new()
        } else {
            num(&r["policy"])
        };
        let shadow = if r["shadow"] == Value::Bool(true) {
            " (shadow)"
        } else {
            ""
        };
        rows.push(vec![
            // Rule ids name their domain (`edge/user`).
            format!("{}{shadow}", num(&r["id"])),
            num(&r["mode"]),
            policy,
            match (r["limit"].as_u64(), r["window_s"].as_f64()) {
                (Some(l), Some(w)) => format!("{l}/{w}s"),
                _ => "unlimited".into(),
            },
            num(&rate["now"]["allowed"]),
            num(&rate["now"]["denied"]),
            num(&rate["now"]["shadow_denied"]),
            num(&r["tracked_keys"]),
        ]);
    }
    table(&rows)
}

/// A rule's heaviest keys, with their state.
fn heavy_keys_table(r: &Value, keys: &[Value]) -> String {
    let mut rows = vec![vec![
        format!("{} heaviest keys", num(&r["id"])),
        "requests".into(),
        if r["shadow"] == Value::Bool(true) {
            "would deny".into()
        } else {
            "denied".into()
        },
        "used".into(),
        "state".into(),
    ]];
    for k in keys {
        // Keys come from traffic: control characters are shown escaped, never sent to
        // the terminal.
        let key: String = num(&k["key"]).escape_debug().collect();
        // A busy rule's counts come from a sample: `~` marks them as estimates.
        let about = if k["estimated"] == Value::Bool(true) {
            "~"
        } else {
            ""
        };
        rows.push(vec![
            key,
            format!("{about}{}", num(&k["requests"])),
            format!("{about}{}", num(&k["denied"])),
            format!("{} / {}", num(&k["used"]), num(&r["limit"])),
            match (
                k["blocked"] == Value::Bool(true),
                r["shadow"] == Value::Bool(true),
            ) {
                // Shadow mode denies nothing: the key is over, and let through.
                (true, true) => "over (shadow: not denied)".into(),
                (true, false) => "blocked".into(),
                _ => "ok".into(),
            },
        ]);
    }
    table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_cannot_send_escape_codes_to_the_terminal() {
        let status = serde_json::json!({
            "version": "0", "node": "n", "uptime_s": 1, "config": {"file": "f"},
            "store": {"health": "answering", "flushes": {}},
            "rules": [{"domain": "d", "id": "d/user", "mode": "local", "policy": "local",
                       "limit": 3, "window_s": 60.0, "tracked_keys": 1,
                       "heavy_keys": [{"key": "\u{1b}[31mevil", "requests": 8, "denied": 8,
                                       "used": 3, "blocked": true}]}],
            "rates": [{"now": {"allowed": 0.0, "denied": 1.5, "shadow_denied": 0.0}}]
        });
        let text = render(&status);
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(text.contains("\\u{1b}[31mevil"), "{text}");
        assert!(text.contains("blocked") && text.contains("1.5"), "{text}");
    }

    #[test]
    fn a_shadow_rule_says_it_lets_its_over_limit_keys_through() {
        let status = serde_json::json!({
            "version": "0", "node": "n", "uptime_s": 1, "config": {"file": "f"},
            "store": {"health": "answering", "flushes": {}},
            "rules": [{"domain": "d", "id": "d/user", "mode": "local", "policy": "local",
                       "shadow": true, "limit": 2, "window_s": 60.0, "tracked_keys": 1,
                       "heavy_keys": [{"key": "u", "requests": 40, "denied": 38,
                                       "used": 2, "blocked": true, "estimated": false}]}],
            "rates": [{"now": {"allowed": 0.0, "denied": 0.0, "shadow_denied": 1.5}}]
        });
        let text = render(&status);
        assert!(text.contains("d/user (shadow)"), "{text}");
        assert!(text.contains("would deny"), "{text}");
        assert!(text.contains("over (shadow: not denied)"), "{text}");
        assert!(!text.contains("blocked"), "{text}");
    }
}
