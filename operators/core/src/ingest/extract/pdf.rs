//! PDF into the text of each page, with lopdf (a pure-Rust PDF reader).
//!
//! Each page's content stream is read for its text-showing operators (`Tj`, `TJ`, `'`, `"`) decoded
//! with the page's font encodings (ToUnicode maps included); a move to another line (`Td`, `TD`,
//! `Tm`, `T*`) starts a new line, a line gap well beyond the page's usual one a new paragraph. Every
//! stream inflates to at most `max_inflated_bytes`, and the pages' content together to four times
//! that. An encrypted file whose empty password does not open it is refused, as is a file with more
//! than `max_pages` pages.

use std::collections::BTreeMap;

use lopdf::content::Content;
use lopdf::{Document, Encoding, LoadOptions, Object};

use super::{ExtractLimits, Extracted, Writer};

pub(super) fn extract(bytes: &[u8], limits: &ExtractLimits) -> Result<Extracted, String> {
    let options = LoadOptions {
        max_decompressed_size: Some(limits.max_inflated_bytes),
        ..LoadOptions::default()
    };
    let document = Document::load_mem_with_options(bytes, options).map_err(describe)?;
    if document.is_encrypted() {
        return Err("it is encrypted".into());
    }
    let pages = document.get_pages();
    if pages.len() > limits.max_pages {
        return Err(format!(
            "it has {} pages, over the limit of {}",
            pages.len(),
            limits.max_pages
        ));
    }
    if pages.is_empty() {
        return Err("it has no pages".into());
    }
    let mut out = Writer::new(limits.max_text_bytes);
    let mut budget = limits.max_inflated_bytes.saturating_mul(4);
    for (index, page_id) in pages.values().enumerate() {
        if index > 0 {
            out.end_line();
            out.push("\x0c");
        }
        let content = document
            .get_page_content_with_limit(*page_id, limits.max_inflated_bytes.min(budget))
            .map_err(|err| format!("page {}: {}", index + 1, describe(err)))?;
        budget = budget.saturating_sub(content.len());
        let operations = Content::decode(&content)
            .map_err(|err| format!("page {}: {}", index + 1, describe(err)))?
            .operations;
        let fonts = document.get_page_fonts(*page_id).unwrap_or_default();
        let encodings: BTreeMap<Vec<u8>, Encoding> = fonts
            .into_iter()
            .filter_map(|(name, font)| {
                font.get_font_encoding_with_limit(&document, limits.max_inflated_bytes)
                    .ok()
                    .map(|encoding| (name, encoding))
            })
            .collect();
        page_text(&operations, &encodings, &mut out);
    }
    Ok(Extracted {
        text: out.finish()?,
        title: None,
    })
}

/// What a reader error says, with the cause lopdf's own message leaves out (a stream past the
/// inflation limit).
fn describe(error: lopdf::Error) -> String {
    match &error {
        lopdf::Error::Decompress(cause) => format!("couldn't decompress a stream: {cause}"),
        _ => error.to_string(),
    }
}

/// Writes the text of one page's operations: its lines, a blank line where the move down to a line
/// is more than 1.6 times the page's median line gap.
fn page_text(
    operations: &[lopdf::content::Operation],
    encodings: &BTreeMap<Vec<u8>, Encoding>,
    out: &mut Writer,
) {
    let mut encoding: Option<&Encoding> = None;
    // The line matrix's vertical position (`BT` resets it, `Td` moves it, `Tm` sets it), where the
    // current line's text was shown, and whether it moved since.
    let mut y = 0.0f32;
    let mut shown_at: Option<f32> = None;
    let mut moved = false;
    // The page's lines, each with the move down that led to it (0 when unknown).
    let mut lines: Vec<(String, f32)> = Vec::new();
    let mut line = String::new();
    let mut line_dy = 0.0f32;
    let mut bytes = 0usize;
    let float = |object: Option<&Object>| object.and_then(|o| o.as_float().ok());
    let mut next_line = |line: &mut String, line_dy: &mut f32, dy: f32| {
        let text = line.trim();
        if !text.is_empty() {
            bytes = bytes.saturating_add(text.len());
            lines.push((text.to_string(), *line_dy));
        }
        line.clear();
        *line_dy = dy;
        bytes
    };
    for operation in operations {
        let operands = &operation.operands;
        match operation.operator.as_str() {
            "Tf" => {
                encoding = operands
                    .first()
                    .and_then(|o| o.as_name().ok())
                    .and_then(|name| encodings.get(name));
            }
            "BT" => y = 0.0,
            "Td" | "TD" => {
                y += float(operands.get(1)).unwrap_or(0.0);
                moved = true;
            }
            "Tm" => {
                y = float(operands.get(5)).unwrap_or(y);
                moved = true;
            }
            "T*" => {
                next_line(&mut line, &mut line_dy, 0.0);
                shown_at = None;
            }
            "Tj" | "TJ" | "'" | "\"" => {
                let starts_line = matches!(operation.operator.as_str(), "'" | "\"");
                let written = match shown_at {
                    _ if starts_line => next_line(&mut line, &mut line_dy, 0.0),
                    Some(at) if (y - at).abs() > 0.5 => {
                        next_line(&mut line, &mut line_dy, (y - at).abs())
                    }
                    _ => {
                        if moved && !line.is_empty() && !line.ends_with(' ') {
                            line.push(' ');
                        }
                        0
                    }
                };
                if written > out.max || line.len() > out.max {
                    out.over = true;
                    return;
                }
                shown_at = if starts_line { None } else { Some(y) };
                moved = false;
                let Some(encoding) = encoding else { continue };
                let shown: &[Object] = if operation.operator == "\"" {
                    operands.get(2..3).unwrap_or_default()
                } else {
                    operands
                };
                for operand in shown {
                    show(operand, encoding, &mut line);
                }
            }
            _ => {}
        }
    }
    next_line(&mut line, &mut line_dy, 0.0);
    let mut gaps: Vec<f32> = lines
        .iter()
        .map(|(_, dy)| *dy)
        .filter(|dy| *dy > 0.0)
        .collect();
    gaps.sort_by(f32::total_cmp);
    let usual = gaps.get(gaps.len().saturating_sub(1) / 2).copied();
    for (text, dy) in lines {
        if usual.is_some_and(|usual| dy > usual * 1.6) {
            out.end_block();
        }
        out.end_line();
        out.push_inline(&text);
    }
}

/// Shows a string, or a `TJ` array whose large negative adjustments are word gaps.
fn show(operand: &Object, encoding: &Encoding, line: &mut String) {
    match operand {
        Object::String(bytes, _) => {
            let _ = encoding.write_to_string(bytes, line);
        }
        Object::Array(items) => {
            for item in items {
                match item {
                    Object::String(bytes, _) => {
                        let _ = encoding.write_to_string(bytes, line);
                    }
                    Object::Integer(_) | Object::Real(_)
                        if item.as_float().is_ok_and(|adjust| adjust < -200.0)
                            && !line.ends_with(' ') =>
                    {
                        line.push(' ');
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}
