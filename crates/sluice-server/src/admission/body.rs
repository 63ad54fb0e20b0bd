//! Reading a request's body before it may take an in-flight slot: whole for the APIs (a
//! body over `max_body_bytes` is refused), its first `max_body_bytes` for a gateway (the rest
//! then streams to the upstream, as nginx's request buffering does).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::BodyExt as _;
use hyper::body::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::refusal::Refusal;
use super::waiting::Ticket;

/// How much of a body is read before the request goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Buffering {
    /// The whole body, at most this many bytes (more: refused, 413).
    Whole(usize),
    /// At most this many bytes; a longer body goes on with the rest still streaming.
    Prefix(usize),
}

/// A request body type the listener's service takes, rebuilt from what was read.
pub(crate) trait Rebody: Body<Data = Bytes> + Unpin + Send + Sized + 'static
where
    Self::Error: Into<tower::BoxError>,
{
    /// A body of these bytes.
    fn whole(bytes: Bytes) -> Self;
    /// The frames read so far, then the rest of `body`.
    fn prefixed(read: Buffered<Self>) -> Self;
}

impl Rebody for axum::body::Body {
    fn whole(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }
    fn prefixed(read: Buffered<Self>) -> Self {
        axum::body::Body::new(read)
    }
}

impl Rebody for tonic::body::Body {
    fn whole(bytes: Bytes) -> Self {
        tonic::body::Body::new(http_body_util::Full::new(bytes))
    }
    fn prefixed(read: Buffered<Self>) -> Self {
        tonic::body::Body::new(read)
    }
}

/// Frames already read, followed by the rest of the body.
pub(crate) struct Buffered<B> {
    frames: VecDeque<Frame<Bytes>>,
    rest: Option<B>,
}

impl<B> Body for Buffered<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self
            .frames
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        let rest = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + read);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + read);
        }
        hint
    }
}

/// What of a body had arrived when [`read_ready`] looked.
pub(crate) enum Ready<B> {
    /// All of it, at most the limit.
    Whole(Bytes),
    /// Not all of it yet (or longer than the limit, or with trailers): the frames read and
    /// the rest, for the listener's usual admission.
    Later(Buffered<B>),
    /// The client broke it off.
    Broken,
}

/// Reads what of `body` has already arrived, without waiting and without a place in the
/// waiting room: an API request's small body usually comes with its head, and then needs
/// neither. Anything else comes back as [`Ready::Later`], nothing of it lost.
pub(crate) fn read_ready<B>(mut body: B, limit: usize) -> Ready<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut frames = VecDeque::new();
    let mut len = 0usize;
    let whole = loop {
        if body.is_end_stream() {
            break true;
        }
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(None) => break true,
            Poll::Ready(Some(Err(_))) => return Ready::Broken,
            Poll::Ready(Some(Ok(frame))) => {
                let data = frame.data_ref().map(Bytes::len);
                frames.push_back(frame);
                match data {
                    Some(n) => {
                        len = len.saturating_add(n);
                        if len > limit {
                            break false;
                        }
                    }
                    None => break false,
                }
            }
            Poll::Pending => break false,
        }
    };
    if !whole {
        return Ready::Later(Buffered {
            frames,
            rest: Some(body),
        });
    }
    Ready::Whole(concat(frames, len))
}

/// The data of `frames` (`len` bytes in all) as one buffer, copied only when there are several.
fn concat(mut frames: VecDeque<Frame<Bytes>>, len: usize) -> Bytes {
    match frames.len() {
        0 => Bytes::new(),
        1 => frames
            .pop_front()
            .and_then(|f| f.into_data().ok())
            .unwrap_or_default(),
        _ => {
            let mut all = Vec::with_capacity(len);
            for frame in frames {
                if let Some(data) = frame.data_ref() {
                    all.extend_from_slice(data);
                }
            }
            Bytes::from(all)
        }
    }
}

/// Reads `body` as `buffering` says, counting its bytes in the waiting room through `ticket`.
/// Does not time out by itself: the caller races it against the body deadline and eviction.
pub(crate) async fn read<B>(
    mut body: B,
    buffering: Buffering,
    ticket: &Ticket,
) -> Result<B, Refusal>
where
    B: Rebody,
    B::Error: Into<tower::BoxError>,
{
    let limit = match buffering {
        Buffering::Whole(n) | Buffering::Prefix(n) => n,
    };
    let mut frames = VecDeque::new();
    let mut len = 0usize;
    let mut trailers = false;
    loop {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = frame.map_err(|_| Refusal::BodyError)?;
        if let Some(data) = frame.data_ref() {
            len = len.saturating_add(data.len());
            ticket.buffered(data.len());
            if len > limit {
                frames.push_back(frame);
                return match buffering {
                    Buffering::Whole(_) => Err(Refusal::TooLarge(limit)),
                    Buffering::Prefix(_) => Ok(B::prefixed(Buffered {
                        frames,
                        rest: Some(body),
                    })),
                };
            }
        } else {
            trailers = true;
        }
        frames.push_back(frame);
    }
    if trailers {
        return Ok(B::prefixed(Buffered { frames, rest: None }));
    }
    Ok(B::whole(concat(frames, len)))
}
