//! Forms that keep chunks whole: the top result's expanded window (its chunk with the section
//! header and as many neighbours as fit) and a whole chunk, the only form of a `return_full` query.

use std::collections::BTreeMap;

use super::forms::{estimate, header, line_of, value, Form};
use super::{PackConfig, Tier};
use crate::store::StoredChunk;
use crate::tokens::TokenCounter;

/// The one form of a candidate when the query asks for whole chunks (`return_full`): the chunk's
/// `(from, to)` part not already in the context (all of it unless it overlaps an earlier item of
/// its document).
pub(super) fn whole_chunk(
    chunk: &crate::model::Chunk,
    (from, to): (usize, usize),
    counter: TokenCounter,
    config: &PackConfig,
) -> Form {
    let base = chunk.char_range.0;
    let lines = if (from, to) == (0, chunk.text.len()) {
        chunk.lines
    } else {
        (line_of(chunk, from), line_of(chunk, to))
    };
    let header = header(chunk, lines, config);
    Form {
        tier: Tier::Full,
        factor: value::WHOLE,
        estimate: counter.count(&header) + estimate(chunk.tokens, chunk.text.len(), to - from),
        header,
        text: chunk.text[from..to].to_string(),
        lines,
        range: (base + from as u32, base + to as u32),
    }
}

/// The top result's expanded form: its section path, its text and its document's neighbours on both
/// sides, grown one at a time while the estimate stays within `expanded_tokens` and the text within
/// `expansion_max_bytes` (0: no byte bound); `None` when the chunk alone is over either.
pub(super) fn expanded(
    top: &StoredChunk,
    neighbours: &[StoredChunk],
    counter: TokenCounter,
    config: &PackConfig,
) -> Option<Form> {
    let (max_tokens, max_bytes) = (config.expanded_tokens, config.expansion_max_bytes);
    let max_bytes = if max_bytes == 0 {
        usize::MAX
    } else {
        max_bytes
    };
    let chunk = &top.chunk;
    let section = if chunk.section_path.is_empty() {
        String::new()
    } else {
        format!("§ {}\n", chunk.section_path.join(" › "))
    };
    let mut estimate_tokens = counter.count(&section) + chunk.tokens as usize;
    if estimate_tokens > max_tokens || section.len() + chunk.text.len() > max_bytes {
        return None;
    }
    let mut by_order: BTreeMap<u32, &StoredChunk> = BTreeMap::new();
    for neighbour in neighbours {
        if neighbour.key == top.key && neighbour.id != top.id {
            by_order.insert(neighbour.chunk.order_index, neighbour);
        }
    }
    let (mut start, mut end) = chunk.char_range;
    let (mut first_line, mut last_line) = chunk.lines;
    let mut text = chunk.text.clone();
    let mut next = chunk.order_index + 1;
    let mut previous = chunk.order_index.checked_sub(1);
    let mut grow_next = true;
    let mut stuck = 0;
    while stuck < 2 {
        let order = if grow_next { Some(next) } else { previous };
        grow_next = !grow_next;
        let Some(neighbour) = order.and_then(|o| by_order.get(&o)) else {
            stuck += 1;
            continue;
        };
        let n = &neighbour.chunk;
        let (n0, n1) = n.char_range;
        let piece = if n.order_index > chunk.order_index {
            // Text after `end`.
            if n1 <= end {
                String::new()
            } else if n0 >= end {
                format!("\n{}", n.text)
            } else {
                let at = (end - n0) as usize;
                if !n.text.is_char_boundary(at) {
                    stuck += 1;
                    continue;
                }
                n.text[at..].to_string()
            }
        } else if n0 >= start {
            String::new()
        } else if n1 <= start {
            format!("{}\n", n.text)
        } else {
            let at = (start - n0) as usize;
            if !n.text.is_char_boundary(at) {
                stuck += 1;
                continue;
            }
            n.text[..at].to_string()
        };
        let cost = estimate(n.tokens, n.text.len(), piece.len());
        if estimate_tokens + cost > max_tokens
            || section.len() + text.len() + piece.len() > max_bytes
        {
            stuck += 1;
            continue;
        }
        stuck = 0;
        estimate_tokens += cost;
        if n.order_index > chunk.order_index {
            text.push_str(&piece);
            end = end.max(n1);
            last_line = last_line.max(n.lines.1);
            next += 1;
        } else {
            text.insert_str(0, &piece);
            start = start.min(n0);
            first_line = first_line.min(n.lines.0);
            previous = n.order_index.checked_sub(1);
        }
    }
    let lines = (first_line, last_line);
    let header = header(chunk, lines, config);
    Some(Form {
        tier: Tier::Expanded,
        factor: value::EXPANDED,
        estimate: estimate_tokens + counter.count(&header),
        header,
        text: format!("{section}{text}"),
        lines,
        range: (start, end),
    })
}
