//! The status page at the admin listener's `/`: one self-contained HTML page (no external
//! assets). The server renders it whole, so it reads as plain tables without JavaScript; with
//! JavaScript it redraws itself from `/status.json` every two seconds (`status_page.js`, which
//! builds the same structure with text nodes only). Every value that comes
//! from traffic (keys, rule names) is escaped: keys are chosen by whoever sends requests.

use std::fmt::Write as _;

use sluice_engine::RuleReport;

use crate::status::{Point, RuleRates, Status};

/// `s` safe inside HTML text and attribute values.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn ago(now_ms: u64, at_ms: u64) -> String {
    let s = now_ms.saturating_sub(at_ms) / 1000;
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        _ => format!("{} h ago", s / 3600),
    }
}

/// An inline SVG chart of denied (red) and allowed (grey) per second.
fn sparkline(points: &[Point]) -> String {
    let (w, h) = (160.0, 28.0);
    let max = points
        .iter()
        .map(|p| p.rates.allowed.max(p.rates.denied))
        .fold(1.0_f64, f64::max);
    let line = |f: &dyn Fn(&Point) -> f64| {
        let n = points.len().max(2) - 1;
        points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "{:.1},{:.1}",
                    i as f64 * w / n as f64,
                    h - f(p) / max * (h - 2.0) - 1.0
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        r##"<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="decisions per second, last minutes"><polyline fill="none" stroke="#999" points="{}"/><polyline fill="none" stroke="#c0392b" points="{}"/></svg>"##,
        line(&|p| p.rates.allowed),
        line(&|p| p.rates.denied)
    )
}

/// The whole page for `status`.
pub(crate) fn render(status: &Status) -> String {
    let mut body = String::new();
    header(status, &mut body);
    store_section(status, &mut body);
    body.push_str("\n<section><h2>Rules</h2>\n");
    for (rule, rates) in status.engine.rules.iter().zip(&status.rates) {
        rule_article(rule, rates, &mut body);
    }
    body.push_str("</section>");
    page(&body)
}

/// The instance, its config and the last reload.
fn header(status: &Status, body: &mut String) {
    let e = &status.engine;
    let _ = write!(
        body,
        r#"<header><h1>Sluice <small>{version} (commit {commit}, built {built})</small></h1><p>instance <code>{node}</code>, up {up} s; config <code>{file}</code> loaded {loaded}"#,
        version = escape(status.version),
        commit = escape(status.commit),
        built = escape(status.build_date),
        node = escape(&e.node),
        up = status.uptime_s,
        file = escape(&status.config.file),
        loaded = ago(status.now_ms, status.config.loaded_at_ms),
    );
    if let Some(r) = &status.config.last_reload {
        let _ = write!(
            body,
            "; last reload ({trigger}) {when}: <span class=\"{class}\">{message}</span>",
            trigger = escape(&r.trigger),
            when = ago(status.now_ms, r.at_ms),
            class = if r.ok { "ok" } else { "bad" },
            message = escape(&r.message),
        );
    }
    body.push_str("</p></header>\n");
}

/// The store's health, flushes and clock.
fn store_section(status: &Status, body: &mut String) {
    let s = &status.engine.store;
    let _ = write!(
        body,
        r#"<section><h2>Store</h2><table><tr><th>health</th><th>live instances</th><th>last flush</th><th>flush took</th><th>flushes ok / failed</th><th>clock offset</th><th>exact breaker</th><th>spill to replay</th></tr><tr><td class="{hc}">{health}</td><td>{fleet}</td><td>{last}</td><td>{took:.1} ms</td><td>{ok} / {failed}</td><td>{offset:.1} ms</td><td>{breaker}</td><td>{replay}</td></tr></table>{error}</section>"#,
        hc = if s.health == "answering" { "ok" } else { "bad" },
        health = s.health,
        fleet = if s.fleet_instances == 0 {
            "-".to_owned()
        } else {
            s.fleet_instances.to_string()
        },
        last = s
            .flushes
            .last_at_ms
            .map_or("never".to_owned(), |t| ago(status.now_ms, t)),
        took = s.flushes.last_took_ms,
        ok = s.flushes.answered,
        failed = s.flushes.failed,
        offset = s.clock_offset_ms,
        breaker = s.exact_breaker,
        replay = s.replay_pending,
        error = s
            .flushes
            .last_error
            .as_deref()
            .map_or(String::new(), |m| format!(
                "<p>last flush failure: <span class=\"bad\">{}</span></p>",
                escape(m)
            )),
    );
}

/// One rule: its settings, rates and sparkline, and its heaviest keys.
fn rule_article(rule: &RuleReport, rates: &RuleRates, body: &mut String) {
    let limit = match (rule.limit, rule.window_s) {
        (Some(l), Some(w)) => format!("{l} per {w} s"),
        _ => "unlimited".to_owned(),
    };
    let _ = write!(
        body,
        r#"<article class="rule"><h3><code>{domain}</code> {id}{name}{shadow}</h3><p>{mode}{policy}, {limit}; {tracked} keys tracked here. Now: <b>{a:.1}</b> allowed/s, <b class="bad">{d:.1}</b> denied/s, {sd:.1} shadow-denied/s (since started: {ta} allowed, {td} denied, {tsd} shadow-denied) {spark}</p>"#,
        domain = escape(&rule.domain),
        id = escape(&rule.id),
        name = rule
            .name
            .as_deref()
            .map_or(String::new(), |n| format!(" ({})", escape(n))),
        shadow = if rule.shadow { " <em>shadow</em>" } else { "" },
        mode = rule.mode,
        policy = match (rule.policy == rule.mode, rule.note) {
            (true, None) => String::new(),
            (false, None) => format!(" ({})", rule.policy),
            (true, Some(note)) => format!(" ({note})"),
            (false, Some(note)) => format!(" ({}; {note})", rule.policy),
        },
        tracked = rule.tracked_keys,
        a = rates.now.allowed,
        d = rates.now.denied,
        sd = rates.now.shadow_denied,
        ta = rule.decisions.allowed,
        td = rule.decisions.denied,
        tsd = rule.decisions.shadow_denied,
        spark = sparkline(&rates.history),
    );
    if rule.heavy_keys.is_empty() {
        body.push_str("<p class=\"quiet\">no traffic sampled yet</p>");
    } else {
        heavy_keys(rule, body);
    }
    body.push_str("</article>\n");
}

/// A rule's heaviest keys, with how near their limit each is.
fn heavy_keys(rule: &RuleReport, body: &mut String) {
    let denied = if rule.shadow { "would deny" } else { "denied" };
    let _ = write!(
        body,
        "<table class=\"keys\"><tr><th>heaviest keys</th><th>requests</th><th>{denied}</th><th>used of limit</th><th>state</th></tr>"
    );
    for k in &rule.heavy_keys {
        let used = match (k.used, rule.limit) {
            (Some(u), Some(l)) => format!("{u} / {l}"),
            (Some(u), None) => u.to_string(),
            _ => "-".to_owned(),
        };
        let near = k.used.zip(rule.limit).is_some_and(|(u, l)| u * 10 >= l * 8);
        let state = match (k.blocked, near, rule.shadow) {
            // Shadow mode denies nothing: the key is over, and let through.
            (true, _, true) => "<td class=\"warn\">over limit (shadow: not denied)</td>",
            (true, _, false) => "<td class=\"bad\">blocked</td>",
            (false, true, _) => "<td class=\"warn\">near limit</td>",
            _ => "<td>ok</td>",
        };
        // A busy rule's counts come from a sample: marked as estimates.
        let about = if k.estimated {
            "<span title=\"estimated from a sample\">~</span>"
        } else {
            ""
        };
        let _ = write!(
            body,
            "<tr><td><code>{}</code></td><td>{about}{}</td><td>{about}{}</td><td>{}</td>{}</tr>",
            escape(&k.key),
            k.requests,
            k.denied,
            used,
            state
        );
    }
    body.push_str("</table>");
}

/// The page around `body`: styles and the script that refreshes it.
fn page(body: &str) -> String {
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sluice status</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1em auto; max-width: 72em; padding: 0 1em; color: #222; }}
h1 small {{ font-weight: normal; color: #777; font-size: 55%; }}
h2 {{ border-bottom: 1px solid #ddd; margin-top: 1.5em; }}
h3 {{ margin: 1em 0 .2em; font-size: 105%; }}
table {{ border-collapse: collapse; margin: .3em 0; }}
th, td {{ text-align: left; padding: .15em .8em .15em 0; border-bottom: 1px solid #eee; vertical-align: top; }}
td code {{ word-break: break-all; }}
.ok {{ color: #1e8449; }} .bad {{ color: #c0392b; }} .warn {{ color: #b9770e; }} .quiet {{ color: #888; }}
.spark {{ vertical-align: middle; }}
</style></head>
<body><div id="page">{body}</div>
<noscript><p class="quiet">Reload the page for new figures (JavaScript would refresh them every 2 s).</p></noscript>
<script>
{script}</script>
</body></html>
"#,
        script = SCRIPT
    )
}

/// Redraws the page from `/status.json` (text nodes only).
const SCRIPT: &str = include_str!("status_page.js");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_a_key_is_shown_not_run() {
        assert_eq!(
            escape("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }
}
