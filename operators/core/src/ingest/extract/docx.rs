//! DOCX into markdown lines, with zip (the archive) and quick-xml (a streaming XML reader).
//!
//! `word/document.xml` is read as a stream of events, never as a tree: a paragraph (`w:p`) is a
//! block; its style makes it a heading when `word/styles.xml` names the style `heading N` or
//! `Title`, or gives it an outline level (a paragraph's own `w:outlineLvl` counts too); a numbered
//! paragraph (`w:numPr`) is a list item; a table row (`w:tr`) is a `| a | b |` line, a nested
//! table's text staying in its outer cell. Only shown text (`w:t`) is read: deleted revisions and
//! field codes are not. `docProps/core.xml`'s `dc:title` is the title. Every archive entry
//! inflates to at most `max_inflated_bytes`.

use std::collections::HashMap;
use std::io::{Cursor, Read};

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;

use super::{ExtractLimits, Extracted, Writer};

/// Whether a ZIP archive holds a Word document.
pub(super) fn is_docx(bytes: &[u8]) -> bool {
    zip::ZipArchive::new(Cursor::new(bytes))
        .is_ok_and(|archive| archive.index_for_name("word/document.xml").is_some())
}

pub(super) fn extract(bytes: &[u8], limits: &ExtractLimits) -> Result<Extracted, String> {
    let mut archive = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|err| format!("not a ZIP archive: {err}"))?;
    let document =
        entry(&mut archive, "word/document.xml", limits)?.ok_or("it has no word/document.xml")?;
    let levels = match entry(&mut archive, "word/styles.xml", limits)? {
        Some(styles) => heading_styles(&styles)?,
        None => HashMap::new(),
    };
    let title = entry(&mut archive, "docProps/core.xml", limits)?
        .and_then(|core| core_title(&core))
        .filter(|t| !t.is_empty());
    let text = body_text(&document, &levels, limits.max_text_bytes)?;
    Ok(Extracted { text, title })
}

/// An archive entry's bytes, or `None` when it has no such entry.
fn entry(
    archive: &mut zip::ZipArchive<Cursor<&[u8]>>,
    name: &str,
    limits: &ExtractLimits,
) -> Result<Option<Vec<u8>>, String> {
    let file = match archive.by_name(name) {
        Ok(file) => file,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(err) => return Err(format!("{name}: {err}")),
    };
    let mut out = Vec::new();
    let limit = limits.max_inflated_bytes as u64;
    file.take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|err| format!("{name}: {err}"))?;
    if out.len() as u64 > limit {
        return Err(format!(
            "{name} inflates past the limit of {} bytes",
            limits.max_inflated_bytes
        ));
    }
    Ok(Some(out))
}

fn reader(xml: &[u8]) -> Reader<&[u8]> {
    let mut reader = Reader::from_reader(xml);
    let config = reader.config_mut();
    // Word writes well-formed XML; a file that is not is read as far as it goes, not refused.
    config.check_end_names = false;
    config.allow_unmatched_ends = true;
    reader
}

/// The `w:val` (or any `val`) attribute of an element.
fn val(element: &BytesStart) -> Option<String> {
    element.attributes().flatten().find_map(|attr| {
        (attr.key.local_name().as_ref() == "val")
            .then(|| {
                attr.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                    .ok()
                    .map(|v| v.into_owned())
            })
            .flatten()
    })
}

/// Style id → heading level (1–6), from `word/styles.xml`.
fn heading_styles(xml: &[u8]) -> Result<HashMap<String, usize>, String> {
    let mut reader = reader(xml);
    let mut levels = HashMap::new();
    let mut style: Option<(String, Option<usize>)> = None;
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) | Ok(Event::Empty(e)) => match e.local_name().as_ref() {
                "style" => {
                    let id = e.attributes().flatten().find_map(|attr| {
                        (attr.key.local_name().as_ref() == "styleId")
                            .then(|| {
                                attr.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                                    .ok()
                                    .map(|v| v.into_owned())
                            })
                            .flatten()
                    });
                    style = id.map(|id| (id, None));
                }
                "name" => {
                    if let (Some((_, level)), Some(name)) = (&mut style, val(&e)) {
                        *level = level.or(heading_level(&name));
                    }
                }
                "outlineLvl" => {
                    if let (Some((_, level)), Some(outline)) = (&mut style, val(&e)) {
                        *level = level.or(outline_level(&outline));
                    }
                }
                _ => {}
            },
            Ok(Event::End(e)) if e.local_name().as_ref() == "style" => {
                if let Some((id, Some(level))) = style.take() {
                    levels.insert(id, level);
                }
            }
            Ok(Event::Eof) => return Ok(levels),
            Err(err) => return Err(format!("word/styles.xml: {err}")),
            _ => {}
        }
    }
}

/// The level of a style named `heading N` or `Title` (or with such an id, when no styles part
/// names it).
fn heading_level(name: &str) -> Option<usize> {
    let name = name.trim().to_ascii_lowercase();
    if name == "title" {
        return Some(1);
    }
    let digits = name.strip_prefix("heading")?.trim_start();
    let level: usize = digits.parse().ok()?;
    (1..=6).contains(&level).then_some(level)
}

fn outline_level(value: &str) -> Option<usize> {
    let level: usize = value.trim().parse().ok()?;
    (level < 6).then_some(level + 1)
}

/// `dc:title` of `docProps/core.xml`.
fn core_title(xml: &[u8]) -> Option<String> {
    let mut reader = reader(xml);
    let mut in_title = false;
    let mut title = String::new();
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) => in_title = e.local_name().as_ref() == "title",
            Ok(Event::End(_)) => in_title = false,
            Ok(Event::Text(text)) if in_title && title.len() < 512 => {
                title.push_str(&text.xml10_content());
            }
            Ok(Event::Eof) | Err(_) => break,
            _ => {}
        }
    }
    Some(title.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The paragraph being read.
#[derive(Default)]
struct Paragraph {
    text: String,
    level: Option<usize>,
    list: bool,
}

/// Writes a finished paragraph: into the open table cell, as a heading, a list item, or a paragraph
/// (escaped where it would read as markdown structure).
fn end_paragraph(paragraph: Paragraph, in_cell: bool, cell: &mut String, out: &mut Writer) {
    let words = paragraph.text.split_whitespace().collect::<Vec<_>>();
    if words.is_empty() {
        return;
    }
    let text = words.join(" ");
    if in_cell {
        if !cell.is_empty() {
            cell.push(' ');
        }
        cell.push_str(&text);
    } else if let Some(level) = paragraph.level {
        out.end_block();
        out.push(&"#".repeat(level));
        out.push(" ");
        out.push(&text);
        out.end_block();
    } else if paragraph.list {
        out.end_line();
        out.push("- ");
        out.push(&text);
        out.end_line();
    } else {
        out.end_block();
        if text.starts_with('#') || text.starts_with("```") {
            out.push("\\");
        }
        out.push(&text);
        out.end_block();
    }
}

fn body_text(
    xml: &[u8],
    levels: &HashMap<String, usize>,
    max_text_bytes: usize,
) -> Result<String, String> {
    let mut reader = reader(xml);
    let mut out = Writer::new(max_text_bytes);
    let mut paragraph = Paragraph::default();
    let mut in_text = false;
    // Table cells open (nested tables count), the current row's cells and the open cell's text.
    let mut cells_open = 0usize;
    let mut row: Vec<String> = Vec::new();
    let mut cell = String::new();
    loop {
        let event = reader
            .read_event()
            .map_err(|err| format!("word/document.xml: {err}"))?;
        match event {
            Event::Start(e) | Event::Empty(e) => match e.local_name().as_ref() {
                "p" => paragraph = Paragraph::default(),
                "pStyle" => {
                    let style = val(&e).unwrap_or_default();
                    paragraph.level = levels
                        .get(&style)
                        .copied()
                        .or_else(|| heading_level(&style));
                }
                "outlineLvl" => {
                    paragraph.level = val(&e).as_deref().and_then(outline_level);
                }
                "numPr" => paragraph.list = true,
                "t" => in_text = true,
                "tab" => paragraph.text.push('\t'),
                "br" | "cr" => paragraph.text.push('\n'),
                "tc" => {
                    cells_open += 1;
                    if cells_open == 1 {
                        cell.clear();
                    }
                }
                "tr" if cells_open == 0 => row.clear(),
                _ => {}
            },
            Event::Text(text) if in_text => {
                if paragraph.text.len() + cell.len() > max_text_bytes {
                    return Err(format!(
                        "its text exceeds the limit of {max_text_bytes} bytes"
                    ));
                }
                paragraph.text.push_str(&text.xml10_content());
            }
            Event::GeneralRef(reference) if in_text => {
                let resolved = match reference.resolve_char_ref() {
                    Ok(Some(c)) => Some(c),
                    _ => match reference.as_ref() {
                        "lt" => Some('<'),
                        "gt" => Some('>'),
                        "amp" => Some('&'),
                        "quot" => Some('"'),
                        "apos" => Some('\''),
                        _ => None,
                    },
                };
                paragraph.text.extend(resolved);
            }
            Event::End(e) => match e.local_name().as_ref() {
                "t" => in_text = false,
                "p" => {
                    let done = std::mem::take(&mut paragraph);
                    end_paragraph(done, cells_open > 0, &mut cell, &mut out);
                }
                "tc" if cells_open > 0 => {
                    cells_open -= 1;
                    if cells_open == 0 {
                        row.push(std::mem::take(&mut cell));
                    }
                }
                "tr" if cells_open == 0 && !row.is_empty() => {
                    out.end_line();
                    out.push("|");
                    for cell in row.drain(..) {
                        out.push(" ");
                        out.push(&cell);
                        out.push(" |");
                    }
                    out.end_line();
                }
                "tbl" if cells_open == 0 => out.end_block(),
                _ => {}
            },
            Event::Eof => break,
            _ => {}
        }
    }
    out.finish()
}
