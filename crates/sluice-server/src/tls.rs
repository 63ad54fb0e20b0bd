//! TLS on the listeners (`access.tls_cert_file` / `tls_key_file`): rustls with the `ring`
//! provider, TLS 1.2 and 1.3. The handshake runs in the connection's own task under the
//! header-read timeout, so a client that stalls it holds one capped slot, never the accept loop.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sluice_config::TlsFiles;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::error::ServerError;
use crate::guarded::Guarded;

/// ALPN for HTTP listeners (either version) and for gRPC (HTTP/2 only).
pub(crate) const HTTP_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];
pub(crate) const GRPC_ALPN: &[&[u8]] = &[b"h2"];

/// An acceptor for `files`, offering `alpn`. Errors name the file and what is wrong with it.
pub(crate) fn acceptor(files: &TlsFiles, alpn: &[&[u8]]) -> Result<TlsAcceptor, ServerError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert_file)
        .and_then(Iterator::collect)
        .map_err(|e| {
            let what = format!(
                "access.tls_cert_file {}: cannot read PEM certificates",
                files.cert_file.display()
            );
            ServerError::file_because(what, e)
        })?;
    if certs.is_empty() {
        return Err(ServerError::file(format!(
            "access.tls_cert_file {}: no certificate in the file",
            files.cert_file.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key_file).map_err(|e| {
        let what = format!(
            "access.tls_key_file {}: cannot read a PEM private key (PKCS#8, PKCS#1 or SEC1)",
            files.key_file.display()
        );
        ServerError::file_because(what, e)
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::file_because("TLS protocol versions".to_owned(), e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            let what = format!(
                "access.tls_cert_file {} and tls_key_file {} do not make a usable pair",
                files.cert_file.display(),
                files.key_file.display()
            );
            ServerError::file_because(what, e)
        })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A connection of a listener: plain, or TLS over the guarded TCP stream.
pub(crate) enum Conn {
    Plain(Guarded<TcpStream>),
    Tls(Box<TlsStream<Guarded<TcpStream>>>),
}

/// `io` as a [`Conn`]: with TLS, after a handshake that must finish within `timeout`. A failed
/// or slow handshake is counted and the connection dropped.
pub(crate) async fn handshake(
    tls: Option<&TlsAcceptor>,
    io: Guarded<TcpStream>,
    timeout: Duration,
    listener: &'static str,
) -> Option<Conn> {
    let Some(acceptor) = tls else {
        return Some(Conn::Plain(io));
    };
    let failure = match tokio::time::timeout(timeout, acceptor.accept(io)).await {
        Ok(Ok(stream)) => return Some(Conn::Tls(Box::new(stream))),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no handshake within {timeout:?}"),
    };
    metrics::counter!("sluice_tls_handshake_failures_total", "listener" => listener).increment(1);
    tracing::debug!(listener, error = %failure, "TLS handshake failed");
    None
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Conn::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Conn::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Conn::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(io) => io.is_write_vectored(),
            Conn::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io).poll_flush(cx),
            Conn::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Conn::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            Conn::Plain(io) => io.connect_info(),
            Conn::Tls(io) => io.get_ref().0.connect_info(),
        }
    }
}
