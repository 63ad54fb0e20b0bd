//! Where a stream's answers go: a short queue its peer must keep reading.

use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::wire::WireResponse;

/// Answers a stream may have waiting for its peer to read them.
pub const RESPONSES_WAITING: usize = 2;

/// One item of a stream's answers.
pub type Reply = Result<WireResponse, tonic::Status>;

/// Why a stream ends before its peer ends it.
#[derive(Debug)]
pub enum StreamEnd {
    /// A report Sluice refuses: the status is the stream's last word.
    Refused(tonic::Status),
    /// The peer is gone, or reads nothing.
    Gone,
}

impl From<tonic::Status> for StreamEnd {
    fn from(status: tonic::Status) -> Self {
        StreamEnd::Refused(status)
    }
}

/// The sending end of a stream's answers.
#[derive(Debug)]
pub struct Replies {
    tx: mpsc::Sender<Reply>,
    send_timeout: Duration,
    stop: watch::Receiver<bool>,
}

impl Replies {
    /// Answers into `tx`, each waiting at most `send_timeout` for room, and none once `stop`
    /// turns true.
    pub fn new(
        tx: mpsc::Sender<Reply>,
        send_timeout: Duration,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            tx,
            send_timeout,
            stop,
        }
    }

    /// Sends one item; `Gone` when the peer is gone or has read nothing for `send_timeout`,
    /// or the server stops meanwhile (a peer that reads nothing must not hold a stream past
    /// the stop, when the last flush is near).
    pub async fn send(&self, item: Reply) -> Result<(), StreamEnd> {
        let mut stop = self.stop.clone();
        let sent = tokio::select! {
            biased;
            Ok(_) = stop.wait_for(|s| *s) => return Err(StreamEnd::Gone),
            sent = tokio::time::timeout(self.send_timeout, self.tx.send(item)) => sent,
        };
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(StreamEnd::Gone),
            Err(_) => {
                metrics::counter!("sluice_rlqs_refused_total", "reason" => "send_timeout")
                    .increment(1);
                tracing::warn!("rlqs stream's peer reads no responses; stream ended");
                Err(StreamEnd::Gone)
            }
        }
    }
}
