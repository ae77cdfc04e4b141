//! Whether an evaluation is a new version, and what moved since the previous one.

use std::collections::HashMap;

use ragstream_core::query::{Context, ContextItem};

use super::records::Diff;

/// Whether two contexts give the same items (ids, order, text, tokens, lines, tier) and string.
pub(super) fn same(a: &Context, b: &Context) -> bool {
    a.context == b.context
        && a.tokens_used == b.tokens_used
        && a.items.len() == b.items.len()
        && a.items.iter().zip(&b.items).all(|(x, y)| same_item(x, y))
}

/// Whether two items are the same chunk with the same text, tokens, lines and tier.
fn same_item(a: &ContextItem, b: &ContextItem) -> bool {
    a.chunk_id == b.chunk_id
        && a.text == b.text
        && a.tokens == b.tokens
        && a.lines == b.lines
        && a.tier == b.tier
}

/// A context's items by chunk id.
fn by_id(context: &Context) -> HashMap<&str, &ContextItem> {
    context
        .items
        .iter()
        .map(|item| (item.chunk_id.as_str(), item))
        .collect()
}

/// What moved from `before` (none: the first version) to `after`.
pub(super) fn diff(before: Option<&Context>, after: &Context) -> Diff {
    let Some(before) = before else {
        return Diff {
            added: after.items.iter().map(|i| i.chunk_id.clone()).collect(),
            ..Diff::default()
        };
    };
    let (old, new) = (by_id(before), by_id(after));
    let added = after
        .items
        .iter()
        .filter(|item| !old.contains_key(item.chunk_id.as_str()))
        .map(|item| item.chunk_id.clone())
        .collect();
    let removed = before
        .items
        .iter()
        .filter(|item| !new.contains_key(item.chunk_id.as_str()))
        .map(|item| item.chunk_id.clone())
        .collect();
    let changed = after
        .items
        .iter()
        .filter(|item| {
            old.get(item.chunk_id.as_str())
                .is_some_and(|was| !same_item(was, item))
        })
        .map(|item| item.chunk_id.clone())
        .collect();
    let kept_before: Vec<&str> = before
        .items
        .iter()
        .map(|item| item.chunk_id.as_str())
        .filter(|id| new.contains_key(id))
        .collect();
    let kept_after: Vec<&str> = after
        .items
        .iter()
        .map(|item| item.chunk_id.as_str())
        .filter(|id| old.contains_key(id))
        .collect();
    Diff {
        added,
        removed,
        changed,
        reordered: kept_before != kept_after,
    }
}
