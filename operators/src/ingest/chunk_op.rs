//! The timely wrapper of the chunker: upserts of documents → upserts of chunk sets.

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use super::chunk::Chunker;
use crate::model::{ChunkSet, DocKey, Document};

/// Extension trait: chunk upserted documents.
pub trait ChunkDocuments<'scope> {
    /// Maps `(key, Some(doc), t)` to `(key, Some(chunks), t)`; deletes pass through.
    fn chunk_documents(
        self,
        chunker: Chunker,
    ) -> StreamVec<'scope, u64, (DocKey, Option<ChunkSet>, u64)>;
}

impl<'scope> ChunkDocuments<'scope> for StreamVec<'scope, u64, (DocKey, Option<Document>, u64)> {
    fn chunk_documents(
        self,
        chunker: Chunker,
    ) -> StreamVec<'scope, u64, (DocKey, Option<ChunkSet>, u64)> {
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "Chunk",
            move |_cap, _info| {
                move |input, output| {
                    input.for_each(|cap, data| {
                        let chunked = data.drain(..).map(|(key, document, time)| {
                            let set = document.map(|doc| ChunkSet {
                                version: doc.version,
                                chunks: chunker.chunk(&doc),
                            });
                            (key, set, time)
                        });
                        output.session(&cap).give_iterator(chunked);
                    });
                }
            },
        )
    }
}
