//! A helper thread of one operator: runs its slow calls (index writes, DLQ writes) off the dataflow
//! worker, one job at a time in submission order, and wakes the operator after each.
//!
//! # Guarantees
//! - Results come back in the order the jobs were submitted, one per job.
//! - The waker is called after each result is ready to take (in the job, so the job may go on with
//!   housekeeping, such as an index optimization, after its result was delivered).
//! - Dropping the handle lets the thread finish the jobs already submitted, then joins it.
//! - On Linux the thread runs at nice [`HELPER_NICE`] (threads it starts, such as the index's
//!   optimizer pool, inherit it): where the cores are short, the worker's queries go first and the
//!   helper takes the rest of the CPU. Elsewhere the thread keeps the process's priority.
//!
//! [`with_backoff`] retries a job's outages with capped exponential backoff on the helper thread.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::events::{InternalEvent, Retrying};

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

/// A callback that schedules the operator (a timely `SyncActivator` in the job).
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// A waker that schedules the operator at `address` on `worker` from any thread.
pub fn operator_waker(worker: &timely::worker::Worker, address: &[usize]) -> Waker {
    let activator = std::sync::Mutex::new(worker.sync_activator_for(address.to_vec()));
    Arc::new(move || {
        // An error means the worker is gone (the dataflow was dropped): nothing left to wake.
        let _ = activator
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .activate();
    })
}

/// Hands a job's result to the operator and wakes it.
pub struct Deliver<O> {
    results: Sender<O>,
    waker: Waker,
}

impl<O> Deliver<O> {
    /// Delivers the result of the current job (call once per job).
    pub fn send(&self, result: O) {
        if self.results.send(result).is_ok() {
            (self.waker)();
        }
    }
}

/// The handle an operator keeps.
pub struct Background<I, O> {
    jobs: Option<Sender<I>>,
    results: Receiver<O>,
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
        let (jobs, inbox) = channel::<I>();
        let (results, outbox) = channel();
        let deliver = Deliver { results, waker };
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                lower_priority();
                loop {
                    let job = match idle {
                        Some(idle) => match inbox.recv_timeout(idle) {
                            Ok(job) => Some(job),
                            Err(RecvTimeoutError::Timeout) => None,
                            Err(RecvTimeoutError::Disconnected) => return,
                        },
                        None => match inbox.recv() {
                            Ok(job) => Some(job),
                            Err(_) => return,
                        },
                    };
                    work(job, &deliver);
                }
            })
            .expect("a helper thread starts");
        Self {
            jobs: Some(jobs),
            results: outbox,
            thread: Some(thread),
        }
    }

    /// Queues a job.
    pub fn submit(&self, job: I) {
        self.jobs
            .as_ref()
            .expect("helper running")
            .send(job)
            .expect("the helper thread is alive");
    }

    /// The oldest result not yet taken, if it is ready.
    pub fn try_result(&self) -> Option<O> {
        self.results.try_recv().ok()
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

/// Runs `attempt` until it succeeds or fails with a non-retryable error, backing off exponentially.
///
/// For the helper threads' jobs (index writes, DLQ writes): the sleeps happen there, never on a worker.
/// The embedder's outages are retried by the inference service instead.
pub fn with_backoff<T, E: std::fmt::Display>(
    component: &str,
    retryable: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut backoff = crate::outage::Backoff::default();
    // Lives while this call retries: the outage `/readyz` and the `ragstream_outage` gauge show.
    let mut outage: Option<crate::outage::Retrying> = None;
    loop {
        match attempt() {
            Err(error) if retryable(&error) => {
                match &outage {
                    Some(outage) => outage.failed_again(&error),
                    None => outage = Some(crate::outage::Retrying::begin(component, &error)),
                }
                let delay = backoff.next_delay();
                Retrying {
                    component,
                    error: &error,
                    delay,
                }
                .emit();
                std::thread::sleep(delay);
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
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
        for job in 0..3 {
            helper.submit(job);
        }
        let mut results = Vec::new();
        while results.len() < 3 {
            let thread = woken.recv_timeout(Duration::from_secs(5)).expect("woken");
            assert_eq!(thread.as_deref(), Some("helper-test"));
            while let Some(result) = helper.try_result() {
                results.push(result);
            }
        }
        assert_eq!(results, vec![0, 2, 4]);
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
        for job in 0..4 {
            helper.submit(job);
        }
        drop(helper);
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
        helper.submit(());
        woken.recv_timeout(Duration::from_secs(5)).expect("woken");
        let helper_nice = helper.try_result().expect("a result");
        assert_eq!(nice(), caller, "the caller's priority is untouched");
        assert_eq!(helper_nice, caller.max(HELPER_NICE));
    }
}
