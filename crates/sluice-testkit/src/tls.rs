//! Certificates for the TLS fixtures, made by `openssl`.

use std::process::{Command, Stdio};

/// A CA (`ca.pem`) and a certificate for 127.0.0.1 signed by it (`cert.pem`, `key.pem`) in
/// `dir`, made by `openssl` (a self-signed server certificate is refused by webpki as a CA used
/// as an end entity).
pub fn make_certificates(dir: &std::path::Path) {
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n")
        .expect("write the certificate extensions");
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl is needed for the TLS fixture");
        assert!(status.success(), "openssl {args:?} failed");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=sluice-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "key.pem",
        "-out",
        "server.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        "-out",
        "cert.pem",
    ]);
}

/// The CA certificate (PEM) [`make_certificates`] wrote in `dir`.
pub(crate) fn ca_certificate(dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(dir.join("ca.pem")).expect("a TLS fixture has a CA certificate")
}

/// `redis-server` arguments for a TLS port with the certificates of [`make_certificates`]
/// (clients are not asked for certificates).
pub(crate) fn tls_args(dir: &std::path::Path, tls_port: u16) -> Vec<String> {
    let file = |name: &str| dir.join(name).display().to_string();
    vec![
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        file("cert.pem"),
        "--tls-key-file".into(),
        file("key.pem"),
        "--tls-ca-cert-file".into(),
        file("ca.pem"),
        "--tls-auth-clients".into(),
        "no".into(),
    ]
}
