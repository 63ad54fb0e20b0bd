//! A memory store that counts the calls it is asked to make (served or not), and can fail one
//! flush call as a whole (a timeout) while answering the others, or lose the reply of one
//! exact call it applied (a timeout too).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::{Decision, Nanos};
use sluice_store::{
    CounterStore, ExactRequest, FlushItem, FlushReceipt, FlushReply, FlushTime, MemoryStore,
    StoreError, StoreFuture,
};

pub struct Watched {
    pub inner: MemoryStore,
    exact_calls: AtomicU64,
    flush_calls: AtomicU64,
    /// The flush call (counting from 0) that times out.
    failing_flush: Option<u64>,
    /// The exact call (counting from 0) that is applied and then times out.
    lost_exact_reply: Option<u64>,
}

impl Watched {
    pub fn new(inner: MemoryStore) -> Self {
        Self {
            inner,
            exact_calls: AtomicU64::new(0),
            flush_calls: AtomicU64::new(0),
            failing_flush: None,
            lost_exact_reply: None,
        }
    }

    /// Exact call `n` (counting from 0) is applied, and its reply lost (a timeout).
    #[allow(dead_code)]
    pub fn losing_exact_reply(self, n: u64) -> Self {
        Self {
            lost_exact_reply: Some(n),
            ..self
        }
    }

    /// Flush call `n` (counting from 0) times out; the others are answered.
    pub fn failing_flush_call(self, n: u64) -> Self {
        Self {
            failing_flush: Some(n),
            ..self
        }
    }

    /// Exact-mode calls asked of the store so far.
    pub fn exact_calls(&self) -> u64 {
        self.exact_calls.load(Ordering::Relaxed)
    }
}

impl CounterStore for Watched {
    fn flush_timed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: Option<&'a FlushReceipt>,
        time: FlushTime,
    ) -> StoreFuture<'a, FlushReply> {
        let call = self.flush_calls.fetch_add(1, Ordering::Relaxed);
        if self.failing_flush == Some(call) {
            let timeout = Duration::from_millis(600);
            return Box::pin(async move { Err(StoreError::Timeout(timeout)) });
        }
        self.inner.flush_timed(items, receipt, time)
    }

    fn landed<'a>(
        &'a self,
        items: &'a [FlushItem],
        receipt: &'a FlushReceipt,
    ) -> StoreFuture<'a, Vec<Option<bool>>> {
        self.inner.landed(items, receipt)
    }

    fn exact<'a>(&'a self, request: &'a ExactRequest) -> StoreFuture<'a, Decision> {
        let call = self.exact_calls.fetch_add(1, Ordering::Relaxed);
        if self.lost_exact_reply == Some(call) {
            return Box::pin(async move {
                self.inner.exact(request).await?;
                Err(StoreError::Timeout(Duration::from_millis(10)))
            });
        }
        self.inner.exact(request)
    }

    fn time(&self) -> StoreFuture<'_, Nanos> {
        self.inner.time()
    }

    fn describe(&self) -> String {
        "watched memory".into()
    }
}
