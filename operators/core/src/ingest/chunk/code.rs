//! Code: top-level items (functions, classes, impls, types) as chunk boundaries.
//!
//! A line-based recogniser per language finds where top-level items start; doc comments, attributes and
//! decorators directly above an item belong to it. Consecutive small items are packed together up to the
//! budget; an item larger than the budget is split on blank lines, then on lines.

use super::{pack_units, split_oversized, Piece, Unit};
use crate::tokens::TokenCounter;

/// Longest item name kept in a code chunk's section path, in chars.
const MAX_ITEM_NAME_CHARS: usize = 128;

/// Languages with item recognisers; anything else uses the generic rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// Rust.
    Rust,
    /// Python.
    Python,
    /// JavaScript and TypeScript.
    JavaScript,
    /// Go.
    Go,
    /// Other C-like languages: a column-0 line after a blank line starts an item.
    Generic,
}

impl Language {
    /// The language of a file extension, if it is source code ragstream chunks as code.
    pub fn from_extension(extension: &str) -> Option<Self> {
        Some(match extension {
            "rs" => Self::Rust,
            "py" | "pyi" => Self::Python,
            "js" | "jsx" | "mjs" | "cjs" | "ts" | "tsx" | "mts" | "cts" => Self::JavaScript,
            "go" => Self::Go,
            "c" | "h" | "cc" | "cpp" | "hpp" | "java" | "kt" | "scala" | "cs" | "swift" | "rb"
            | "php" | "sh" | "sql" | "toml" | "yaml" | "yml" => Self::Generic,
            _ => return None,
        })
    }

    /// The language from the source's extension, else a guess from the content.
    pub fn detect(source: &str, text: &str) -> Self {
        let extension = source
            .rsplit_once('.')
            .map(|(_, ext)| ext.to_ascii_lowercase())
            .unwrap_or_default();
        if let Some(language) = Self::from_extension(&extension) {
            return language;
        }
        let has = |prefix: &str| text.lines().any(|line| line.starts_with(prefix));
        if has("fn ") || has("pub fn ") || has("impl ") || has("use ") {
            Self::Rust
        } else if has("def ") || has("class ") || has("import ") {
            Self::Python
        } else if has("func ") || has("package ") {
            Self::Go
        } else if has("function ") || has("export ") || has("const ") {
            Self::JavaScript
        } else {
            Self::Generic
        }
    }

    /// Whether a column-0 line starts a top-level item; returns the item's name.
    fn item_start(self, line: &str) -> Option<String> {
        let keywords: &[&str] = match self {
            Self::Rust => &[
                "pub(crate) ",
                "pub(super) ",
                "pub ",
                "async ",
                "unsafe ",
                "const ",
                "extern \"C\" ",
                "default ",
            ],
            Self::JavaScript => &[
                "export default ",
                "export ",
                "async ",
                "declare ",
                "abstract ",
            ],
            Self::Python => &["async "],
            Self::Go | Self::Generic => &[],
        };
        let mut rest = line;
        loop {
            let before = rest;
            for keyword in keywords {
                rest = rest.strip_prefix(keyword).unwrap_or(rest);
            }
            if rest == before {
                break;
            }
        }
        let items: &[&str] = match self {
            Self::Rust => &[
                "fn ",
                "struct ",
                "enum ",
                "trait ",
                "impl",
                "mod ",
                "type ",
                "static ",
                "macro_rules! ",
                "union ",
            ],
            Self::Python => &["def ", "class "],
            Self::JavaScript => &[
                "function ",
                "function* ",
                "class ",
                "interface ",
                "type ",
                "enum ",
                "const ",
                "let ",
                "var ",
                "namespace ",
            ],
            Self::Go => &["func ", "type ", "var ", "const "],
            Self::Generic => &[],
        };
        for item in items {
            if let Some(after) = rest.strip_prefix(item) {
                let name: String = after
                    .trim_start_matches(['<', ' ', '('])
                    .chars()
                    .take_while(|c| {
                        c.is_alphanumeric()
                            || matches!(c, '_' | '$' | ':' | '<' | '>' | ' ' | '*' | ')')
                    })
                    // An item's name labels every chunk of the item: bounded, as headings are.
                    .take(MAX_ITEM_NAME_CHARS)
                    .collect();
                let name = name
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .trim_end_matches(['(', '<', ':', ')'])
                    .to_string();
                // Rust `const`/`static` and JS `const` count only at column 0 (already guaranteed).
                return Some(format!(
                    "{}{}",
                    item.trim_end(),
                    if name.is_empty() {
                        String::new()
                    } else {
                        format!(" {name}")
                    }
                ));
            }
        }
        None
    }

    /// Lines that attach to the item below them (doc comments, attributes, decorators).
    fn is_prefix_line(self, line: &str) -> bool {
        let trimmed = line.trim_start();
        match self {
            Self::Rust => {
                trimmed.starts_with("///")
                    || trimmed.starts_with("#[")
                    || (trimmed.starts_with("//") && !trimmed.starts_with("//!"))
            }
            Self::Python => trimmed.starts_with('@') || trimmed.starts_with('#'),
            Self::JavaScript => {
                trimmed.starts_with("//")
                    || trimmed.starts_with("/*")
                    || trimmed.starts_with('*')
                    || trimmed.starts_with('@')
            }
            Self::Go => trimmed.starts_with("//"),
            Self::Generic => {
                trimmed.starts_with("//")
                    || trimmed.starts_with('#')
                    || trimmed.starts_with("/*")
                    || trimmed.starts_with('*')
            }
        }
    }
}

/// A line of the text: where it starts, and its content without the line ending.
struct Line<'a> {
    start: usize,
    text: &'a str,
}

/// Code chunks of `text`: its top-level items found, cut into units within `budget`, and packed.
pub(super) fn chunk_code(
    text: &str,
    language: Language,
    source: &str,
    counter: TokenCounter,
    budget: usize,
) -> Vec<Piece> {
    let lines = text_lines(text);
    let starts = item_starts(&lines, language);
    let items = item_ranges(&lines, &starts, language);
    let (units, unit_items) = item_units(text, &lines, &items, counter, budget);
    pack_items(text, &units, &unit_items, &items, source, counter, budget)
}

/// The lines of `text`, each with its byte offset.
fn text_lines(text: &str) -> Vec<Line<'_>> {
    let mut lines = Vec::new();
    let mut offset = 0;
    for raw in text.split_inclusive('\n') {
        lines.push(Line {
            start: offset,
            text: raw.trim_end_matches(['\n', '\r']),
        });
        offset += raw.len();
    }
    lines
}

/// What a code chunk's section path names: the text before the first item (imports, module docs),
/// or an item by its name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ItemName {
    /// Everything before the first item.
    Preamble,
    /// A top-level item (a function, a type, a block of a generic language), by its name.
    Named(String),
}

impl ItemName {
    /// The name in a chunk's section path (`preamble` for the preamble).
    fn as_str(&self) -> &str {
        match self {
            ItemName::Preamble => "preamble",
            ItemName::Named(name) => name,
        }
    }
}

/// A top-level item as a byte range trimmed of surrounding blank space.
#[derive(Debug, Clone)]
struct Item {
    start: usize,
    end: usize,
    name: ItemName,
    /// Its first line that is not a doc comment or attribute.
    signature: String,
}

/// Where the top-level items start (line index, name), their doc comments and attributes included;
/// a preamble first when the first item does not start the text.
fn item_starts(lines: &[Line<'_>], language: Language) -> Vec<(usize, ItemName)> {
    let mut starts: Vec<(usize, ItemName)> = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let column0 = !line.text.is_empty() && !line.text.starts_with([' ', '\t']);
        if !column0 {
            continue;
        }
        let name = match language {
            Language::Generic => {
                let previous_blank = index == 0 || lines[index - 1].text.trim().is_empty();
                let closing = line.text.starts_with(['}', ')', ']']);
                (previous_blank && !closing && !language.is_prefix_line(line.text))
                    .then(|| line.text.trim().chars().take(60).collect::<String>())
            }
            _ => language.item_start(line.text),
        };
        if let Some(name) = name {
            // Attach doc comments / attributes / decorators directly above.
            let mut first = index;
            while first > 0
                && !lines[first - 1].text.trim().is_empty()
                && language.is_prefix_line(lines[first - 1].text)
            {
                first -= 1;
            }
            if starts.last().is_none_or(|(last, _)| *last < first) {
                starts.push((first, ItemName::Named(name)));
            }
        }
    }
    if starts.first().is_none_or(|(first, _)| *first > 0) {
        starts.insert(0, (0, ItemName::Preamble));
    }
    starts
}

/// The items as byte ranges trimmed of surrounding blank space.
fn item_ranges(lines: &[Line<'_>], starts: &[(usize, ItemName)], language: Language) -> Vec<Item> {
    let mut items: Vec<Item> = Vec::new();
    for (position, (first_line, name)) in starts.iter().enumerate() {
        let end_line = starts
            .get(position + 1)
            .map(|(line, _)| *line)
            .unwrap_or(lines.len());
        let Some(content) = (*first_line..end_line).find(|&i| !lines[i].text.trim().is_empty())
        else {
            continue;
        };
        let Some(last) = (*first_line..end_line)
            .rev()
            .find(|&i| !lines[i].text.trim().is_empty())
        else {
            continue;
        };
        let start = lines[content].start
            + (lines[content].text.len() - lines[content].text.trim_start().len());
        let end = lines[last].start + lines[last].text.trim_end().len();
        let signature = (*first_line..end_line)
            .map(|i| lines[i].text)
            .find(|l| !l.trim().is_empty() && !language.is_prefix_line(l))
            .unwrap_or("")
            .trim()
            .to_string();
        items.push(Item {
            start,
            end,
            name: name.clone(),
            signature,
        });
    }
    items
}

/// The units to pack, and the item each belongs to: whole items where they fit the budget, else their
/// blank-line blocks (split on lines where a block is still over).
fn item_units(
    text: &str,
    lines: &[Line<'_>],
    items: &[Item],
    counter: TokenCounter,
    budget: usize,
) -> (Vec<Unit>, Vec<usize>) {
    // Units: whole items where they fit, else groups of lines split on blank lines.
    let mut units: Vec<Unit> = Vec::new();
    let mut unit_items: Vec<usize> = Vec::new(); // which item each unit belongs to
    for (item_index, Item { start, end, .. }) in items.iter().enumerate() {
        let tokens = counter.count(&text[*start..*end]);
        if tokens <= budget {
            units.push(Unit {
                start: *start,
                end: *end,
                tokens,
                boundary: true,
                sticky: false,
            });
            unit_items.push(item_index);
            continue;
        }
        let mut first = true;
        let mut block_start: Option<usize> = None;
        let mut block_end = *start;
        let item_lines = lines
            .iter()
            .filter(|l| l.start + l.text.len() > *start && l.start < *end);
        let push_block = |s: usize,
                          e: usize,
                          first: &mut bool,
                          units: &mut Vec<Unit>,
                          unit_items: &mut Vec<usize>| {
            let slice_tokens = counter.count(&text[s..e]);
            if slice_tokens <= budget {
                units.push(Unit {
                    start: s,
                    end: e,
                    tokens: slice_tokens,
                    boundary: *first,
                    sticky: false,
                });
                unit_items.push(item_index);
            } else {
                for (a, b) in split_lines(text, s, e, counter, budget) {
                    units.push(Unit {
                        start: a,
                        end: b,
                        tokens: counter.count(&text[a..b]),
                        boundary: *first,
                        sticky: false,
                    });
                    unit_items.push(item_index);
                    *first = false;
                }
            }
            *first = false;
        };
        for line in item_lines {
            if line.text.trim().is_empty() {
                if let Some(s) = block_start.take() {
                    push_block(s, block_end, &mut first, &mut units, &mut unit_items);
                }
                continue;
            }
            let line_start = line.start.max(*start);
            if block_start.is_none() {
                block_start = Some(line_start);
            }
            block_end = (line.start + line.text.trim_end().len()).min(*end);
        }
        if let Some(s) = block_start.take() {
            push_block(s, block_end, &mut first, &mut units, &mut unit_items);
        }
    }
    (units, unit_items)
}

/// The units packed into pieces within the budget (the preamble apart), each named by the file and
/// the item it starts with.
fn pack_items(
    text: &str,
    units: &[Unit],
    unit_items: &[usize],
    items: &[Item],
    source: &str,
    counter: TokenCounter,
    budget: usize,
) -> Vec<Piece> {
    let file_name = source
        .rsplit(['/', '\\'])
        .next()
        .unwrap_or(source)
        .to_string();
    // The preamble (imports, module docs) is never packed with the first item: each chunk is named by
    // the item it starts with.
    let preamble_units = if items
        .first()
        .is_some_and(|item| item.name == ItemName::Preamble)
    {
        unit_items
            .iter()
            .position(|&item| item != 0)
            .unwrap_or(units.len())
    } else {
        0
    };
    let mut ranges = pack_units(text, &units[..preamble_units], counter, budget, 0);
    ranges.extend(pack_units(
        text,
        &units[preamble_units..],
        counter,
        budget,
        0,
    ));
    ranges
        .into_iter()
        .map(|(start, end)| {
            let item_index = units
                .iter()
                .position(|u| u.start == start)
                .map(|u| unit_items[u])
                .unwrap_or(0);
            let item = &items[item_index];
            Piece {
                start,
                end,
                section_path: vec![file_name.clone(), item.name.as_str().to_string()],
                header: item.signature.chars().take(200).collect(),
                rendered: None,
                page: None,
            }
        })
        .collect()
}

/// Splits `[start, end)` on line boundaries into ranges of at most `budget` tokens each.
fn split_lines(
    text: &str,
    start: usize,
    end: usize,
    counter: TokenCounter,
    budget: usize,
) -> Vec<(usize, usize)> {
    let mut units = Vec::new();
    let mut offset = start;
    for raw in text[start..end].split_inclusive('\n') {
        let line = raw.trim_end();
        let content_start = offset + (line.len() - line.trim_start().len());
        let content_end = offset + line.len();
        offset += raw.len();
        if content_end <= content_start {
            continue;
        }
        let tokens = counter.count(&text[content_start..content_end]);
        if tokens <= budget {
            units.push(Unit {
                start: content_start,
                end: content_end,
                tokens,
                boundary: false,
                sticky: false,
            });
        } else {
            for (a, b) in split_oversized(text, content_start, content_end, counter, budget) {
                units.push(Unit {
                    start: a,
                    end: b,
                    tokens: counter.count(&text[a..b]),
                    boundary: false,
                    sticky: false,
                });
            }
        }
    }
    pack_units(text, &units, counter, budget, 0)
}
