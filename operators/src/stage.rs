//! Named stages: timely calls every `map` and `flat_map` operator `FlatMap`, so the worker's
//! activation profile ([`crate::activations`]) could not tell a shard search from a field rewrite.

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

/// Replaces each record of `stream` by the records `logic` makes of it, in an operator called `name`.
pub fn flat_map_stage<'scope, A: 'static, I: IntoIterator<Item: 'static>>(
    stream: StreamVec<'scope, u64, A>,
    name: &'static str,
    mut logic: impl FnMut(A) -> I + 'static,
) -> StreamVec<'scope, u64, I::Item> {
    stream.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(Pipeline, name, move |_, _| {
        move |input, output| {
            input.for_each(|cap, data| {
                output
                    .session(&cap)
                    .give_iterator(data.drain(..).flat_map(&mut logic));
            });
        }
    })
}

/// Applies `logic` to each record of `stream` in an operator called `name`.
pub fn map_stage<'scope, A: 'static, B: 'static>(
    stream: StreamVec<'scope, u64, A>,
    name: &'static str,
    mut logic: impl FnMut(A) -> B + 'static,
) -> StreamVec<'scope, u64, B> {
    flat_map_stage(stream, name, move |a| std::iter::once(logic(a)))
}
