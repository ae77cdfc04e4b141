//! Document batches posted in local mode: each tenant's room among the batches being written, and
//! the receipts `GET /v1/batches/{id}` answers from.
//!
//! A batch holds its room until the index holds it (or the job stops), whether or not its caller
//! still waits: at most [`PER_TENANT`] batches of one tenant and [`TOTAL`] in all, so a tenant that
//! posts large documents faster than they are embedded is answered `busy` while the others' batches
//! still go in. Receipts are kept for the last [`KEPT`] batches.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use ragstream_operators::io::local_source::{Receipt, ReceiptState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Batches of one tenant being written at once.
pub const PER_TENANT: usize = 4;
/// Batches being written at once, all tenants together.
pub const TOTAL: usize = 64;
/// Receipts kept (the oldest are forgotten first).
const KEPT: usize = 4096;

/// Where a posted batch stands (`GET /v1/batches/{id}`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct BatchStatus {
    /// The batch's id.
    pub id: u64,
    /// `queued` (waiting for its turn, or being chunked, embedded and written), `indexed` (every
    /// document written by the index, or dead-lettered) or `stopped` (the job stopped first: post
    /// it again).
    pub state: String,
    /// Documents in the batch.
    pub accepted: usize,
}

struct Entry {
    tenants: BTreeSet<String>,
    accepted: usize,
    receipt: Arc<Receipt>,
}

/// The batches being written and the receipts kept.
#[derive(Default)]
pub(super) struct Batches {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    writing: HashMap<String, usize>,
    total: usize,
    next: u64,
    receipts: HashMap<u64, Entry>,
    order: VecDeque<u64>,
}

/// A batch's room among those being written; freed when dropped.
pub(super) struct Room {
    batches: Arc<Batches>,
    tenant: String,
}

impl Drop for Room {
    fn drop(&mut self) {
        let mut state = self.batches.lock();
        state.total = state.total.saturating_sub(1);
        if let Some(count) = state.writing.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                state.writing.remove(&self.tenant);
            }
        }
    }
}

impl Batches {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Room for a batch of `tenant`'s, or why there is none.
    pub(super) fn room(self: &Arc<Self>, tenant: &str) -> Result<Room, String> {
        let mut state = self.lock();
        let held = state.writing.get(tenant).copied().unwrap_or(0);
        if held >= PER_TENANT {
            return Err(format!(
                "tenant {tenant:?} has {PER_TENANT} batches being written already; retry once one is \
                 indexed (GET /v1/batches/{{id}})"
            ));
        }
        if state.total >= TOTAL {
            return Err(format!(
                "{TOTAL} batches are being written already; retry shortly"
            ));
        }
        state.total += 1;
        *state.writing.entry(tenant.to_string()).or_default() += 1;
        Ok(Room {
            batches: self.clone(),
            tenant: tenant.to_string(),
        })
    }

    /// Keeps `receipt` of a batch of `accepted` documents of `tenants`; its id.
    pub(super) fn keep(
        &self,
        tenants: BTreeSet<String>,
        accepted: usize,
        receipt: Arc<Receipt>,
    ) -> u64 {
        let mut state = self.lock();
        state.next += 1;
        let id = state.next;
        state.receipts.insert(
            id,
            Entry {
                tenants,
                accepted,
                receipt,
            },
        );
        state.order.push_back(id);
        while state.order.len() > KEPT {
            if let Some(old) = state.order.pop_front() {
                state.receipts.remove(&old);
            }
        }
        id
    }

    /// Batch `id`'s status, where it is kept and every tenant of it is one `may_read` allows.
    pub(super) fn status(&self, id: u64, may_read: impl Fn(&str) -> bool) -> Option<BatchStatus> {
        let state = self.lock();
        let entry = state.receipts.get(&id)?;
        if !entry.tenants.iter().all(|t| may_read(t)) {
            return None;
        }
        Some(BatchStatus {
            id,
            state: state_name(entry.receipt.state()).to_string(),
            accepted: entry.accepted,
        })
    }
}

/// The name of a receipt's state.
pub(super) fn state_name(state: ReceiptState) -> &'static str {
    match state {
        ReceiptState::Queued => "queued",
        ReceiptState::Indexed => "indexed",
        ReceiptState::Stopped => "stopped",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_holds_at_most_its_share_of_the_batches_being_written() {
        let batches = Arc::new(Batches::default());
        let mut held: Vec<Room> = (0..PER_TENANT)
            .map(|_| batches.room("a").expect("room"))
            .collect();
        let refused = batches.room("a").map(|_| ()).unwrap_err();
        assert!(refused.contains("tenant \"a\""), "{refused}");
        // Another tenant still gets in; a batch of the first freed makes room for it again.
        let other = batches.room("b").expect("another tenant's batch");
        held.pop();
        held.push(batches.room("a").expect("room once a batch was indexed"));
        drop(other);
        assert_eq!(batches.lock().writing.get("b"), None);
        // Every tenant together: at most TOTAL, the rooms still held counted.
        let many: Vec<Room> = (0..TOTAL)
            .map_while(|i| batches.room(&format!("t{i}")).ok())
            .collect();
        assert_eq!(many.len() + PER_TENANT, TOTAL);
        assert!(batches
            .room("z")
            .map(|_| ())
            .unwrap_err()
            .contains("64 batches"));
        drop(many);
        drop(held);
        assert_eq!(batches.lock().total, 0);
    }
}
