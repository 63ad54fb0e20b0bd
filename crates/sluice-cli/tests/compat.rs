//! Compatibility with Envoy's ratelimit service, through the `sluice` binary: every file of
//! `crates/sluice-config/tests/envoy-compat/` through `sluice check`, and the behaviours of
//! its configuration language (zero limits, wildcards anywhere, `share_threshold`,
//! `quota_mode`, `metadata`, `value_to_metric`, `unlimited`, `shadow_mode`) over gRPC and
//! `/json` from a running `sluice serve`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Serve, http_call, request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::value::Kind;

fn fixtures(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sluice-config/tests/envoy-compat")
        .join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn sluice_check_accepts_every_valid_file_and_names_every_error() {
    let bin = env!("CARGO_BIN_EXE_sluice");
    for file in fixtures("valid") {
        let out = Command::new(bin)
            .args(["check", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(": ok"),
            "{}: {stdout}{}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for file in fixtures("invalid") {
        let text = std::fs::read_to_string(&file).unwrap();
        let expected = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect: "))
            .unwrap()
            .replace("{dir}", &file.parent().unwrap().display().to_string());
        let out = Command::new(bin)
            .args(["check", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{} accepted", file.display());
        assert!(stderr.contains(&expected), "{}:\n{stderr}", file.display());
    }
}

fn over(r: &RateLimitResponse) -> bool {
    r.overall_code == Code::OverLimit as i32
}

/// A field of a protobuf `Struct`, as text (strings, numbers, lists of numbers).
fn field(s: &envoy_types::pb::google::protobuf::Struct, name: &str) -> String {
    fn text(kind: Option<&Kind>) -> String {
        match kind {
            Some(Kind::StringValue(s)) => s.clone(),
            Some(Kind::NumberValue(n)) => n.to_string(),
            Some(Kind::BoolValue(b)) => b.to_string(),
            Some(Kind::ListValue(l)) => format!(
                "[{}]",
                l.values
                    .iter()
                    .map(|v| text(v.kind.as_ref()))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Some(Kind::StructValue(_)) => "{..}".to_owned(),
            _ => String::new(),
        }
    }
    text(s.fields.get(name).and_then(|v| v.kind.as_ref()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_language_behaves_as_in_envoys_ratelimit_service() {
    let files: Vec<(String, String)> = fixtures("valid")
        .iter()
        .map(|f| {
            (
                f.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(f).unwrap(),
            )
        })
        .collect();
    let rules: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let serve = Serve::start("compat", "memory://", &rules);
    let mut client = serve.client().await;
    let mut ask = async |domain: &str, descriptors: &[&[(&str, &str)]]| {
        client
            .should_rate_limit(request(domain, descriptors, 0))
            .await
            .unwrap()
            .into_inner()
    };

    // requests_per_unit: 0 bans a value; the key's other values keep their limit.
    let banned = ask("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.5")]]).await;
    assert!(over(&banned));
    assert_eq!(
        banned.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
    assert!(!over(
        &ask("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.1")]]).await
    ));

    // Wildcards anywhere: `*-prod` (3), `a*b` (4), `x*y*z` (5); a value that does not fit is
    // not limited.
    let mut prod = Vec::new();
    for _ in 0..4 {
        prod.push(over(&ask("example9", &[&[("env", "api-prod")]]).await));
    }
    assert_eq!(prod, [false, false, false, true]);
    let unmatched = ask("example9", &[&[("env", "api-prod-2")]]).await;
    assert!(!over(&unmatched) && unmatched.statuses[0].current_limit.is_none());
    let route = ask("example9", &[&[("route", "axxb")]]).await;
    assert_eq!(
        route.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        4
    );
    let path = ask("example9", &[&[("path", "x-y-y-z")]]).await;
    assert_eq!(
        path.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );

    // share_threshold: every value under files/* shares one counter of 2; models/* does not.
    let mut files_over = Vec::new();
    for f in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        files_over.push(over(&ask("files", &[&[("files", f)]]).await));
    }
    assert_eq!(files_over, [false, false, true]);
    let mut models_over = Vec::new();
    for m in ["models/a", "models/b", "models/c"] {
        models_over.push(over(&ask("files", &[&[("models", m)]]).await));
    }
    assert_eq!(models_over, [false, false, false]);

    // quota_mode: a (1) and b (2) are soft; the request is over once both are, and the
    // metadata lists which went over. A normal rule over its limit denies at once.
    let both: &[&[(&str, &str)]] = &[&[("backend_a", "m")], &[("backend_b", "m")]];
    let first = ask("quota", both).await;
    let second = ask("quota", both).await;
    let third = ask("quota", both).await;
    assert!(!over(&first) && !over(&second) && over(&third));
    let meta = second.dynamic_metadata.as_ref().unwrap();
    assert_eq!(field(meta, "quotaModeEnabled"), "true");
    assert_eq!(field(meta, "quotaModeViolations"), "[0]");
    assert_eq!(
        field(
            third.dynamic_metadata.as_ref().unwrap(),
            "quotaModeViolations"
        ),
        "[0,1]"
    );
    assert_eq!(second.statuses[0].code, Code::Ok as i32);

    // metadata: returned for the matched descriptor, over gRPC and /json.
    let gold = ask("meta", &[&[("plan", "gold")]]).await;
    let meta = gold.dynamic_metadata.as_ref().unwrap();
    assert_eq!(field(meta, "domain"), "meta");
    let Some(Kind::ListValue(described)) = meta.fields["descriptors"].kind.as_ref() else {
        panic!("{meta:?}")
    };
    let Some(Kind::StructValue(first)) = described.values[0].kind.as_ref() else {
        panic!("{meta:?}")
    };
    assert_eq!(field(first, "entries"), "[plan=gold]");
    let Some(Kind::StructValue(m)) = first.fields["metadata"].kind.as_ref() else {
        panic!("{meta:?}")
    };
    assert_eq!(
        (field(m, "tier"), field(m, "weight")),
        ("gold".into(), "3".into())
    );
    assert!(
        ask("meta", &[&[("plan", "silver")]])
            .await
            .dynamic_metadata
            .is_none()
    );
    let (status, body) = http_call(
        serve.http,
        "POST",
        "/json",
        r#"{"domain":"meta","descriptors":[{"entries":[{"key":"plan","value":"gold"}]}]}"#,
    );
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["dynamicMetadata"]["descriptors"][0]["metadata"],
        serde_json::json!({"tier": "gold", "weight": 3, "regions": ["eu", "us"]}),
        "{body}"
    );

    // unlimited answers OK with the most left; shadow_mode never denies.
    let ldap = ask("internal", &[&[("ldap", "x")]]).await;
    assert!(!over(&ldap));
    assert_eq!(ldap.statuses[0].limit_remaining, u32::MAX);
    let mut shadow = Vec::new();
    for _ in 0..12 {
        shadow.push(over(
            &ask("example6", &[&[("service", "s"), ("user", "user-a")]]).await,
        ));
    }
    assert!(shadow.iter().all(|o| !o), "shadow mode never denies");

    // value_to_metric: decisions counted per value.
    ask("metrics", &[&[("route", "/checkout")]]).await;
    let (_, metrics) = http_call(serve.admin, "GET", "/metrics", "");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sluice_detailed_decisions_total")
                && l.contains("domain=\"metrics\"")
                && l.contains("/checkout")),
        "{metrics}"
    );
}
