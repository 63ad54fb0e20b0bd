//! One accepted connection under the listener's guard: it holds a slot of the listener's
//! connection cap for as long as it lives, and fails with `TimedOut` once no byte has moved
//! either way for the idle timeout (an idle HTTP/2 or gRPC connection, a client that opened a
//! socket and never wrote, or one that stopped reading its responses).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// A listener's cap on open connections.
#[derive(Clone)]
pub(crate) struct ConnectionCap {
    listener: &'static str,
    slots: Arc<Semaphore>,
}

impl ConnectionCap {
    pub(crate) fn new(listener: &'static str, max: usize) -> Self {
        Self {
            listener,
            slots: Arc::new(Semaphore::new(max.max(1))),
        }
    }

    /// A slot for a new connection, or `None` when the listener is full (the caller closes
    /// the connection at once: a refused client learns it now instead of hanging).
    pub(crate) fn admit(&self) -> Option<OwnedSemaphorePermit> {
        let slot = self.slots.clone().try_acquire_owned().ok();
        if slot.is_none() {
            metrics::counter!("sluice_connections_refused_total", "listener" => self.listener)
                .increment(1);
        }
        slot
    }

    pub(crate) fn listener(&self) -> &'static str {
        self.listener
    }
}

/// A connection with its slot and idle deadline.
pub(crate) struct Guarded<T> {
    io: T,
    idle: Duration,
    last_activity: Instant,
    deadline: Pin<Box<Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl<T> Guarded<T> {
    pub(crate) fn new(io: T, idle: Duration, slot: OwnedSemaphorePermit) -> Self {
        let now = Instant::now();
        Self {
            io,
            idle,
            last_activity: now,
            deadline: Box::pin(tokio::time::sleep_until(now + idle)),
            _slot: slot,
        }
    }

    pub(crate) fn get_ref(&self) -> &T {
        &self.io
    }

    fn touch(&mut self) {
        self.last_activity = Instant::now();
    }

    /// A write that moved bytes is activity; one that waits is subject to the idle deadline
    /// (a client that stops reading its responses).
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match poll {
            Poll::Ready(result) => {
                if matches!(result, Ok(n) if n > 0) {
                    self.touch();
                }
                Poll::Ready(result)
            }
            Poll::Pending => self.poll_idle(cx).map(Err),
        }
    }

    /// Ready with an error once the connection has been idle too long. The timer is re-armed
    /// lazily (only when it fires), so traffic costs one clock read per read or write.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = self.last_activity + self.idle;
            if Instant::now() >= due {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle for longer than listeners.idle_timeout",
                ));
            }
            self.deadline.as_mut().reset(due);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.touch();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.after_write(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.after_write(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Guarded<tokio::net::TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.get_ref().connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_times_out_and_traffic_keeps_it_open() {
        let cap = ConnectionCap::new("test", 1);
        let (client, server) = tokio::io::duplex(64);
        let mut guarded = Guarded::new(server, Duration::from_secs(10), cap.admit().unwrap());
        assert!(cap.admit().is_none(), "the one slot is held");
        let mut client = client;
        let mut buf = [0u8; 8];
        // Traffic every 6 s keeps a 10 s idle timeout from firing.
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(6)).await;
            client.write_all(b"x").await.unwrap();
            assert_eq!(guarded.read(&mut buf).await.unwrap(), 1);
        }
        // Then silence: the read fails after 10 s, not before.
        let started = Instant::now();
        let e = guarded.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        drop(guarded);
        assert!(cap.admit().is_some(), "the slot is back");
    }
}
