use super::*;
use crate::testing::{docx_file, pdf_file};

fn limits() -> ExtractLimits {
    ExtractLimits::for_documents(1 << 20)
}

fn html(source: &str) -> Extracted {
    extract(DocKind::Html, source.as_bytes(), &limits()).expect("html")
}

#[test]
fn html_headings_become_markdown_lines_and_script_style_navigation_are_dropped() {
    let page = r#"<!DOCTYPE html><html><head><title>Ferry  guide</title>
        <style>body { color: red } h1 { x: "<h2>no</h2>" }</style>
        <script>if (a < b && c > d) { document.write("<h2>never</h2>") }</script></head>
        <body><nav><ul><li><a href="/">Home</a></li><li>Menu <nav>inner</nav> still menu</li></ul></nav>
        <div role="navigation">Breadcrumbs</div>
        <h1>Ferries</h1><p>Boats   leave
        at noon.</p>
        <h2>Tickets &amp; prices</h2><p>A ticket costs <b>5</b> EUR.<br>Children ride free.</p>
        <ul><li>Day pass</li><li>Week pass</li></ul>
        <h3>Refunds</h3><table><tr><th>Kind</th><th>Refund</th></tr><tr><td>Day</td><td>Full</td></tr></table>
        <pre>fn main() {
    go();
}</pre>
        <h2>Schedule</h2><p># not a heading</p><p hidden>secret</p><div aria-hidden="true">decor</div>
        </body></html>"#;
    let extracted = html(page);
    assert_eq!(extracted.title.as_deref(), Some("Ferry guide"));
    let expected = "# Ferries\n\nBoats leave at noon.\n\n## Tickets & prices\n\nA ticket costs 5 EUR.\nChildren ride free.\n\n- Day pass\n- Week pass\n\n### Refunds\n\n| Kind | Refund |\n| Day | Full |\n\n```\nfn main() {\n    go();\n}\n```\n\n## Schedule\n\n\\# not a heading\n";
    assert_eq!(extracted.text, expected);
}

#[test]
fn html_nested_a_hundred_thousand_deep_is_read_in_linear_time_without_recursion() {
    let depth = 100_000;
    let page = format!(
        "<html><body>{}<h2>Deep</h2><p>bottom text</p>{}</body></html>",
        "<div><span>".repeat(depth),
        "</span></div>".repeat(depth)
    );
    let started = std::time::Instant::now();
    let extracted = html(&page);
    assert!(
        extracted.text.contains("## Deep\n\nbottom text"),
        "{:?}",
        extracted.text
    );
    // Generous: linear work is milliseconds here; a quadratic walk would take minutes.
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn html_unclosed_navigation_drops_the_rest_and_a_page_of_only_navigation_is_refused() {
    let err = extract(
        DocKind::Html,
        b"<html><body><nav><a>Home</a><p>swallowed",
        &limits(),
    )
    .expect_err("no text");
    assert_eq!(err.format, "html");
    assert!(err.message.contains("no text"), "{err}");
}

#[test]
fn html_text_beyond_the_limit_is_refused_not_cut() {
    let page = format!("<p>{}</p>", "word ".repeat(2000));
    let small = ExtractLimits {
        max_text_bytes: 1000,
        ..limits()
    };
    let err = extract(DocKind::Html, page.as_bytes(), &small).expect_err("too long");
    assert!(err.message.contains("limit of 1000 bytes"), "{err}");
}

#[test]
fn pdf_pages_come_out_separated_by_form_feeds_with_lines_and_paragraphs() {
    let file = pdf_file(&[
        "Harbour report\n\nThe ferry (line 2) leaves at noon.\nIt returns at six.",
        "Tickets cost 5 EUR.",
        "Refunds are paid within 14 days.",
    ]);
    let extracted = extract(DocKind::Pdf, &file, &limits()).expect("pdf");
    let pages: Vec<&str> = extracted.text.split('\x0c').collect();
    assert_eq!(
        pages,
        [
            "Harbour report\n\nThe ferry (line 2) leaves at noon.\nIt returns at six.\n",
            "Tickets cost 5 EUR.\n",
            "Refunds are paid within 14 days.\n",
        ]
    );
    let numbered: Vec<(u32, &str)> = super::pages(&extracted.text)
        .map(|(start, end, page)| (page, extracted.text[start..end].trim()))
        .collect();
    assert_eq!(numbered[1], (2, "Tickets cost 5 EUR."));
    assert_eq!(numbered.len(), 3);
}

#[test]
fn broken_and_truncated_pdfs_are_refused_with_a_reason() {
    let file = pdf_file(&["Some text on a page."]);
    for (name, bytes) in [
        ("garbage", b"%PDF-1.7\n this is not a pdf at all".to_vec()),
        ("empty", b"%PDF-".to_vec()),
        ("truncated", file[..file.len() / 3].to_vec()),
    ] {
        let err = extract(DocKind::Pdf, &bytes, &limits()).expect_err(name);
        assert_eq!(err.format, "pdf", "{name}");
        assert!(!err.message.is_empty(), "{name}");
    }
}

#[test]
fn pdf_with_more_pages_than_the_limit_is_refused() {
    let file = pdf_file(&["one", "two", "three"]);
    let few = ExtractLimits {
        max_pages: 2,
        ..limits()
    };
    let err = extract(DocKind::Pdf, &file, &few).expect_err("too many pages");
    assert!(err.message.contains("3 pages"), "{err}");
}

#[test]
fn docx_headings_lists_tables_and_title_come_out_as_markdown_lines() {
    let file = docx_file(&[
        ("Title", "Harbour handbook"),
        ("", "Welcome aboard."),
        ("Heading1", "Ferries"),
        ("", "Boats leave at noon & return at six."),
        ("Heading2", "Tickets"),
        ("List", "Day pass"),
        ("List", "Week pass"),
        ("", "Kind | Price"),
        ("Heading2", "Refunds"),
        ("", "# paid within 14 days"),
    ]);
    let extracted = extract(DocKind::Docx, &file, &limits()).expect("docx");
    let expected = "# Harbour handbook\n\nWelcome aboard.\n\n# Ferries\n\nBoats leave at noon & return at six.\n\n## Tickets\n\n- Day pass\n- Week pass\n| Kind | Price |\n\n## Refunds\n\n\\# paid within 14 days\n";
    assert_eq!(extracted.text, expected);
}

#[test]
fn docx_entry_inflating_past_the_limit_is_refused() {
    use std::io::Write as _;
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    writer.start_file("word/document.xml", options).unwrap();
    writer.write_all(&vec![b' '; 4 << 20]).unwrap();
    let bomb = writer.finish().unwrap().into_inner();
    assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());
    let small = ExtractLimits {
        max_inflated_bytes: 1 << 20,
        ..limits()
    };
    let err = extract(DocKind::Docx, &bomb, &small).expect_err("bomb");
    assert!(err.message.contains("inflates past the limit"), "{err}");
    let err = extract(DocKind::Docx, b"PK\x03\x04 not really", &limits()).expect_err("zip");
    assert_eq!(err.format, "docx");
}

#[test]
fn formats_are_detected_by_extension_then_content() {
    let pdf = pdf_file(&["x"]);
    let docx = docx_file(&[("", "x")]);
    assert_eq!(detect("report.PDF", b"anything"), Some(DocKind::Pdf));
    assert_eq!(detect("site/index.htm", b"anything"), Some(DocKind::Html));
    assert_eq!(detect("notes.docx", b"anything"), Some(DocKind::Docx));
    assert_eq!(detect("upload-17", &pdf), Some(DocKind::Pdf));
    assert_eq!(detect("upload-18", &docx), Some(DocKind::Docx));
    assert_eq!(
        detect("upload-19", b"\xef\xbb\xbf  <!DOCTYPE html><p>x"),
        Some(DocKind::Html)
    );
    assert_eq!(detect("upload-20", b"<HTML><body>x"), Some(DocKind::Html));
    assert_eq!(detect("notes.md", b"# Title\n<html> in text"), None);
    assert_eq!(detect("notes.txt", b"plain words"), None);
    // Text that mentions a PDF header is text; binary junk before a header is still a PDF.
    assert_eq!(
        detect("mod.rs", b"//! starts with `%PDF-` near the top"),
        None
    );
    let mut junk = b"\xff\xfe\x00junk\n".to_vec();
    junk.extend_from_slice(&pdf);
    assert_eq!(detect("upload-22", &junk), Some(DocKind::Pdf));
    // A ZIP archive that is not a Word document is not one.
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    writer
        .start_file("data.csv", zip::write::SimpleFileOptions::default())
        .unwrap();
    let other_zip = writer.finish().unwrap().into_inner();
    assert_eq!(detect("upload-21", &other_zip), None);
}
