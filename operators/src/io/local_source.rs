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
//! posted, each request's documents at one time, and tells the request (its [`Receipt`]) once every
//! document of it is finished: written by the index (or dead-lettered), as the index writers record
//! ([`Written`](crate::ingest::written::Written)), or its time acknowledged by the index, the local equivalent of a committed offset.
//! A JSONL input then stays open after its last event, for the posts to come.
//!
//! # Fair across tenants
//! Posted requests queue per tenant (the lane of a request is its first document's tenant) and
//! leave by deficit round robin over their bytes; a lane waits while its documents emitted and not
//! finished hold [`LocalSourceConfig::lane_bytes`] or more (the directory's or the JSONL file's
//! events are a lane of their own under the same bound). A tenant's large document or flood then
//! queues behind that tenant's own work, not in front of the others' (the Embed operator and the
//! inference service take turns per tenant too). With `fair` off, one lane, first in first out.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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

mod ingress;
mod tracker;

use ingress::event_bytes;
pub use ingress::{DocumentIngress, Receipt, ReceiptState};
use tracker::Tracker;

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

/// Flow control of a local source.
#[derive(Debug, Clone, Copy)]
pub struct LocalSourceConfig {
    /// Events per emitted batch.
    pub batch: usize,
    /// Events emitted and not finished above which the source waits.
    pub max_in_flight: usize,
    /// Bytes of a lane's documents emitted and not finished at which the lane waits (at least one
    /// request of a lane always goes); `usize::MAX`: no bound.
    pub lane_bytes: usize,
}

/// The lane of the directory's or the JSONL file's events.
const SOURCE_LANE: &str = "\u{0}source";

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
            tracker: Tracker::default(),
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
                .set((reader.tracker.in_flight() + reader.queue.len()) as i64);
            if reader.ending() {
                if reader.finish(in_flight) {
                    cap = None;
                }
                return;
            }
            reader.rescan();
            let time = crate::now_millis().max(*capability.time());
            capability.downgrade(&time);
            reader.emit_queued(capability, time, output);
            let emitted_posts = reader.emit_posted(capability, output);
            reader.schedule(reader.tracker.in_flight(), emitted_posts);
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
    /// Events emitted and not finished, one by one, and the posted requests waiting for them.
    tracker: Tracker,
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
        self.tracker.frontier(&self.acks);
        if let Some(posted) = &self.posted {
            for (key, time) in posted.written().take() {
                self.tracker.finish_document(&key, time);
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

    /// Emits up to a batch of the queued events at `time`, within the flow control and the source
    /// lane's bound.
    fn emit_queued(
        &mut self,
        capability: &mut Capability<u64>,
        time: u64,
        output: &mut LocalOutput<'_>,
    ) {
        let lane: Arc<str> = SOURCE_LANE.into();
        let mut count = 0;
        let mut bytes = self.tracker.lane_bytes(&lane);
        while self.tracker.in_flight() + count < self.config.max_in_flight
            && count < self.config.batch.min(self.queue.len())
            && (count == 0 || bytes < self.config.lane_bytes)
            && (bytes < self.config.lane_bytes || bytes == 0)
        {
            bytes = bytes.saturating_add(event_bytes(&self.queue[count]));
            count += 1;
        }
        if count == 0 {
            return;
        }
        for event in self.queue.iter().take(count) {
            self.tracker.emitted(time, event, &lane, None);
        }
        output
            .session(&*capability)
            .give_iterator(self.queue.drain(..count));
        self.pending.insert(time, count);
        // Counted in flight from the moment they are emitted (a reader of the two metrics never
        // sees them emitted and not in flight).
        crate::metrics::metrics()
            .in_flight_messages
            .set((self.tracker.in_flight() + self.queue.len()) as i64);
        crate::metrics::metrics().source_events.inc_by(count as u64);
        capability.downgrade(&(time + 1));
    }

    /// Emits the posted requests the flow control and their lanes' bounds allow, each at its own
    /// time; whether any.
    fn emit_posted(
        &mut self,
        capability: &mut Capability<u64>,
        output: &mut LocalOutput<'_>,
    ) -> bool {
        let mut emitted_posts = false;
        let Some(posted) = self.posted.clone() else {
            return false;
        };
        while self.tracker.in_flight() < self.config.max_in_flight {
            let tracker = &self.tracker;
            let limit = self.config.lane_bytes;
            let Some((lane, request)) = posted.take(|lane| tracker.lane_bytes(lane) < limit) else {
                break;
            };
            let time = crate::now_millis().max(*capability.time());
            capability.downgrade(&time);
            let count = request.documents.len();
            let id = self.tracker.request(request.waiter, count);
            for event in &request.documents {
                self.tracker.emitted(time, event, &lane, Some(id));
            }
            output
                .session(&*capability)
                .give_iterator(request.documents.into_iter());
            *self.pending.entry(time).or_insert(0) += count;
            crate::metrics::metrics()
                .in_flight_messages
                .set((self.tracker.in_flight() + self.queue.len()) as i64);
            crate::metrics::metrics().source_events.inc_by(count as u64);
            capability.downgrade(&(time + 1));
            emitted_posts = true;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DocKey;

    // The source's events are `Result<DocOp, DlqRecord>`: refusals travel as data.
    #[allow(clippy::result_large_err)]
    fn upsert(tenant: &str, id: &str, bytes: usize) -> Result<DocOp, DlqRecord> {
        Ok(DocOp::Upsert(ragstream_core::testing::prose(
            tenant,
            id,
            &"x".repeat(bytes),
        )))
    }

    #[test]
    fn tenants_take_turns_by_bytes_and_a_full_lane_waits() {
        let ingress = DocumentIngress::new(true);
        let big = ingress.submit(vec![upsert("a", "big", 7 << 20)], None);
        let _next = ingress.submit(vec![upsert("a", "next", 7 << 20)], None);
        let small = ingress.submit(vec![upsert("b", "small", 1024)], None);
        // By bytes: b's kilobyte goes before a's megabytes, though posted after them.
        let (lane, first) = ingress.take(|_| true).expect("a request");
        assert_eq!((&*lane, first.bytes), ("b", 1024));
        // A lane at its bound waits; the others go on.
        assert!(ingress.take(|lane| lane != "a").is_none());
        let (lane, second) = ingress.take(|_| true).expect("a's first");
        assert_eq!((&*lane, second.bytes), ("a", 7 << 20));
        // Emitted and finished document by document, before any frontier.
        let mut tracker = Tracker::default();
        let lane: Arc<str> = "a".into();
        let id = tracker.request(second.waiter, 1);
        tracker.emitted(10, &second.documents[0], &lane, Some(id));
        assert_eq!(tracker.lane_bytes("a"), 7 << 20);
        assert_eq!(big.state(), ReceiptState::Queued);
        tracker.finish_document(&DocKey::new("a", "big"), 9);
        assert_eq!(big.state(), ReceiptState::Queued, "another time's event");
        tracker.finish_document(&DocKey::new("a", "big"), 10);
        assert_eq!(big.state(), ReceiptState::Indexed);
        assert_eq!((tracker.lane_bytes("a"), tracker.in_flight()), (0, 0));
        // A request dropped unfinished (the job stopping) says so.
        drop(first);
        assert_eq!(small.state(), ReceiptState::Stopped);
        // One lane, first in first out, where the ingress is not fair.
        let fifo = DocumentIngress::new(false);
        fifo.submit(vec![upsert("a", "big", 7 << 20)], None);
        fifo.submit(vec![upsert("b", "small", 1024)], None);
        assert_eq!(fifo.take(|_| true).expect("first").1.bytes, 7 << 20);
    }
}
