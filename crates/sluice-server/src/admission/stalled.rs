//! A gateway response the client stops reading. An HTTP/2 client can keep its window at zero
//! and its connection busy with PINGs, so no idle timeout fires, while each of its streams
//! holds the upstream connection its response streams from. A response body that is not
//! complete in its first frame is therefore pumped by its own task into a short channel; when
//! the client takes no frame for `stall` (the listener's `idle_timeout`), the task drops the
//! upstream body, which frees the upstream connection, and the response ends in an error
//! (the stream is reset, never cut short as if complete).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::Response;
use http_body_util::BodyExt as _;
use hyper::body::{Body, Bytes, Frame};
use tokio::sync::mpsc;

/// Frames buffered between the upstream and a client that reads slowly.
const FRAMES: usize = 4;

/// The error a cut response ends with.
#[derive(Debug, thiserror::Error)]
#[error("the client read nothing of the response for too long; it was cut")]
struct Stalled;

/// Guards one response (see the module's text): a body complete in its first frame is
/// answered as it is, any other is pumped by its own task and cut after `stall` unread.
pub(crate) async fn guard_response(response: Response, stall: Duration) -> Response {
    let (parts, mut body) = response.into_parts();
    if body.is_end_stream() {
        return Response::from_parts(parts, body);
    }
    // Most answers are one frame: read it here (still under the request timeout) and answer
    // without a task.
    let first = match body.frame().await {
        None => return Response::from_parts(parts, axum::body::Body::empty()),
        Some(Err(e)) => {
            return Response::from_parts(
                parts,
                axum::body::Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
                    [Err::<Frame<Bytes>, axum::Error>(e)],
                ))),
            );
        }
        Some(Ok(frame)) => frame,
    };
    if body.is_end_stream() {
        let body = match first.into_data() {
            Ok(data) => axum::body::Body::from(data),
            Err(frame) => axum::body::Body::new(Frames {
                first: Some(frame),
                rx: None,
                cut: Arc::new(AtomicBool::new(false)),
            }),
        };
        return Response::from_parts(parts, body);
    }
    let (tx, rx) = mpsc::channel(FRAMES);
    let cut = Arc::new(AtomicBool::new(false));
    let pump_cut = cut.clone();
    tokio::spawn(async move {
        loop {
            let frame = match body.frame().await {
                None => break,
                Some(Ok(frame)) => frame,
                Some(Err(_)) => {
                    pump_cut.store(true, Ordering::Release);
                    break;
                }
            };
            match tokio::time::timeout(stall, tx.send(frame)).await {
                Ok(Ok(())) => {}
                // The client went away: nobody to send to.
                Ok(Err(_)) => break,
                Err(_) => {
                    metrics::counter!("sluice_responses_cut_total").increment(1);
                    pump_cut.store(true, Ordering::Release);
                    break;
                }
            }
        }
        // Dropping `body` here frees the upstream connection it reads from.
    });
    Response::from_parts(
        parts,
        axum::body::Body::new(Frames {
            first: Some(first),
            rx: Some(rx),
            cut,
        }),
    )
}

/// The response body the client reads: the first frame, then what the pump sends.
struct Frames {
    first: Option<Frame<Bytes>>,
    rx: Option<mpsc::Receiver<Frame<Bytes>>>,
    cut: Arc<AtomicBool>,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Stalled;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Stalled>>> {
        if let Some(frame) = self.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(frame)) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(None) if self.cut.load(Ordering::Acquire) => {
                Poll::Ready(Some(Err(Stalled)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
