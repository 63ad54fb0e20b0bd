//! Requests whose body is still arriving, per listener: at most `max_bodies_waiting` of them
//! and `max_waiting_body_bytes` buffered. Beyond either bound the request that has waited
//! longest is dropped, not the newcomer: a client holding streams open ages first, while a
//! legitimate request whose body arrives within milliseconds is never the oldest.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// The waiting room of one listener.
#[derive(Debug)]
pub(crate) struct Waiting {
    queue: Mutex<Queue>,
    max_count: usize,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Queue {
    next: u64,
    bytes: usize,
    /// By arrival: the first entry has waited longest.
    waiters: BTreeMap<u64, Waiter>,
}

#[derive(Debug)]
struct Waiter {
    evict: oneshot::Sender<()>,
    bytes: usize,
}

impl Queue {
    fn evict_oldest(&mut self) {
        if let Some((_, waiter)) = self.waiters.pop_first() {
            self.bytes -= waiter.bytes;
            let _ = waiter.evict.send(());
        }
    }
}

impl Waiting {
    pub(crate) fn new(max_count: usize, max_bytes: usize) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            max_count: max_count.max(1),
            max_bytes,
        }
    }

    /// Enters the room, making space by dropping the longest-waiting request if it is full.
    /// The second half resolves if the room drops this request in turn.
    pub(crate) fn enter(self: &Arc<Self>) -> (Ticket, Evicted) {
        let (evict, evicted) = oneshot::channel();
        let mut queue = self.queue.lock();
        let id = queue.next;
        queue.next += 1;
        queue.waiters.insert(id, Waiter { evict, bytes: 0 });
        while queue.waiters.len() > self.max_count {
            queue.evict_oldest();
        }
        drop(queue);
        (
            Ticket {
                room: self.clone(),
                id,
            },
            Evicted(evicted),
        )
    }

    /// Requests waiting now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.queue.lock().waiters.len()
    }
}

/// A request's place in the waiting room; leaving (drop) frees its place and its bytes.
#[derive(Debug)]
pub(crate) struct Ticket {
    room: Arc<Waiting>,
    id: u64,
}

/// Resolves when the room dropped its request to make space.
#[derive(Debug)]
pub(crate) struct Evicted(oneshot::Receiver<()>);

impl Evicted {
    /// Waits for the word. (The sender goes away without one only when the ticket is
    /// dropped, and then nobody waits any more.)
    pub(crate) async fn wait(self) {
        let _ = self.0.await;
    }
}

impl Ticket {
    /// Counts `n` more bytes buffered for this request; if the room then holds more than its
    /// byte budget, the longest-waiting requests (this one, possibly) are dropped.
    pub(crate) fn buffered(&self, n: usize) {
        let mut queue = self.room.queue.lock();
        let Some(waiter) = queue.waiters.get_mut(&self.id) else {
            return;
        };
        waiter.bytes += n;
        queue.bytes += n;
        while queue.bytes > self.room.max_bytes && !queue.waiters.is_empty() {
            queue.evict_oldest();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut queue = self.room.queue.lock();
        if let Some(waiter) = queue.waiters.remove(&self.id) {
            queue.bytes -= waiter.bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_evicted(evicted: &mut Evicted) -> bool {
        evicted.0.try_recv().is_ok()
    }

    #[test]
    fn a_full_room_drops_the_request_that_waited_longest() {
        let room = Arc::new(Waiting::new(3, 1 << 20));
        let (first, mut first_out) = room.enter();
        let (_second, mut second_out) = room.enter();
        let _third = room.enter();
        assert_eq!(room.len(), 3);
        let (fourth, mut fourth_out) = room.enter();
        assert!(is_evicted(&mut first_out));
        assert!(!is_evicted(&mut second_out));
        assert!(!is_evicted(&mut fourth_out));
        assert_eq!(room.len(), 3);
        drop(first);
        drop(fourth);
        assert_eq!(room.len(), 2);
    }

    #[test]
    fn buffered_bytes_over_the_budget_drop_the_oldest_and_leaving_returns_them() {
        let room = Arc::new(Waiting::new(100, 1000));
        let (old, mut old_out) = room.enter();
        old.buffered(600);
        let (new, mut new_out) = room.enter();
        new.buffered(300);
        assert!(!is_evicted(&mut old_out));
        new.buffered(200);
        assert!(
            is_evicted(&mut old_out),
            "900 + 200 > 1000: the oldest goes"
        );
        assert!(!is_evicted(&mut new_out));
        assert_eq!(room.queue.lock().bytes, 500);
        drop(new);
        assert_eq!(room.queue.lock().bytes, 0);
        // A single request over the whole budget drops itself.
        let (greedy, mut greedy_out) = room.enter();
        greedy.buffered(2000);
        assert!(is_evicted(&mut greedy_out));
        assert_eq!(room.queue.lock().bytes, 0);
    }
}
