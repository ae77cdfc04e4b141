//! Prose and markdown: paragraphs, sentences and (markdown) ATX headings and fenced code blocks.

use super::{pack_units, split_oversized, Piece, Unit};
use crate::tokens::TokenCounter;

/// The level of an ATX heading line (`# Title` → 1), or `None`.
pub(super) fn heading_level(line: &str) -> Option<usize> {
    let trimmed = line.trim_start_matches(' ');
    if line.len() - trimmed.len() > 3 {
        return None;
    }
    let level = trimmed.bytes().take_while(|&b| b == b'#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &trimmed[level..];
    (rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')).then_some(level)
}

/// Longest heading title kept in a section path, in bytes (a longer one is cut at a char boundary):
/// every chunk under the heading carries its path.
pub(super) const MAX_HEADING_BYTES: usize = 256;

fn heading_title(line: &str) -> String {
    let title = line
        .trim()
        .trim_start_matches('#')
        .trim()
        .trim_end_matches('#')
        .trim();
    let end = title.floor_char_boundary(MAX_HEADING_BYTES);
    title[..end].to_string()
}

fn is_fence(line: &str) -> bool {
    let trimmed = line.trim_start();
    trimmed.starts_with("```") || trimmed.starts_with("~~~")
}

#[derive(Debug)]
enum Block {
    Heading {
        level: usize,
        title: String,
        start: usize,
        end: usize,
    },
    Fence {
        start: usize,
        end: usize,
    },
    Paragraph {
        start: usize,
        end: usize,
    },
}

/// Lines of `text` with their byte ranges (without the newline).
fn lines_with_offsets(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut offset = 0;
    text.split_inclusive('\n').map(move |raw| {
        let start = offset;
        offset += raw.len();
        (start, raw.trim_end_matches(['\n', '\r']))
    })
}

fn blocks(text: &str, markdown: bool) -> Vec<Block> {
    let mut out = Vec::new();
    let mut paragraph: Option<(usize, usize)> = None;
    let mut fence: Option<usize> = None;
    let flush = |paragraph: &mut Option<(usize, usize)>, out: &mut Vec<Block>| {
        if let Some((start, end)) = paragraph.take() {
            out.push(Block::Paragraph { start, end });
        }
    };
    for (start, line) in lines_with_offsets(text) {
        let end = start + line.len();
        if markdown {
            if let Some(fence_start) = fence {
                if is_fence(line) {
                    out.push(Block::Fence {
                        start: fence_start,
                        end,
                    });
                    fence = None;
                }
                continue;
            }
            if is_fence(line) {
                flush(&mut paragraph, &mut out);
                fence = Some(start);
                continue;
            }
            if let Some(level) = heading_level(line) {
                flush(&mut paragraph, &mut out);
                out.push(Block::Heading {
                    level,
                    title: heading_title(line),
                    start,
                    end,
                });
                continue;
            }
        }
        if line.trim().is_empty() {
            flush(&mut paragraph, &mut out);
            continue;
        }
        let content_start = start + (line.len() - line.trim_start().len());
        let content_end = start + line.trim_end().len();
        paragraph = Some(match paragraph {
            Some((para_start, _)) => (para_start, content_end),
            None => (content_start, content_end),
        });
    }
    if let Some(fence_start) = fence {
        // Unclosed fence: it runs to the end of the document.
        out.push(Block::Fence {
            start: fence_start,
            end: text.trim_end().len().max(fence_start),
        });
    }
    flush(&mut paragraph, &mut out);
    out
}

/// Sentence ranges of `[start, end)`, trimmed of surrounding whitespace.
pub(super) fn sentences(text: &str, start: usize, end: usize) -> Vec<(usize, usize)> {
    let slice = &text[start..end];
    let mut out = Vec::new();
    let mut sentence_start: Option<usize> = None;
    let mut chars = slice.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if sentence_start.is_none() {
            if c.is_whitespace() {
                continue;
            }
            sentence_start = Some(i);
        }
        let mut boundary_end = None;
        if matches!(c, '.' | '!' | '?' | '。' | '！' | '？') {
            // Closing quotes and brackets belong to the sentence.
            let mut last = i + c.len_utf8();
            while let Some(&(j, next)) = chars.peek() {
                if matches!(next, '"' | '\'' | ')' | ']' | '”' | '’' | '.' | '!' | '?') {
                    last = j + next.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            let rest = &slice[last..];
            let after_space = rest.trim_start();
            let has_space = after_space.len() < rest.len();
            let next_starts_sentence = after_space
                .chars()
                .next()
                .map(|n| {
                    n.is_uppercase()
                        || n.is_ascii_digit()
                        || matches!(n, '"' | '\'' | '“' | '(' | '[' | '-' | '*')
                })
                .unwrap_or(true);
            if (has_space && next_starts_sentence)
                || after_space.is_empty()
                || matches!(c, '。' | '！' | '？')
            {
                boundary_end = Some(last);
            }
        } else if c == '\n' {
            // A list item on the next line starts a new unit.
            let rest = slice[i + 1..].trim_start_matches([' ', '\t']);
            let bullet =
                rest.starts_with("- ") || rest.starts_with("* ") || rest.starts_with("+ ") || {
                    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
                    digits > 0 && rest[digits..].starts_with(". ")
                };
            if bullet {
                boundary_end = Some(i);
            }
        }
        if let Some(stop) = boundary_end {
            let begin = sentence_start.take().expect("inside a sentence");
            let trimmed = slice[begin..stop].trim_end();
            if !trimmed.is_empty() {
                out.push((start + begin, start + begin + trimmed.len()));
            }
        }
    }
    if let Some(begin) = sentence_start {
        let trimmed = slice[begin..].trim_end();
        if !trimmed.is_empty() {
            out.push((start + begin, start + begin + trimmed.len()));
        }
    }
    out
}

pub(super) fn chunk_text(
    text: &str,
    markdown: bool,
    counter: TokenCounter,
    budget: usize,
    overlap: usize,
) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut path: Vec<(usize, String)> = Vec::new();
    let mut units: Vec<Unit> = Vec::new();
    let flush = |units: &mut Vec<Unit>, path: &[(usize, String)], pieces: &mut Vec<Piece>| {
        if units.is_empty() {
            return;
        }
        let section_path: Vec<String> = path.iter().map(|(_, title)| title.clone()).collect();
        let header = section_path.last().cloned().unwrap_or_default();
        for (start, end) in pack_units(text, units, counter, budget, overlap) {
            pieces.push(Piece {
                start,
                end,
                section_path: section_path.clone(),
                header: header.clone(),
                rendered: None,
                page: None,
            });
        }
        units.clear();
    };
    let push_range =
        |units: &mut Vec<Unit>, start: usize, end: usize, boundary: bool, sticky: bool| {
            let tokens = counter.count(&text[start..end]);
            if tokens <= budget {
                units.push(Unit {
                    start,
                    end,
                    tokens,
                    boundary,
                    sticky,
                });
                return;
            }
            for (index, (s, e)) in split_oversized(text, start, end, counter, budget)
                .into_iter()
                .enumerate()
            {
                let tokens = counter.count(&text[s..e]);
                units.push(Unit {
                    start: s,
                    end: e,
                    tokens,
                    boundary: boundary && index == 0,
                    sticky: false,
                });
            }
        };
    for block in blocks(text, markdown) {
        match block {
            Block::Heading {
                level,
                title,
                start,
                end,
            } => {
                flush(&mut units, &path, &mut pieces);
                while path.last().is_some_and(|(l, _)| *l >= level) {
                    path.pop();
                }
                path.push((level, title));
                push_range(&mut units, start, end, true, true);
            }
            Block::Fence { start, end } => {
                if counter.count(&text[start..end]) <= budget {
                    push_range(&mut units, start, end, true, false);
                } else {
                    let mut first = true;
                    for (line_start, line) in lines_with_offsets(&text[start..end]) {
                        if line.trim().is_empty() {
                            continue;
                        }
                        let s = start + line_start;
                        push_range(&mut units, s, s + line.len(), first, false);
                        first = false;
                    }
                }
            }
            Block::Paragraph { start, end } => {
                for (index, (s, e)) in sentences(text, start, end).into_iter().enumerate() {
                    push_range(&mut units, s, e, index == 0, false);
                }
            }
        }
    }
    flush(&mut units, &path, &mut pieces);
    pieces
}
