//! The events a local source emitted and not yet finished, per lane and per posted request.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use timely::dataflow::ProbeHandle;

use super::ingress::{event_bytes, ReceiptState, Waiter};
use crate::ingest::dlq::DlqRecord;
use crate::model::{DocKey, DocOp};

/// Events emitted and not finished: each is finished when an index writer records its document
/// ([`Written`](crate::ingest::written::Written)) or when the index acknowledged its time, whichever comes first; a posted request's
/// receipt settles when its last event is finished.
#[derive(Default)]
pub(super) struct Tracker {
    /// Unfinished events by id.
    events: HashMap<u64, Tracked>,
    /// Ids by event time.
    by_time: BTreeMap<u64, Vec<u64>>,
    /// Ids by document and event time.
    by_document: HashMap<(DocKey, u64), Vec<u64>>,
    /// Bytes unfinished per lane.
    lanes: HashMap<Arc<str>, usize>,
    /// Posted requests by id: their waiter and events unfinished.
    requests: HashMap<u64, (Waiter, usize)>,
    next: u64,
}

/// One event in flight.
struct Tracked {
    key: Option<DocKey>,
    lane: Arc<str>,
    bytes: usize,
    request: Option<u64>,
}

impl Tracker {
    /// Events emitted and not finished.
    pub(super) fn in_flight(&self) -> usize {
        self.events.len()
    }

    /// Bytes of `lane`'s events in flight.
    pub(super) fn lane_bytes(&self, lane: &str) -> usize {
        self.lanes.get(lane).copied().unwrap_or(0)
    }

    /// A posted request of `events` events; its id.
    pub(super) fn request(&mut self, waiter: Waiter, events: usize) -> u64 {
        self.next += 1;
        if events == 0 {
            waiter.receipt.settle(ReceiptState::Indexed);
        } else {
            self.requests.insert(self.next, (waiter, events));
        }
        self.next
    }

    /// `event` emitted at `time` in `lane`, of `request` where posted.
    pub(super) fn emitted(
        &mut self,
        time: u64,
        event: &Result<DocOp, DlqRecord>,
        lane: &Arc<str>,
        request: Option<u64>,
    ) {
        self.next += 1;
        let id = self.next;
        let bytes = event_bytes(event);
        *self.lanes.entry(lane.clone()).or_default() += bytes;
        self.events.insert(
            id,
            Tracked {
                key: event.as_ref().ok().map(|op| op.key().clone()),
                lane: lane.clone(),
                bytes,
                request,
            },
        );
        self.by_time.entry(time).or_default().push(id);
        if let Ok(op) = event {
            self.by_document
                .entry((op.key().clone(), time))
                .or_default()
                .push(id);
        }
    }

    /// An index writer finished `key`'s event of `time`.
    pub(super) fn finish_document(&mut self, key: &DocKey, time: u64) {
        if let Some(ids) = self.by_document.remove(&(key.clone(), time)) {
            for id in ids {
                self.finish(id);
            }
        }
    }

    /// Finishes every event of a time the index acknowledged.
    pub(super) fn frontier(&mut self, acks: &ProbeHandle<u64>) {
        while let Some(entry) = self.by_time.first_entry() {
            if acks.less_equal(entry.key()) {
                break;
            }
            let time = *entry.key();
            for id in entry.remove() {
                let key = self.events.get(&id).and_then(|e| e.key.clone());
                if let Some(key) = key {
                    self.by_document.remove(&(key, time));
                }
                self.finish(id);
            }
        }
    }

    pub(super) fn finish(&mut self, id: u64) {
        let Some(event) = self.events.remove(&id) else {
            return;
        };
        if let Some(bytes) = self.lanes.get_mut(&event.lane) {
            *bytes = bytes.saturating_sub(event.bytes);
            if *bytes == 0 {
                self.lanes.remove(&event.lane);
            }
        }
        let Some(request) = event.request else {
            return;
        };
        if let Some((_, left)) = self.requests.get_mut(&request) {
            *left -= 1;
            if *left == 0 {
                if let Some((waiter, _)) = self.requests.remove(&request) {
                    waiter.receipt.settle(ReceiptState::Indexed);
                }
            }
        }
    }
}
