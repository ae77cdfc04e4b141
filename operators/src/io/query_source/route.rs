//! Standing events from the queries topic, routed to the worker that owns their subscription.
//!
//! A subscription made on the queries topic is owned by one worker of the cluster, chosen by a hash
//! of its id, whichever worker's consumer read the event: after a restart or a rebalance that moved
//! the topic's partitions, an event read again (its offset was not stored) or a later event of the
//! same id (its end) reaches the same worker, whose process holds the subscription, publishes its
//! versions and keeps it on disk. With one process every worker hands events to the same registry,
//! so the route changes nothing there.
//!
//! The reader puts each standing event, at the time of the batch that read it, on this worker's
//! route; the route's source sends it on at that time to the owner, which hands it to its process's
//! [`StandingIntake`]. The route's output joins the probe of published contexts, so the event's
//! offset is stored (as a query's is) only once its owner took it.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::{source, Operator};
use timely::dataflow::operators::Probe;
use timely::dataflow::{ProbeHandle, Scope};
use timely::scheduling::Activator;

use super::StandingIntake;
use crate::ingest::dlq::Origin;

/// A standing event on its way to the worker owning its subscription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Routed {
    /// The hash of the subscription id that picks the owner.
    pub owner: u64,
    /// The event's key.
    pub key: Option<Vec<u8>>,
    /// The event's value.
    pub payload: Vec<u8>,
    /// Where it was read.
    pub origin: Origin,
}

/// One worker's route: what its reader read, waiting for the route's source.
#[derive(Default)]
pub struct StandingRoute {
    /// Events with the time of the batch that read them.
    queue: RefCell<Vec<(u64, Routed)>>,
    /// The reader's capability time: no later event comes earlier.
    floor: Cell<u64>,
    /// The reader stopped: the route lets its time go.
    closed: Cell<bool>,
    activator: RefCell<Option<Activator>>,
}

impl StandingRoute {
    /// Takes an event read in the batch of `time`.
    pub fn push(&self, time: u64, key: Option<&[u8]>, payload: &[u8], origin: Origin) {
        self.queue.borrow_mut().push((
            time,
            Routed {
                owner: owner(payload),
                key: key.map(<[u8]>::to_vec),
                payload: payload.to_vec(),
                origin,
            },
        ));
        self.wake();
    }

    /// The reader's capability moved to `time` (or, `None`, it let go of it).
    pub fn advance(&self, time: Option<u64>) {
        match time {
            Some(time) => self.floor.set(time),
            None => self.closed.set(true),
        }
        self.wake();
    }

    fn wake(&self) {
        if let Some(activator) = self.activator.borrow().as_ref() {
            activator.activate();
        }
    }
}

/// The hash of a standing event's subscription id (`standing.subscription_id`, else `query_id`; an
/// event without either hashes its bytes: the owner refuses it as anyone would).
pub fn owner(payload: &[u8]) -> u64 {
    #[derive(Deserialize)]
    struct Ids {
        #[serde(default)]
        query_id: Option<String>,
        #[serde(default)]
        standing: Option<StandingIds>,
    }
    #[derive(Deserialize)]
    struct StandingIds {
        #[serde(default)]
        subscription_id: Option<String>,
    }
    let id = serde_json::from_slice::<Ids>(payload).ok().and_then(|ids| {
        ids.standing
            .and_then(|standing| standing.subscription_id)
            .or(ids.query_id)
    });
    let hash = match id {
        Some(id) => blake3::hash(id.as_bytes()),
        None => blake3::hash(payload),
    };
    u64::from_le_bytes(hash.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// Wires this worker's route: a source sending what the reader read to the owners, each owner
/// handing it to `intake`; the route joins `published` (the probe of published contexts).
pub fn route<'scope>(
    scope: Scope<'scope, u64>,
    intake: Arc<dyn StandingIntake>,
    published: &ProbeHandle<u64>,
) -> Rc<StandingRoute> {
    let route = Rc::new(StandingRoute::default());
    let reader = route.clone();
    let events = source::<_, CapacityContainerBuilder<Vec<Routed>>, _, _>(
        scope,
        "StandingRoute",
        move |capability, info| {
            *reader.activator.borrow_mut() = Some(scope.activator_for(info.address));
            let mut capability = Some(capability);
            move |output| {
                let Some(held) = capability.as_mut() else {
                    return;
                };
                let mut queue = reader.queue.borrow_mut();
                for (time, event) in queue.drain(..) {
                    let at = held.delayed(&time.max(*held.time()));
                    output.session(&at).give(event);
                }
                drop(queue);
                if reader.closed.get() {
                    capability = None;
                } else if reader.floor.get() > *held.time() {
                    held.downgrade(&reader.floor.get());
                }
            }
        },
    );
    events
        .unary::<CapacityContainerBuilder<Vec<()>>, _, _, _>(
            Exchange::new(|event: &Routed| event.owner),
            "StandingIntake",
            move |_, _| {
                move |input, _output| {
                    input.for_each(|_, data| {
                        for event in data.drain(..) {
                            intake.take(event.key.as_deref(), &event.payload, event.origin);
                        }
                    });
                }
            },
        )
        .probe_with(published);
    route
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner follows the subscription id (the client's, else the query id), not the rest of the
    /// event.
    #[test]
    fn the_owner_follows_the_subscription_id() {
        let a = owner(br#"{"query_id":"q1","text":"a","standing":{"subscription_id":"s-1"}}"#);
        let b = owner(
            br#"{"query_id":"q2","text":"b","standing":{"subscription_id":"s-1","end":true}}"#,
        );
        assert_eq!(a, b);
        let by_query = owner(br#"{"query_id":"s-1","text":"c","standing":{}}"#);
        assert_eq!(a, by_query);
        assert_ne!(
            a,
            owner(br#"{"query_id":"q1","standing":{"subscription_id":"s-2"}}"#)
        );
        // Not JSON: its bytes pick the owner (it is refused there).
        assert_eq!(owner(b"{"), owner(b"{"));
    }
}
