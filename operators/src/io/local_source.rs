//! LocalSource: the timely operator around [`DirSource`] and JSONL events (embedded default).
//!
//! Runs on worker 0 (the others finish at once). A directory is scanned (walked, read, hashed, its
//! files extracted by the sandbox) on the operator's helper thread, never on the worker. Emits at most `batch` events per activation at time
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
use timely::dataflow::operators::generic::{source, OutputBuilderSession};
use timely::dataflow::operators::Capability;
use timely::dataflow::{ProbeHandle, Scope, StreamVec};
use timely::scheduling::Activator;

use super::dir_source::DirSource;
use crate::ingest::dlq::DlqRecord;
use crate::model::DocOp;
use crate::offload::{Background, Ticket};

/// What a local source reads.
#[derive(Debug)]
pub enum LocalInput {
    /// A directory, rescanned every `rescan`.
    Dir {
        /// The scanner.
        source: Box<DirSource>,
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
type Posted = (Vec<Result<DocOp, DlqRecord>>, Waiter);

/// A posted request's reply, and what it holds until its documents are indexed (the HTTP server's
/// slot among the batches being written: a request whose caller stopped waiting still counts).
#[derive(Debug)]
struct Waiter {
    sender: mpsc::Sender<()>,
    _hold: Option<Box<dyn std::any::Any + Send>>,
}

impl DocumentIngress {
    /// Queues one request's documents; the receiver gets `()` once the index acknowledged them all,
    /// and is disconnected if the job stops before they were emitted.
    pub fn submit(&self, documents: Vec<Result<DocOp, DlqRecord>>) -> mpsc::Receiver<()> {
        self.submit_holding(documents, None)
    }

    /// [`Self::submit`], keeping `hold` until the documents are indexed (or the job stops), whether
    /// or not the receiver still waits.
    pub fn submit_holding(
        &self,
        documents: Vec<Result<DocOp, DlqRecord>>,
        hold: Option<Box<dyn std::any::Any + Send>>,
    ) -> mpsc::Receiver<()> {
        let (sender, receiver) = mpsc::channel();
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if !self.closed.load(Ordering::SeqCst) {
            queue.push_back((
                documents,
                Waiter {
                    sender,
                    _hold: hold,
                },
            ));
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
        let (input, scanner) = match input {
            Some(LocalInput::Dir { mut source, rescan }) => {
                let waker = crate::offload::operator_waker(scope.worker(), &info.address);
                let stop = shutdown.clone();
                let scanner: Background<(), Scanned> = Background::start(
                    "dir-scan",
                    move |(), deliver| deliver.send(source.scan_until(&stop)),
                    waker,
                );
                (Some(Input::Dir(rescan)), Some(scanner))
            }
            Some(LocalInput::Events(events)) => (Some(Input::Events(events)), None),
            None => (None, None),
        };
        let mut reader = LocalReader {
            input,
            scanner,
            scanning: None,
            config,
            acks,
            shutdown,
            posted,
            activator,
            queue: VecDeque::new(),
            last_scan: None,
            pending: BTreeMap::new(),
            bar: None,
            replies: BTreeMap::new(),
        };
        if let Some(Input::Events(events)) = reader.input.as_mut() {
            reader.queue.extend(events.drain(..));
            reader.bar = Some(progress_bar(reader.queue.len()));
        }
        move |output| {
            let Some(capability) = cap.as_mut() else {
                return;
            };
            reader.acknowledge();
            let in_flight: usize = reader.pending.values().sum();
            crate::metrics::metrics()
                .in_flight_messages
                .set((in_flight + reader.queue.len()) as i64);
            if reader.ending() {
                if reader.finish(in_flight) {
                    cap = None;
                }
                return;
            }
            reader.rescan();
            let time = crate::now_millis().max(*capability.time());
            capability.downgrade(&time);
            reader.emit_queued(capability, time, in_flight, output);
            let emitted_posts = reader.emit_posted(capability, output);
            reader.schedule(in_flight, emitted_posts);
        }
    })
}

/// The local source's output in one activation.
type LocalOutput<'a> =
    OutputBuilderSession<'a, u64, CapacityContainerBuilder<Vec<Result<DocOp, DlqRecord>>>>;

/// One scan's events.
type Scanned = Vec<Result<DocOp, DlqRecord>>;

/// What the operator reads (the directory's scanner lives on the helper thread).
enum Input {
    /// A directory, rescanned at this interval.
    Dir(Duration),
    /// Events of a JSONL file.
    Events(Vec<Result<DocOp, DlqRecord>>),
}

/// The local source between activations (worker 0).
struct LocalReader {
    input: Option<Input>,
    /// The directory's scanner on its helper thread, and the scan under way.
    scanner: Option<Background<(), Scanned>>,
    scanning: Option<Ticket<Scanned>>,
    config: LocalSourceConfig,
    acks: ProbeHandle<u64>,
    shutdown: Arc<AtomicBool>,
    posted: Option<Arc<DocumentIngress>>,
    activator: Activator,
    /// Events read and not emitted yet.
    queue: VecDeque<Result<DocOp, DlqRecord>>,
    /// When the directory was last scanned.
    last_scan: Option<Instant>,
    /// Events emitted and not acknowledged yet, by time.
    pending: BTreeMap<u64, usize>,
    /// The backfill's progress bar.
    bar: Option<ProgressBar>,
    /// Posted requests by the time their documents were emitted at.
    replies: BTreeMap<u64, Vec<Waiter>>,
}

impl LocalReader {
    /// Forgets the acknowledged times (advancing the progress bar) and tells their posted requests.
    fn acknowledge(&mut self) {
        while let Some(entry) = self.pending.first_entry() {
            if self.acks.less_equal(entry.key()) {
                break;
            }
            let done = entry.remove();
            if let Some(bar) = &self.bar {
                bar.inc(done as u64);
            }
        }
        while let Some(entry) = self.replies.first_entry() {
            if self.acks.less_equal(entry.key()) {
                break;
            }
            for reply in entry.remove() {
                let _ = reply.sender.send(());
            }
        }
    }

    /// Whether the source ends: shutdown (closing the posts) or a JSONL input all emitted.
    fn ending(&self) -> bool {
        let finished_events = matches!(self.input, Some(Input::Events(_)))
            && self.queue.is_empty()
            && self.posted.is_none();
        let stopping = self.shutdown.load(Ordering::SeqCst);
        if stopping {
            if let Some(posted) = &self.posted {
                posted.close();
            }
        }
        stopping || finished_events
    }

    /// Finishes the bar and returns true once nothing is in flight, else comes back later.
    fn finish(&mut self, in_flight: usize) -> bool {
        if in_flight == 0 {
            if let Some(bar) = self.bar.take() {
                bar.finish();
            }
            true
        } else {
            self.activator.activate_after(Duration::from_millis(10));
            false
        }
    }

    /// Takes a finished scan's events; starts the next scan on the helper thread when everything
    /// scanned was emitted and the interval passed since the last one ended.
    fn rescan(&mut self) {
        let (Some(Input::Dir(rescan)), Some(scanner)) = (&self.input, &self.scanner) else {
            return;
        };
        if let Some(ticket) = &self.scanning {
            let Some(scanned) = ticket.try_take() else {
                return;
            };
            self.scanning = None;
            if self.last_scan.is_none() && !scanned.is_empty() {
                self.bar = Some(progress_bar(scanned.len()));
            }
            self.queue.extend(scanned);
            self.last_scan = Some(Instant::now());
        }
        if self.queue.is_empty() && self.last_scan.is_none_or(|at| at.elapsed() >= *rescan) {
            self.scanning = Some(scanner.submit(()));
        }
    }

    /// Emits up to a batch of the queued events at `time`, within the flow control.
    fn emit_queued(
        &mut self,
        capability: &mut Capability<u64>,
        time: u64,
        in_flight: usize,
        output: &mut LocalOutput<'_>,
    ) {
        if in_flight < self.config.max_in_flight && !self.queue.is_empty() {
            let count = self.config.batch.min(self.queue.len());
            output
                .session(&*capability)
                .give_iterator(self.queue.drain(..count));
            self.pending.insert(time, count);
            // Counted in flight from the moment they are emitted (a reader of the two metrics
            // never sees them emitted and not in flight).
            crate::metrics::metrics()
                .in_flight_messages
                .set((in_flight + count + self.queue.len()) as i64);
            crate::metrics::metrics().source_events.inc_by(count as u64);
            capability.downgrade(&(time + 1));
        }
    }

    /// Emits the posted requests the flow control allows, each at its own time; whether any.
    fn emit_posted(
        &mut self,
        capability: &mut Capability<u64>,
        output: &mut LocalOutput<'_>,
    ) -> bool {
        // Posted documents: each request whole, at a time of its own, within the flow control.
        let mut emitted_posts = false;
        if let Some(posted) = &self.posted {
            let mut in_flight: usize = self.pending.values().sum();
            while in_flight < self.config.max_in_flight {
                let Some((documents, reply)) = posted.take() else {
                    break;
                };
                let time = crate::now_millis().max(*capability.time());
                capability.downgrade(&time);
                let count = documents.len();
                output
                    .session(&*capability)
                    .give_iterator(documents.into_iter());
                *self.pending.entry(time).or_insert(0) += count;
                self.replies.entry(time).or_default().push(reply);
                in_flight += count;
                crate::metrics::metrics()
                    .in_flight_messages
                    .set((in_flight + self.queue.len()) as i64);
                crate::metrics::metrics().source_events.inc_by(count as u64);
                capability.downgrade(&(time + 1));
                emitted_posts = true;
            }
        }
        emitted_posts
    }

    /// Schedules the next activation (finishing the progress bar when idle).
    fn schedule(&mut self, in_flight: usize, emitted_posts: bool) {
        if self.queue.is_empty() && in_flight == 0 && !emitted_posts {
            if let Some(bar) = self.bar.take() {
                bar.finish();
            }
            self.activator.activate_after(Duration::from_millis(100));
        } else {
            self.activator
                .activate_after(Duration::from_millis(if self.queue.is_empty() {
                    5
                } else {
                    1
                }));
        }
    }
}
