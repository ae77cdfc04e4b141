//! Neighbours: NeighbourRequests sends a bounded query's top candidate to the worker owning its
//! shard (in this process or another of the cluster), FetchNeighbours reads its neighbours there, and
//! Neighbours joins them back on the origin worker. A top candidate that is its document's only chunk
//! ([`crate::model::Chunk::is_whole_document`]) is not sent: its query goes on at once.

use std::collections::HashMap;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::job::{QueryServices, Working};
use crate::stage::flat_map_stage;
use crate::store::VectorStore;
use crate::wire::Wire;
use ragstream_core::query::Mode;

/// Extension trait: the `Neighbours` operator.
///
/// # Examples
///
/// The top candidate is the first of a document's three chunks; the chunks around it (itself as the
/// index holds it included) are read from the shard that holds them (one worker here, its embedded
/// index) and joined to the query:
///
/// ```
/// use std::sync::Arc;
/// use ragstream_core::testing::{sample_point, DIMENSION};
/// use ragstream_operators::query::example::{gathered, hit, job, services};
/// use ragstream_operators::query::fuse::Fuse;
/// use ragstream_operators::query::neighbours::Neighbours;
/// use ragstream_operators::store::edge::EdgeStore;
/// use ragstream_operators::store::VectorStore;
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// let parts = ["Tide pools hold sea water.", "Anemones live in them.", "Crabs hide under rocks."];
/// let dir = tempfile::tempdir().expect("a directory");
/// let shard = EdgeStore::open(dir.path(), DIMENSION).expect("an index");
/// let points: Vec<_> = (0..parts.len())
///     .map(|i| {
///         let mut point = sample_point("t", "tides", 1, parts[i], &[]);
///         point.chunk.order_index = i as u32;
///         point.chunk.last = i + 1 == parts.len();
///         point.id = point.chunk.point_id(&point.key);
///         point
///     })
///     .collect();
/// shard.upsert(&points).expect("written");
/// shard.flush().expect("flushed");
/// let read = timely::example(move |scope| {
///     let mut services = services();
///     services.shards = Arc::new(vec![Arc::new(shard) as Arc<dyn VectorStore>]);
///     let query = job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools"}"#);
///     vec![gathered(query, vec![hit("tides", parts[0], 0.9, &[1.0, 0.0])], Vec::new())]
///         .to_stream(scope)
///         .fuse()
///         .neighbours(services)
///         .map(|working| {
///             let order = |n: &ragstream_operators::store::StoredChunk| n.chunk.order_index;
///             let mut read: Vec<u32> = working.neighbours.iter().map(order).collect();
///             read.sort_unstable();
///             read
///         })
///         .capture()
/// });
/// assert_eq!(read.extract()[0].1, [vec![0, 1, 2]]);
/// ```
pub trait Neighbours<'scope> {
    /// Fetches the neighbours of a bounded query's top candidate on the worker owning its shard (in
    /// this process or another of the cluster) and joins them back on the origin worker.
    fn neighbours(self, services: QueryServices) -> StreamVec<'scope, u64, Working>;
}

impl<'scope> Neighbours<'scope> for StreamVec<'scope, u64, Working> {
    fn neighbours(self, services: QueryServices) -> StreamVec<'scope, u64, Working> {
        type Request = Wire<((usize, u64), crate::store::StoredChunk)>;
        type Answer = Wire<((usize, u64), Vec<crate::store::StoredChunk>)>;
        // Only the queries that want them ask for neighbours (`wants_neighbours`).
        let route = services.clone();
        let requests = flat_map_stage(
            self.clone(),
            "NeighbourRequests",
            move |working: Working| -> Option<Request> {
                wants_neighbours(&working).then(|| {
                    let top = working.candidates[0].stored.clone();
                    Wire(((working.job.origin, working.job.id), top))
                })
            },
        );
        let fetch = services.clone();
        let worker_of =
            move |key: &crate::model::DocKey, origin: usize| route.owner_of(key, origin);
        let answers = requests.unary::<CapacityContainerBuilder<Vec<Answer>>, _, _, _>(
            Exchange::new(move |Wire(((origin, _), top)): &Request| {
                worker_of(&top.key, *origin) as u64
            }),
            "FetchNeighbours",
            move |_, _| {
                move |input, output| {
                    input.for_each(|cap, data| {
                        let mut session = output.session(&cap);
                        for Wire((id, top)) in data.drain(..) {
                            let owner = fetch.owner_of(&top.key, id.0);
                            let neighbours = match fetch.local_shard(owner) {
                                Some(shard) => neighbours_of(shard.as_ref(), &top),
                                None => Vec::new(),
                            };
                            session.give(Wire((id, neighbours)));
                        }
                    });
                }
            },
        );
        self.binary::<_, CapacityContainerBuilder<Vec<Working>>, _, _, _, _>(
            answers,
            Pipeline,
            Exchange::new(|Wire(((origin, _), _)): &Answer| *origin as u64),
            "Neighbours",
            move |_, _| {
                let mut waiting: HashMap<(usize, u64), (Capability<u64>, Working)> = HashMap::new();
                let mut arrived: HashMap<(usize, u64), Vec<crate::store::StoredChunk>> =
                    HashMap::new();
                move |working_input, answer_input, output| {
                    working_input.for_each(|cap, data| {
                        for mut working in data.drain(..) {
                            if !wants_neighbours(&working) {
                                output.session(&cap).give(working);
                                continue;
                            }
                            let id = (working.job.origin, working.job.id);
                            match arrived.remove(&id) {
                                Some(neighbours) => {
                                    working.neighbours = neighbours;
                                    output.session(&cap).give(working);
                                }
                                None => {
                                    let retained = cap.retain_least(0).expect("time of the batch");
                                    waiting.insert(id, (retained, working));
                                }
                            }
                        }
                    });
                    answer_input.for_each(|_, data| {
                        for Wire((id, neighbours)) in data.drain(..) {
                            match waiting.remove(&id) {
                                Some((cap, mut working)) => {
                                    working.neighbours = neighbours;
                                    output.session(&cap).give(working);
                                }
                                None => {
                                    arrived.insert(id, neighbours);
                                }
                            }
                        }
                    });
                }
            },
        )
    }
}

/// How far from the top candidate's position a neighbour may be.
const NEIGHBOUR_RADIUS: u32 = 3;

/// Chunks of `top`'s document within [`NEIGHBOUR_RADIUS`] positions of it and under the same ACL,
/// from `shard` (the one holding it); none when the index cannot answer (the query goes on without).
/// Whether a query reads its top candidate's neighbours: a bounded query whose settings reunify
/// sections (off in the `fast` preset: no expanded top result), whose top candidate is not its
/// document's only chunk (that one has none to read).
fn wants_neighbours(working: &Working) -> bool {
    working.settings.pack.section_reunification
        && working.job.query.mode == Mode::Bounded
        && working
            .candidates
            .first()
            .is_some_and(|top| !top.stored.chunk.is_whole_document())
}

fn neighbours_of(
    shard: &dyn VectorStore,
    top: &crate::store::StoredChunk,
) -> Vec<crate::store::StoredChunk> {
    let mut found = shard
        .neighbours(&top.key, top.chunk.order_index, NEIGHBOUR_RADIUS)
        .unwrap_or_default();
    found.retain(|stored| stored.chunk.acl == top.chunk.acl);
    found
}
