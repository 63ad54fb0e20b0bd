//! Admission of a request to a listener's work. A request first reads its body (whole for
//! the APIs, the first `max_body_bytes` at a gateway) within `body_read_timeout`, in a
//! bounded waiting room that drops the longest-waiting request when full; only then does it
//! take one of the listener's `max_requests_in_flight` slots, or is refused at once (503,
//! gRPC `RESOURCE_EXHAUSTED`). A client that opens streams and never finishes their bodies
//! therefore holds no slot, and cannot lock newer requests out of the waiting room either.
//! Every refusal is counted per listener ([`DoorHealth`]), which readiness and the status
//! page report.

mod body;
mod health;
mod refusal;
mod stalled;
mod waiting;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use sluice_config::ListenerLimits;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{BoxError, Layer, Service, ServiceExt as _};

pub(crate) use body::{Buffering, Ready, Rebody, read_ready};
pub(crate) use health::{DoorHealth, Doors, ListenerReport};
pub(crate) use refusal::Refusal;
pub(crate) use stalled::guard_response;
use waiting::Waiting;

/// How a listener's refusals are spelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Door {
    /// HTTP answers (mapped to responses by [`crate::listener::protect`], or a gateway's
    /// `door` in gateway_workers.rs).
    Http,
    /// gRPC statuses.
    Grpc,
}

/// The admission layer of one listener. Clones share the slots, the waiting room and the
/// health record (a gateway's workers share one).
#[derive(Clone, Debug)]
pub(crate) struct Admission {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    door: Door,
    slots: Arc<Semaphore>,
    waiting: Arc<Waiting>,
    body_timeout: Duration,
    buffering: Buffering,
    health: Arc<DoorHealth>,
}

impl Admission {
    /// The admission of a listener under `limits`, recorded in `doors` as `listener`.
    pub(crate) fn new(
        listener: &'static str,
        door: Door,
        buffering: Buffering,
        limits: &ListenerLimits,
        doors: &Doors,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                door,
                slots: Arc::new(Semaphore::new(
                    limits.max_requests_in_flight.min(Semaphore::MAX_PERMITS),
                )),
                waiting: Arc::new(Waiting::new(
                    limits.max_bodies_waiting,
                    limits.max_waiting_body_bytes,
                )),
                body_timeout: limits.body_read_timeout,
                buffering,
                health: doors.register(listener),
            }),
        }
    }

    /// One of the listener's in-flight slots for a request whose body is already read whole,
    /// or the refusal (counted) when every slot is taken.
    pub(crate) fn slot_now(&self) -> Result<OwnedSemaphorePermit, BoxError> {
        self.shared.slot()
    }

    /// Counts a refusal this layer did not make itself (a body broken off before it was in).
    pub(crate) fn refused(&self, refusal: Refusal) -> BoxError {
        self.shared.refuse(refusal)
    }
}

impl<S> Layer<S> for Admission {
    type Service = Admitted<S>;

    fn layer(&self, inner: S) -> Admitted<S> {
        Admitted {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// A service behind its listener's admission.
#[derive(Clone, Debug)]
pub(crate) struct Admitted<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl Shared {
    /// An in-flight slot now, or the refusal (counted).
    fn slot(&self) -> Result<OwnedSemaphorePermit, BoxError> {
        self.slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| self.refuse(Refusal::Busy))
    }

    fn refuse(&self, refusal: Refusal) -> BoxError {
        self.health.refused(refusal);
        match self.door {
            Door::Http => Box::new(refusal),
            Door::Grpc => Box::new(refusal.status()),
        }
    }

    async fn read<B>(&self, body: B) -> Result<B, Refusal>
    where
        B: Rebody,
        B::Error: Into<BoxError>,
    {
        if body.is_end_stream() {
            return Ok(body);
        }
        // A body that is all in already (a small one usually comes with the head) needs no
        // place in the waiting room and no deadline.
        let body = match self.buffering {
            Buffering::Whole(limit) => match read_ready(body, limit) {
                Ready::Whole(bytes) => return Ok(B::whole(bytes)),
                Ready::Broken => return Err(Refusal::BodyError),
                Ready::Later(read) => B::prefixed(read),
            },
            Buffering::Prefix(_) => body,
        };
        let (ticket, evicted) = self.waiting.enter();
        let read = body::read(body, self.buffering, &ticket);
        tokio::select! {
            read = read => read,
            () = evicted.wait() => Err(Refusal::Evicted),
            () = tokio::time::sleep(self.body_timeout) => {
                Err(Refusal::BodyTimeout(self.body_timeout.as_millis()))
            }
        }
    }
}

impl<S, B, R> Service<Request<B>> for Admitted<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: Rebody,
    B::Error: Into<BoxError>,
{
    type Response = Response<R>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is decided per request (a slot once the body is in), never by waiting.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (shared, inner) = (self.shared.clone(), self.inner.clone());
        // An RLQS stream's body is the stream itself: never read whole, and held open for as
        // long as Envoy runs; it has its own bounds (streams per peer, reports per second).
        // Only on the gRPC listener: elsewhere the path is a client's to spell (a gateway
        // forwards `/<RLQS prefix>/../upload` as `/upload`), and must not skip the admission.
        if shared.door == Door::Grpc
            && request
                .uri()
                .path()
                .starts_with(sluice_rls::rlqs::RLQS_PATH_PREFIX)
        {
            return Box::pin(async move { inner.oneshot(request).await.map_err(Into::into) });
        }
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = shared.read(body).await.map_err(|r| shared.refuse(r))?;
            let slot = shared.slot()?;
            let response = inner
                .oneshot(Request::from_parts(parts, body))
                .await
                .map_err(Into::into);
            drop(slot);
            response
        })
    }
}
