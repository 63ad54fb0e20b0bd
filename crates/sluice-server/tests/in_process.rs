//! The whole service started in this process (`run_until`), asked over its listeners, and
//! stopped by a future instead of a signal.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use sluice_testkit::{free_port, wait_until};

/// One HTTP/1.1 request; the status and the body, or `None` when nothing answered.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.split(' ').nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

#[test]
fn the_service_starts_in_process_answers_and_stops_on_its_future() {
    let dir = std::env::temp_dir().join(format!(
        "sluice-server-in-process-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    std::fs::write(
        dir.join("rules/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { window: 10s, requests_per_unit: 20 }\n",
    )
    .unwrap();
    let (http, grpc, admin) = (free_port(), free_port(), free_port());
    let config = dir.join("sluice.yaml");
    std::fs::write(
        &config,
        format!(
            "store: memory://\nlisten:\n  http: 127.0.0.1:{http}\n  grpc: 127.0.0.1:{grpc}\n  admin: 127.0.0.1:{admin}\nrules: [rules/]\n"
        ),
    )
    .unwrap();

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(sluice_server::run_until(&config, async {
            let _ = stopped.await;
        }))
    });

    assert!(
        wait_until(Duration::from_secs(20), || get(admin, "/healthz")
            .is_some_and(|(status, _)| status == 200)),
        "the admin listener never answered /healthz"
    );
    let (status, rules) = get(admin, "/rlconfig").unwrap();
    assert_eq!(status, 200, "{rules}");
    assert!(rules.contains("domain edge"), "{rules}");

    stop.send(()).unwrap();
    service.join().unwrap().unwrap();
    assert!(
        get(admin, "/healthz").is_none(),
        "still listening after the stop"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
