//! Why a request was not admitted, as an HTTP listener and a gRPC status say it.

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// Every in-flight slot is taken.
    #[error("too many requests in flight on this listener; retry shortly")]
    Busy,
    /// The waiting room was full and this request had waited longest for its body.
    #[error("the request body was still arriving when the listener needed room for newer requests")]
    Evicted,
    /// The body did not arrive within `body_read_timeout`.
    #[error("the request body did not arrive within {0} ms")]
    BodyTimeout(u128),
    /// The body is larger than `max_body_bytes`.
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    /// The client broke off the body.
    #[error("the request body could not be read")]
    BodyError,
}

impl Refusal {
    /// The gRPC status of this refusal.
    pub(super) fn status(self) -> tonic::Status {
        match self {
            Self::Busy => tonic::Status::resource_exhausted(self.to_string()),
            Self::TooLarge(_) => tonic::Status::resource_exhausted(self.to_string()),
            Self::Evicted | Self::BodyTimeout(_) | Self::BodyError => {
                tonic::Status::cancelled(self.to_string())
            }
        }
    }
}
