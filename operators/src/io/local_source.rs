//! LocalSource: the timely operator around [`DirSource`] and JSONL events (embedded default).
//!
//! Runs on worker 0 (the others finish at once). Emits at most `batch` events per activation at time
//! `max(now_ms, previous + 1)`, and waits while more than `max_in_flight` events are unacknowledged by
//! the index (the same flow control as the Kafka source). A JSONL input finishes when every event is
//! acknowledged; a directory input rescans on its interval until shutdown. Backfills show a progress bar
//! on a terminal.
//!
//! With a [`DocumentIngress`] (documents posted to the job's HTTP API) the source also emits what is
//! posted, each request's documents at one time, and tells the request once the index acknowledged
//! that time: the local equivalent of a committed offset. A JSONL input then stays open after its
//! last event, for the posts to come.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::generic::source;
use timely::dataflow::{ProbeHandle, Scope, StreamVec};

use super::dir_source::DirSource;
use crate::ingest::dlq::DlqRecord;
use crate::model::DocOp;

/// What a local source reads.
#[derive(Debug)]
pub enum LocalInput {
    /// A directory, rescanned every `rescan`.
    Dir {
        /// The scanner.
        source: DirSource,
        /// Interval between scans.
        rescan: Duration,
    },
    /// Events read from a JSONL file, sent once.
    Events(Vec<Result<DocOp, DlqRecord>>),
}

/// Documents posted to the job's HTTP API in local mode, waiting for the local source.
#[derive(Debug, Default)]
pub struct DocumentIngress {
    queue: Mutex<VecDeque<Posted>>,
    closed: AtomicBool,
}

/// One request's documents and where to tell it they were indexed.
type Posted = (Vec<Result<DocOp, DlqRecord>>, mpsc::Sender<()>);

impl DocumentIngress {
    /// Queues one request's documents; the receiver gets `()` once the index acknowledged them all,
    /// and is disconnected if the job stops before they were emitted.
    pub fn submit(&self, documents: Vec<Result<DocOp, DlqRecord>>) -> mpsc::Receiver<()> {
        let (sender, receiver) = mpsc::channel();
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if !self.closed.load(Ordering::SeqCst) {
            queue.push_back((documents, sender));
        }
        receiver
    }

    /// Stops taking documents: queued requests are disconnected.
    pub fn close(&self) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        self.closed.store(true, Ordering::SeqCst);
        queue.clear();
    }

    fn take(&self) -> Option<Posted> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }
}

/// Flow control of a local source.
#[derive(Debug, Clone, Copy)]
pub struct LocalSourceConfig {
    /// Events per emitted batch.
    pub batch: usize,
    /// Unacknowledged events above which the source waits.
    pub max_in_flight: usize,
}

fn progress_bar(total: usize) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} indexed {pos}/{len} documents [{elapsed_precise}] {per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    bar
}

/// The operator; `input` is `None` on workers other than 0.
pub fn local_source<'scope>(
    scope: Scope<'scope, u64>,
    input: Option<LocalInput>,
    config: LocalSourceConfig,
    acks: ProbeHandle<u64>,
    shutdown: Arc<AtomicBool>,
    posted: Option<Arc<DocumentIngress>>,
) -> StreamVec<'scope, u64, Result<DocOp, DlqRecord>> {
    source::<_, CapacityContainerBuilder<Vec<_>>, _, _>(scope, "LocalSource", move |cap, info| {
        let activator = scope.activator_for(info.address.clone());
        let mut cap = input.is_some().then_some(cap);
        let mut input = input;
        let mut queue: VecDeque<Result<DocOp, DlqRecord>> = VecDeque::new();
        let mut last_scan: Option<Instant> = None;
        let mut pending: BTreeMap<u64, usize> = BTreeMap::new();
        let mut bar: Option<ProgressBar> = None;
        // Posted requests by the time their documents were emitted at.
        let mut replies: BTreeMap<u64, Vec<mpsc::Sender<()>>> = BTreeMap::new();
        if let Some(LocalInput::Events(events)) = input.as_mut() {
            queue.extend(events.drain(..));
            bar = Some(progress_bar(queue.len()));
        }
        move |output| {
            let Some(capability) = cap.as_mut() else {
                return;
            };
            while let Some(entry) = pending.first_entry() {
                if acks.less_equal(entry.key()) {
                    break;
                }
                let done = entry.remove();
                if let Some(bar) = &bar {
                    bar.inc(done as u64);
                }
            }
            while let Some(entry) = replies.first_entry() {
                if acks.less_equal(entry.key()) {
                    break;
                }
                for reply in entry.remove() {
                    let _ = reply.send(());
                }
            }
            let in_flight: usize = pending.values().sum();
            crate::metrics::metrics()
                .in_flight_messages
                .set((in_flight + queue.len()) as i64);
            let finished_events = matches!(input, Some(LocalInput::Events(_)))
                && queue.is_empty()
                && posted.is_none();
            let stopping = shutdown.load(Ordering::SeqCst);
            if stopping {
                if let Some(posted) = &posted {
                    posted.close();
                }
            }
            if stopping || finished_events {
                if in_flight == 0 {
                    if let Some(bar) = bar.take() {
                        bar.finish();
                    }
                    cap = None;
                } else {
                    activator.activate_after(Duration::from_millis(10));
                }
                return;
            }
            if let Some(LocalInput::Dir { source, rescan }) = input.as_mut() {
                if queue.is_empty() && last_scan.is_none_or(|at| at.elapsed() >= *rescan) {
                    queue.extend(source.scan());
                    if last_scan.is_none() && !queue.is_empty() {
                        bar = Some(progress_bar(queue.len()));
                    }
                    last_scan = Some(Instant::now());
                }
            }
            let time = crate::now_millis().max(*capability.time());
            capability.downgrade(&time);
            if in_flight < config.max_in_flight && !queue.is_empty() {
                let count = config.batch.min(queue.len());
                output
                    .session(&*capability)
                    .give_iterator(queue.drain(..count));
                pending.insert(time, count);
                // Counted in flight from the moment they are emitted (a reader of the two metrics
                // never sees them emitted and not in flight).
                crate::metrics::metrics()
                    .in_flight_messages
                    .set((in_flight + count + queue.len()) as i64);
                crate::metrics::metrics().source_events.inc_by(count as u64);
                capability.downgrade(&(time + 1));
            }
            // Posted documents: each request whole, at a time of its own, within the flow control.
            let mut emitted_posts = false;
            if let Some(posted) = &posted {
                let mut in_flight: usize = pending.values().sum();
                while in_flight < config.max_in_flight {
                    let Some((documents, reply)) = posted.take() else {
                        break;
                    };
                    let time = crate::now_millis().max(*capability.time());
                    capability.downgrade(&time);
                    let count = documents.len();
                    output
                        .session(&*capability)
                        .give_iterator(documents.into_iter());
                    *pending.entry(time).or_insert(0) += count;
                    replies.entry(time).or_default().push(reply);
                    in_flight += count;
                    crate::metrics::metrics()
                        .in_flight_messages
                        .set((in_flight + queue.len()) as i64);
                    crate::metrics::metrics().source_events.inc_by(count as u64);
                    capability.downgrade(&(time + 1));
                    emitted_posts = true;
                }
            }
            if queue.is_empty() && in_flight == 0 && !emitted_posts {
                if let Some(bar) = bar.take() {
                    bar.finish();
                }
                activator.activate_after(Duration::from_millis(100));
            } else {
                activator.activate_after(Duration::from_millis(if queue.is_empty() {
                    5
                } else {
                    1
                }));
            }
        }
    })
}
