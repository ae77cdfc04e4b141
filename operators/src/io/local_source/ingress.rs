//! Documents posted to the job's HTTP API in local mode: queued per tenant, taken by deficit round
//! robin over their bytes, each request's [`Receipt`] settled once its documents are indexed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::ingest::dlq::DlqRecord;
use crate::ingest::written::Written;
use crate::model::DocOp;

/// Documents posted to the job's HTTP API in local mode, waiting for the local source, in a lane per
/// tenant.
#[derive(Debug)]
pub struct DocumentIngress {
    lanes: Mutex<Lanes>,
    closed: AtomicBool,
    written: Arc<Written>,
    fair: bool,
}

impl Default for DocumentIngress {
    fn default() -> Self {
        Self::new(true)
    }
}

/// One request's documents, its bytes, and where to tell it they were indexed.
pub(super) struct Posted {
    pub(super) documents: Vec<Result<DocOp, DlqRecord>>,
    pub(super) bytes: usize,
    pub(super) waiter: Waiter,
}

/// The queued requests by lane, and whose turn it is (deficit round robin over bytes).
#[derive(Default)]
struct Lanes {
    queued: BTreeMap<Arc<str>, VecDeque<Posted>>,
    turn: VecDeque<Arc<str>>,
    credit: HashMap<Arc<str>, usize>,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes")
            .field("lanes", &self.queued.len())
            .finish()
    }
}

/// Credit a lane gains per turn.
const QUANTUM_BYTES: usize = 256 * 1024;

/// Where a posted request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiptState {
    /// Waiting for its turn, or being chunked, embedded and written.
    Queued,
    /// Every document finished: written by the index, or dead-lettered.
    Indexed,
    /// The job stopped before it was indexed (it is not: post it again after the restart).
    Stopped,
}

/// A posted request's state, shared by the source (which moves it) and whoever waits for it.
#[derive(Debug)]
pub struct Receipt {
    state: Mutex<ReceiptState>,
    moved: Condvar,
}

impl Receipt {
    fn new() -> Self {
        Self {
            state: Mutex::new(ReceiptState::Queued),
            moved: Condvar::new(),
        }
    }

    /// The request's state now.
    pub fn state(&self) -> ReceiptState {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `timeout` for the request to leave [`ReceiptState::Queued`]; its state then.
    pub fn wait(&self, timeout: Duration) -> ReceiptState {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (state, _) = self
            .moved
            .wait_timeout_while(state, timeout, |s| *s == ReceiptState::Queued)
            .unwrap_or_else(|p| p.into_inner());
        *state
    }

    pub(super) fn settle(&self, to: ReceiptState) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *state == ReceiptState::Queued {
            *state = to;
        }
        self.moved.notify_all();
    }
}

/// A posted request's receipt, and what it holds until its documents are indexed (the HTTP server's
/// slot among the batches being written: a request whose caller stopped waiting still counts). A
/// waiter dropped before its request was indexed tells the receipt the job stopped.
pub(super) struct Waiter {
    pub(super) receipt: Arc<Receipt>,
    _hold: Option<Box<dyn std::any::Any + Send>>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.receipt.settle(ReceiptState::Stopped);
    }
}

impl DocumentIngress {
    /// An ingress with a lane per tenant (`fair`), or one lane for all, first in first out.
    pub fn new(fair: bool) -> Self {
        Self {
            lanes: Mutex::default(),
            closed: AtomicBool::new(false),
            written: Arc::default(),
            fair,
        }
    }

    /// Whether requests queue per tenant.
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// Queues one request's documents in the lane of its first document's tenant, keeping `hold`
    /// until they are indexed (or the job stops), whether or not anyone still waits for the receipt.
    pub fn submit(
        &self,
        documents: Vec<Result<DocOp, DlqRecord>>,
        hold: Option<Box<dyn std::any::Any + Send>>,
    ) -> Arc<Receipt> {
        let receipt = Arc::new(Receipt::new());
        let lane: Arc<str> = match self.fair {
            true => documents
                .iter()
                .find_map(|d| d.as_ref().ok())
                .map_or("", |op| op.key().tenant.as_str())
                .into(),
            false => "".into(),
        };
        let bytes = documents.iter().map(event_bytes).sum();
        let posted = Posted {
            documents,
            bytes,
            waiter: Waiter {
                receipt: receipt.clone(),
                _hold: hold,
            },
        };
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if !self.closed.load(Ordering::SeqCst) {
            lanes.queued.entry(lane).or_default().push_back(posted);
        }
        receipt
    }

    /// Where the index writers record the documents they finished (for this source to take).
    pub fn written(&self) -> Arc<Written> {
        self.written.clone()
    }

    /// Stops taking documents: queued requests are told the job stopped.
    pub fn close(&self) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        self.closed.store(true, Ordering::SeqCst);
        lanes.queued.clear();
    }

    /// The next request by deficit round robin over the lanes that `may` go, with its lane.
    pub(super) fn take(&self, may: impl Fn(&str) -> bool) -> Option<(Arc<str>, Posted)> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let Lanes {
            queued,
            turn,
            credit,
        } = &mut *lanes;
        queued.retain(|_, requests| !requests.is_empty());
        for lane in queued.keys() {
            if !credit.contains_key(lane) {
                credit.insert(lane.clone(), 0);
                turn.push_back(lane.clone());
            }
        }
        turn.retain(|lane| {
            let keep = queued.contains_key(lane);
            if !keep {
                credit.remove(lane);
            }
            keep
        });
        let eligible = turn.iter().filter(|lane| may(lane)).count();
        if eligible == 0 {
            return None;
        }
        loop {
            let lane = turn.front()?.clone();
            if !may(&lane) {
                turn.rotate_left(1);
                continue;
            }
            let requests = queued.get_mut(&lane)?;
            let cost = requests.front()?.bytes;
            let have = credit.entry(lane.clone()).or_default();
            if *have < cost {
                *have += QUANTUM_BYTES.max(cost / 64);
                turn.rotate_left(1);
                continue;
            }
            *have -= cost;
            let posted = requests.pop_front()?;
            return Some((lane, posted));
        }
    }
}

/// What an event holds in flight: its text's bytes (a delete or a refusal: 1).
pub(super) fn event_bytes(event: &Result<DocOp, DlqRecord>) -> usize {
    match event {
        Ok(DocOp::Upsert(doc)) => doc.text.len().max(1),
        _ => 1,
    }
}
