//! A helper thread of one operator: runs its slow calls (index writes, DLQ writes, large documents'
//! chunking, reads) off the dataflow worker, one job at a time in submission order; each job's
//! result comes back in the [`Ticket`] [`Background::submit`] returned.
//!
//! # Guarantees
//! - Jobs run one at a time in the order they were submitted; each job's promise is kept once.
//! - The waker is called after each result is ready to take (in the job, so the job may go on with
//!   housekeeping, such as an index optimization, after its result was delivered).
//! - Dropping the handle lets the thread finish the jobs already submitted, then joins it.
//! - On Linux the thread runs at nice [`HELPER_NICE`] (threads it starts, such as the index's
//!   optimizer pool, inherit it): where the cores are short, the worker's queries go first and the
//!   helper takes the rest of the CPU. Elsewhere the thread keeps the process's priority.
//!
//! [`with_backoff`] retries a job's outages with capped exponential backoff on the helper thread.

use std::cell::Cell;
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{promise, Promise, Ticket, Waker};

/// The nice value of helper threads: CFS gives a nice-0 thread about 3x this one's CPU share
/// when both want the same core.
pub const HELPER_NICE: i32 = 5;

/// Lowers the calling thread's CPU priority to [`HELPER_NICE`] (Linux: nice is a thread's own).
pub(crate) fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: `gettid` has no preconditions; `setpriority` on the caller's own thread id only
    // changes that thread's nice value (raising it needs no privilege).
    unsafe {
        let tid = libc::gettid();
        if libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, HELPER_NICE) != 0 {
            tracing::debug!("helper thread keeps the process's CPU priority");
        }
    }
}

/// Hands a job's result to the operator and wakes it.
pub struct Deliver<O> {
    promise: Cell<Option<Promise<O>>>,
}

impl<O> Deliver<O> {
    /// Delivers the result of the current job (once per job; an idle call has nothing to deliver).
    pub fn send(&self, result: O) {
        if let Some(promise) = self.promise.take() {
            promise.keep(result);
        }
    }
}

/// The handle an operator keeps.
pub struct Background<I, O> {
    jobs: Option<Sender<(I, Promise<O>)>>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

impl<I, O> std::fmt::Debug for Background<I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Background").finish_non_exhaustive()
    }
}

impl<I: Send + 'static, O: Send + 'static> Background<I, O> {
    /// Starts a thread named `name` that runs `work` on each job; `work` delivers the job's result.
    pub fn start(
        name: &str,
        mut work: impl FnMut(I, &Deliver<O>) + Send + 'static,
        waker: Waker,
    ) -> Self {
        Self::start_idle(
            name,
            None,
            move |job, deliver| {
                if let Some(job) = job {
                    work(job, deliver);
                }
            },
            waker,
        )
    }

    /// As [`Background::start`], and `work(None)` runs once whenever no job came for `idle` (again
    /// after each further `idle` without jobs).
    pub fn start_idle(
        name: &str,
        idle: Option<Duration>,
        mut work: impl FnMut(Option<I>, &Deliver<O>) + Send + 'static,
        waker: Waker,
    ) -> Self {
        let (jobs, inbox) = channel::<(I, Promise<O>)>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                lower_priority();
                loop {
                    let next = match idle {
                        Some(idle) => match inbox.recv_timeout(idle) {
                            Ok(next) => Some(next),
                            Err(RecvTimeoutError::Timeout) => None,
                            Err(RecvTimeoutError::Disconnected) => return,
                        },
                        None => match inbox.recv() {
                            Ok(next) => Some(next),
                            Err(_) => return,
                        },
                    };
                    let (job, promise) = next.unzip();
                    let deliver = Deliver {
                        promise: Cell::new(promise),
                    };
                    work(job, &deliver);
                }
            })
            .expect("a helper thread starts");
        Self {
            jobs: Some(jobs),
            waker,
            thread: Some(thread),
        }
    }

    /// Queues a job; its result comes back in the ticket.
    pub fn submit(&self, job: I) -> Ticket<O> {
        let (promise, ticket) = promise(&self.waker);
        self.jobs
            .as_ref()
            .expect("helper running")
            .send((job, promise))
            .expect("the helper thread is alive");
        ticket
    }
}

impl<I, O> Drop for Background<I, O> {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs `attempt` until it succeeds or fails with a non-retryable error: a
/// [`Retry`](crate::outage::Retry) of `dependency` without limit.
///
/// For the helper threads' jobs (index writes, DLQ writes): the sleeps happen there, never on a worker.
/// The embedder's outages are retried by the inference service instead.
pub fn with_backoff<T, E: std::fmt::Display>(
    dependency: crate::outage::Dependency,
    retryable: impl Fn(&E) -> bool,
    attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    crate::outage::Retry::new(dependency)
        .run(retryable, attempt)
        .map_err(crate::outage::GaveUp::into_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[test]
    fn results_come_back_in_order_from_the_helper_thread_and_wake_the_operator() {
        let (sender, woken) = channel();
        let sender = Mutex::new(sender);
        let waker: Waker = Arc::new(move || {
            let name = std::thread::current().name().map(str::to_string);
            let _ = sender.lock().unwrap().send(name);
        });
        let helper = Background::start(
            "helper-test",
            |job: u32, deliver: &Deliver<u32>| {
                // Later jobs are quicker: order must still hold.
                std::thread::sleep(Duration::from_millis(u64::from(30 - job * 10)));
                deliver.send(job * 2);
            },
            waker,
        );
        let mut parked = super::super::Parked::default();
        for job in 0..3 {
            parked.park(job, (), helper.submit(job));
        }
        let mut results = Vec::new();
        while results.len() < 3 {
            let thread = woken.recv_timeout(Duration::from_secs(5)).expect("woken");
            assert_eq!(thread.as_deref(), Some("helper-test"));
            results.extend(parked.ready_in_order());
        }
        assert_eq!(results, vec![(0, (), 0), (1, (), 2), (2, (), 4)]);
    }

    #[test]
    fn dropping_the_handle_finishes_the_submitted_jobs() {
        let done = Arc::new(Mutex::new(Vec::new()));
        let seen = done.clone();
        let helper = Background::start(
            "helper-drop",
            move |job: u32, deliver: &Deliver<()>| {
                std::thread::sleep(Duration::from_millis(5));
                seen.lock().unwrap().push(job);
                deliver.send(());
            },
            Arc::new(|| {}),
        );
        let tickets: Vec<_> = (0..4).map(|job| helper.submit(job)).collect();
        drop(helper);
        assert!(tickets.iter().all(Ticket::is_ready));
        assert_eq!(*done.lock().unwrap(), vec![0, 1, 2, 3]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_helper_thread_runs_at_a_lower_cpu_priority_than_its_caller() {
        fn nice() -> i32 {
            // SAFETY: reads the calling thread's own nice value.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        }
        let caller = nice();
        let (sender, woken) = channel();
        let sender = Mutex::new(sender);
        let helper = Background::start(
            "helper-nice",
            move |(), deliver: &Deliver<i32>| deliver.send(nice()),
            Arc::new(move || {
                let _ = sender.lock().unwrap().send(());
            }),
        );
        let ticket = helper.submit(());
        woken.recv_timeout(Duration::from_secs(5)).expect("woken");
        let helper_nice = ticket.try_take().expect("a result");
        assert_eq!(nice(), caller, "the caller's priority is untouched");
        assert_eq!(helper_nice, caller.max(HELPER_NICE));
    }
}
