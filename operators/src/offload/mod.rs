//! The one way off the worker: an operator hands work to another thread together with a [`Promise`],
//! holds the batch's capability with the matching [`Ticket`] in [`Parked`], and is woken when the
//! promise is kept; activated, it takes what is ready and sends it on at the held capability.
//!
//! The threads that keep promises: an operator's own helper thread ([`Background`]: index writes, DLQ
//! writes, large documents' chunking, the guard's and the query source's reads), a pool of endpoint
//! call threads ([`CallPool`]: a reranker, a HyDE writer), the inference service's executors
//! (`embed::service`: ingest and query embeddings) and the contexts producer's delivery reports
//! (`io::context_sink`: the publish operator).
//!
//! # Guarantees
//! - A promise is kept once; keeping it stores the result, then calls the waker, so an operator
//!   woken finds the result in its ticket. A promise dropped unkept (its thread ended) wakes the
//!   operator too; its ticket stays empty.
//! - A parked batch keeps its capability until its result is taken: its time stays incomplete
//!   downstream (and its offsets uncommitted) while its work is off the worker.
//! - [`Parked::ready_in_order`] releases batches in the order they were parked; [`Parked::ready`] as
//!   their results come.
//! - Waits between the tries of work that meets an outage are one [`Backoff`](crate::outage::Backoff)'s,
//!   slept on the thread that does the work ([`with_backoff`]), never on a worker.

mod helper;
mod pool;

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

pub(crate) use helper::lower_priority;
pub use helper::{with_backoff, Background, Deliver, HELPER_NICE};
pub use pool::{Call, CallPool};

/// A callback that schedules the operator (a timely `SyncActivator` in the job).
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// A waker that schedules the operator at `address` on `worker` from any thread.
pub fn operator_waker(worker: &timely::worker::Worker, address: &[usize]) -> Waker {
    let activator = Mutex::new(worker.sync_activator_for(address.to_vec()));
    Arc::new(move || {
        // An error means the worker is gone (the dataflow was dropped): nothing left to wake.
        let _ = lock(&activator).activate();
    })
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

struct Slot<R> {
    result: Mutex<Option<R>>,
    ready: Condvar,
}

/// A promise of work done off the worker and the ticket its result comes back in; keeping the
/// promise calls `waker`.
pub fn promise<R>(waker: &Waker) -> (Promise<R>, Ticket<R>) {
    let slot = Arc::new(Slot {
        result: Mutex::new(None),
        ready: Condvar::new(),
    });
    let promise = Promise {
        slot: Some(slot.clone()),
        waker: waker.clone(),
    };
    (promise, Ticket { slot })
}

/// The sending half: kept by the thread that does the work.
pub struct Promise<R> {
    slot: Option<Arc<Slot<R>>>,
    waker: Waker,
}

impl<R> std::fmt::Debug for Promise<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Promise").finish_non_exhaustive()
    }
}

impl<R> Promise<R> {
    /// Stores `result` in the ticket and wakes the operator.
    pub fn keep(mut self, result: R) {
        if let Some(slot) = self.slot.take() {
            *lock(&slot.result) = Some(result);
            slot.ready.notify_all();
        }
        (self.waker)();
    }
}

impl<R> Drop for Promise<R> {
    fn drop(&mut self) {
        if self.slot.take().is_some() {
            // Broken (its thread ended): the operator looks again and finds nothing.
            (self.waker)();
        }
    }
}

/// The receiving half: held by the operator.
pub struct Ticket<R> {
    slot: Arc<Slot<R>>,
}

impl<R> std::fmt::Debug for Ticket<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").finish_non_exhaustive()
    }
}

impl<R> Ticket<R> {
    /// A ticket that already holds `result` (work that needed no thread).
    pub fn ready(result: R) -> Self {
        let (promise, ticket) = promise(&(Arc::new(|| {}) as Waker));
        promise.keep(result);
        ticket
    }

    /// The result, if the promise was kept (taken once: later calls answer `None`).
    pub fn try_take(&self) -> Option<R> {
        lock(&self.slot.result).take()
    }

    /// Whether the result is there to take.
    pub fn is_ready(&self) -> bool {
        lock(&self.slot.result).is_some()
    }

    /// Blocks until the promise is kept (startup work, benches and tools: never on a worker).
    pub fn wait(self) -> R {
        let mut result = lock(&self.slot.result);
        loop {
            if let Some(result) = result.take() {
                return result;
            }
            result = self
                .slot
                .ready
                .wait(result)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Batches whose work is off the worker, each with its capability (or whatever stands for its time),
/// its own data and its ticket.
pub struct Parked<C, T, R> {
    queue: VecDeque<(C, T, Ticket<R>)>,
}

impl<C, T, R> Default for Parked<C, T, R> {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
        }
    }
}

impl<C, T, R> std::fmt::Debug for Parked<C, T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked")
            .field("batches", &self.queue.len())
            .finish()
    }
}

impl<C, T, R> Parked<C, T, R> {
    /// Holds `batch` at `cap` until `ticket` has its result.
    pub fn park(&mut self, cap: C, batch: T, ticket: Ticket<R>) {
        self.queue.push_back((cap, batch, ticket));
    }

    /// Holds `batch` ahead of every other (work split and handed off again).
    pub fn park_first(&mut self, cap: C, batch: T, ticket: Ticket<R>) {
        self.queue.push_front((cap, batch, ticket));
    }

    /// The batches at the front whose results are in, in the order they were parked.
    pub fn ready_in_order(&mut self) -> Vec<(C, T, R)> {
        std::iter::from_fn(|| self.next_in_order()).collect()
    }

    /// The front batch, if its result is in.
    pub fn next_in_order(&mut self) -> Option<(C, T, R)> {
        let result = self.queue.front()?.2.try_take()?;
        let (cap, batch, _) = self.queue.pop_front()?;
        Some((cap, batch, result))
    }

    /// Every batch whose result is in, whatever the order.
    pub fn ready(&mut self) -> Vec<(C, T, R)> {
        let mut ready = Vec::new();
        let mut waiting = VecDeque::with_capacity(self.queue.len());
        for (cap, batch, ticket) in self.queue.drain(..) {
            match ticket.try_take() {
                Some(result) => ready.push((cap, batch, result)),
                None => waiting.push_back((cap, batch, ticket)),
            }
        }
        self.queue = waiting;
        ready
    }

    /// Batches parked.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Nothing parked.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counting_waker() -> (Waker, Arc<AtomicUsize>) {
        let woken = Arc::new(AtomicUsize::new(0));
        let count = woken.clone();
        let waker: Waker = Arc::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
        });
        (waker, woken)
    }

    #[test]
    fn keeping_a_promise_stores_the_result_before_waking() {
        let slot: Arc<Mutex<Option<Ticket<u32>>>> = Arc::default();
        let seen = Arc::new(Mutex::new(None));
        let (reader, found) = (slot.clone(), seen.clone());
        // The waker looks into the ticket: the result must already be there.
        let waker: Waker = Arc::new(move || {
            if let Some(ticket) = lock(&reader).as_ref() {
                *lock(&found) = ticket.try_take();
            }
        });
        let (promise, ticket) = promise(&waker);
        *lock(&slot) = Some(ticket);
        std::thread::spawn(move || promise.keep(7))
            .join()
            .expect("keeper");
        assert_eq!(*lock(&seen), Some(7));
    }

    #[test]
    fn a_broken_promise_wakes_the_operator_and_leaves_the_ticket_empty() {
        let (waker, woken) = counting_waker();
        let (promise, ticket) = promise::<u32>(&waker);
        drop(promise);
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        assert_eq!(ticket.try_take(), None);
    }

    #[test]
    fn parked_batches_leave_in_order_or_as_they_come() {
        let (waker, _) = counting_waker();
        let mut in_order: Parked<u64, &str, u32> = Parked::default();
        let mut any: Parked<u64, &str, u32> = Parked::default();
        let mut promises = Vec::new();
        for (time, name) in [(1, "a"), (2, "b"), (3, "c")] {
            let (p, t) = promise(&waker);
            in_order.park(time, name, t);
            let (q, u) = promise(&waker);
            any.park(time, name, u);
            promises.push((p, q));
        }
        let (a, b, c) = {
            let mut drain = promises.into_iter();
            (
                drain.next().unwrap(),
                drain.next().unwrap(),
                drain.next().unwrap(),
            )
        };
        b.0.keep(20);
        b.1.keep(20);
        assert!(in_order.ready_in_order().is_empty(), "b waits for a");
        assert_eq!(any.ready(), vec![(2, "b", 20)]);
        a.0.keep(10);
        c.0.keep(30);
        assert_eq!(
            in_order.ready_in_order(),
            vec![(1, "a", 10), (2, "b", 20), (3, "c", 30)]
        );
        assert!(in_order.is_empty());
        drop(a.1);
        assert_eq!(any.len(), 2, "a broken promise never releases its batch");
        c.1.keep(30);
        assert_eq!(any.ready(), vec![(3, "c", 30)]);
    }

    #[test]
    fn wait_blocks_until_the_promise_is_kept() {
        let (waker, _) = counting_waker();
        let (promise, ticket) = promise(&waker);
        let keeper = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            promise.keep("done");
        });
        assert_eq!(ticket.wait(), "done");
        keeper.join().expect("keeper");
        assert_eq!(Ticket::ready(3).try_take(), Some(3));
    }
}
