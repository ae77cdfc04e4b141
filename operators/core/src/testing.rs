//! Builders of test records, for this crate's tests and (feature `testing`) the tests of the crates
//! above it.

use crate::ingest::chunk::content_hash;
use crate::model::{Chunk, DocKey, DocKind, Document};
use crate::store::{Bm25Encoder, PointWrite, StoredChunk};

/// A prose document `tenant/id` of version 1 holding `text` (its id as source, no title, ACL or
/// metadata).
pub fn prose(tenant: &str, id: &str, text: &str) -> Document {
    Document {
        key: DocKey::new(tenant, id),
        version: 1,
        source: id.into(),
        kind: DocKind::Prose,
        title: None,
        text: text.into(),
        acl: vec![],
        updated_ms: 0,
        metadata: Default::default(),
    }
}

/// A stored chunk of `doc` at `order` with `text` (tenant `t`, embedder version `test`).
pub fn stored(doc: &str, order: u32, text: &str) -> StoredChunk {
    let start = order * 1000;
    StoredChunk {
        id: uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("{doc}#{order}").as_bytes(),
        ),
        key: DocKey::new("t", doc),
        version: 1,
        embedder_version: "test".into(),
        chunk: Chunk {
            order_index: order,
            section_path: vec![format!("{doc} section {order}")],
            header: format!("{doc} section {order}"),
            doc_title: format!("Title of {doc}"),
            source: format!("src/{doc}.md"),
            kind: DocKind::Prose,
            lines: (order * 10 + 1, order * 10 + 9),
            page: None,
            char_range: (start, start + text.len() as u32),
            tokens: crate::tokens::TokenCounter::new(crate::tokens::Encoding::O200kBase).count(text)
                as u32,
            content_hash: blake3::hash(text.as_bytes()).to_hex().to_string(),
            occurrence: 0,
            acl: vec![],
            updated_ms: 0,
            metadata: Default::default(),
            lang: "eng".into(),
            text: text.into(),
            last: false,
        },
    }
}

/// Vector dimension of [`sample_point`]s (the store contract's collections).
pub const DIMENSION: usize = 8;

fn unit(axis: usize) -> Vec<f32> {
    let mut v = vec![0.01; DIMENSION];
    v[axis % DIMENSION] = 1.0;
    crate::embed::l2_normalize(&mut v);
    v
}

/// A point for `tenant/doc_id` with `text` (language `eng`), its dense vector on an axis derived from
/// the text.
pub fn sample_point(
    tenant: &str,
    doc_id: &str,
    version: u64,
    text: &str,
    acl: &[&str],
) -> PointWrite {
    let mut chunk = Chunk {
        order_index: 0,
        section_path: vec!["Section".into()],
        header: "Section".into(),
        doc_title: doc_id.into(),
        source: format!("docs/{doc_id}"),
        kind: DocKind::Prose,
        lines: (1, 1),
        page: None,
        char_range: (0, text.len() as u32),
        tokens: 3,
        content_hash: String::new(),
        occurrence: 0,
        acl: acl.iter().map(|s| s.to_string()).collect(),
        updated_ms: 0,
        metadata: Default::default(),
        lang: "eng".into(),
        text: text.into(),
        last: false,
    };
    chunk.content_hash = content_hash(&chunk);
    let axis = text.bytes().map(usize::from).sum::<usize>();
    let key = DocKey::new(tenant, doc_id);
    PointWrite {
        id: chunk.point_id(&key),
        key,
        version,
        sparse: Bm25Encoder::default().encode_document(&chunk.embedding_input()),
        dense: unit(axis),
        evidence: Vec::new(),
        chunk,
        embedder_version: "test-embedder".into(),
    }
}

/// A PDF of `pages` as a PDF writer lays them out: one Helvetica text object per page, a line per
/// `Td` move, a blank line of the text a larger move (a new paragraph); content streams uncompressed.
pub fn pdf_file(pages: &[&str]) -> Vec<u8> {
    let escape = |line: &str| {
        line.replace('\\', "\\\\")
            .replace('(', "\\(")
            .replace(')', "\\)")
    };
    let mut objects: Vec<String> = vec![
        "<< /Type /Catalog /Pages 2 0 R >>".into(),
        String::new(), // the page tree, once the pages' ids are known
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>".into(),
    ];
    let mut kids = Vec::new();
    for page in pages {
        let mut content = String::from("BT\n/F1 11 Tf\n72 720 Td\n");
        let mut gap = 0;
        for line in page.lines() {
            if line.trim().is_empty() {
                gap += 1;
                continue;
            }
            if content.ends_with("Tj\n") {
                content.push_str(&format!("0 -{} Td\n", 14 + 14 * gap.min(1)));
            }
            gap = 0;
            content.push_str(&format!("({}) Tj\n", escape(line)));
        }
        content.push_str("ET\n");
        let page_id = objects.len() + 1;
        kids.push(format!("{page_id} 0 R"));
        objects.push(format!(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents {} 0 R >>",
            page_id + 1
        ));
        objects.push(format!(
            "<< /Length {} >>\nstream\n{content}endstream",
            content.len()
        ));
    }
    objects[1] = format!(
        "<< /Type /Pages /Kids [{}] /Count {} >>",
        kids.join(" "),
        pages.len()
    );
    let objects: Vec<Vec<u8>> = objects.into_iter().map(String::into_bytes).collect();
    pdf_document("1.4", &objects)
}

/// A PDF of version `version` holding `objects` (numbered from 1; object 1 the catalog), with a
/// classic cross-reference table.
fn pdf_document(version: &str, objects: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("%PDF-{version}\n%").into_bytes();
    out.extend_from_slice(b"\xe2\xe3\xcf\xd3\n");
    let mut offsets = Vec::new();
    for (index, object) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n", index + 1).as_bytes());
        out.extend_from_slice(object);
        out.extend_from_slice(b"\nendobj\n");
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
    );
    for offset in offsets {
        out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .as_bytes(),
    );
    out
}

/// A DOCX of `paragraphs` (style id, text) as Word writes one: `word/document.xml` with the
/// styles `Title`, `Heading1`–`Heading3` named in `word/styles.xml`, the content types and the
/// package relationships, deflated. The style id `List` makes a numbered list item; a text with
/// `|` between cells, a one-row table.
pub fn docx_file(paragraphs: &[(&str, &str)]) -> Vec<u8> {
    let escape = |text: &str| {
        text.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let paragraph = |style: &str, text: &str| {
        let properties = match style {
            "" => String::new(),
            "List" => {
                "<w:pPr><w:numPr><w:ilvl w:val=\"0\"/><w:numId w:val=\"1\"/></w:numPr></w:pPr>"
                    .into()
            }
            style => format!("<w:pPr><w:pStyle w:val=\"{style}\"/></w:pPr>"),
        };
        format!(
            "<w:p>{properties}<w:r><w:t xml:space=\"preserve\">{}</w:t></w:r></w:p>",
            escape(text)
        )
    };
    let mut body = String::new();
    for (style, text) in paragraphs {
        if text.contains('|') {
            body.push_str("<w:tbl><w:tr>");
            for cell in text.split('|') {
                body.push_str(&format!("<w:tc>{}</w:tc>", paragraph("", cell.trim())));
            }
            body.push_str("</w:tr></w:tbl>");
        } else {
            body.push_str(&paragraph(style, text));
        }
    }
    docx_package(format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<w:document xmlns:w=\"http://schemas.openxmlformats.org/wordprocessingml/2006/main\"><w:body>{body}<w:sectPr/></w:body></w:document>"
    ))
}

/// A DOCX package around `document` (its `word/document.xml`).
fn docx_package(document: String) -> Vec<u8> {
    let mut styles = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<w:styles xmlns:w=\"http://schemas.openxmlformats.org/wordprocessingml/2006/main\"><w:style w:type=\"paragraph\" w:styleId=\"Title\"><w:name w:val=\"Title\"/></w:style>");
    for level in 1..=3 {
        styles.push_str(&format!("<w:style w:type=\"paragraph\" w:styleId=\"Heading{level}\"><w:name w:val=\"heading {level}\"/><w:pPr><w:outlineLvl w:val=\"{}\"/></w:pPr></w:style>", level - 1));
    }
    styles.push_str("</w:styles>");
    let parts = [
        ("[Content_Types].xml", "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Types xmlns=\"http://schemas.openxmlformats.org/package/2006/content-types\"><Default Extension=\"rels\" ContentType=\"application/vnd.openxmlformats-package.relationships+xml\"/><Default Extension=\"xml\" ContentType=\"application/xml\"/><Override PartName=\"/word/document.xml\" ContentType=\"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml\"/><Override PartName=\"/word/styles.xml\" ContentType=\"application/vnd.openxmlformats-officedocument.wordprocessingml.styles+xml\"/></Types>".to_string()),
        ("_rels/.rels", "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Relationships xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\"><Relationship Id=\"rId1\" Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument\" Target=\"word/document.xml\"/></Relationships>".to_string()),
        ("word/document.xml", document),
        ("word/styles.xml", styles),
    ];
    let entries: Vec<(&str, &[u8])> = parts
        .iter()
        .map(|(name, content)| (*name, content.as_bytes()))
        .collect();
    zip_file(&entries)
}

/// A ZIP archive of `entries` (name, bytes), deflated.
pub fn zip_file(entries: &[(&str, &[u8])]) -> Vec<u8> {
    use std::io::Write as _;
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for (name, content) in entries {
        writer.start_file(*name, options).expect("zip entry");
        writer.write_all(content).expect("zip write");
    }
    writer.finish().expect("zip finish").into_inner()
}

/// Files crafted to cost their reader far more than their size (the hostile-files tests and the
/// sandbox's): each small on disk, each a known way to exhaust a parser's memory, time or stack.
pub mod hostile {
    /// zlib-compresses `bytes` (a PDF `FlateDecode` stream).
    fn deflate(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(bytes).expect("in memory");
        encoder.finish().expect("in memory")
    }

    fn pdf(objects: &[Vec<u8>]) -> Vec<u8> {
        super::pdf_document("1.5", objects)
    }

    fn stream(dictionary: &str, content: &[u8]) -> Vec<u8> {
        let mut object = format!(
            "<< {dictionary} /Filter /FlateDecode /Length {} >>\nstream\n",
            content.len()
        )
        .into_bytes();
        object.extend_from_slice(content);
        object.extend_from_slice(b"\nendstream");
        object
    }

    /// A one-page PDF whose content stream (deflated) is `content`.
    pub fn pdf_with_content(content: &[u8]) -> Vec<u8> {
        pdf(&[
            b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_vec(),
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>".to_vec(),
            stream("", &deflate(content)),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>".to_vec(),
        ])
    }

    /// A one-page PDF whose content stream inflates to `inflated` bytes of path operators
    /// (`0 0 m`): a few dozen kilobytes on disk, gigabytes once parsed into operations.
    pub fn pdf_amplifying_content(inflated: usize) -> Vec<u8> {
        let line = b"0 0 m\n";
        let content: Vec<u8> = line
            .iter()
            .copied()
            .cycle()
            .take(inflated / line.len() * line.len())
            .collect();
        pdf_with_content(&content)
    }

    /// A PDF with an object stream of `entries` objects that all start at the same offset: one
    /// array of `width` numbers, parsed once for every entry.
    pub fn pdf_object_stream_copies(entries: usize, width: usize) -> Vec<u8> {
        let mut index = String::new();
        for entry in 0..entries {
            index.push_str(&format!("{} 0 ", 100 + entry));
        }
        let mut content = index.clone().into_bytes();
        content.push(b'[');
        for _ in 0..width {
            content.extend_from_slice(b"0 ");
        }
        content.push(b']');
        let dictionary = format!("/Type /ObjStm /N {entries} /First {}", index.len());
        pdf(&[
            b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_vec(),
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 5 0 R >>".to_vec(),
            stream(&dictionary, &deflate(&content)),
            stream("", &deflate(b"BT /F1 11 Tf 72 720 Td (copies) Tj ET")),
        ])
    }

    /// A one-page PDF whose catalog leads to a chain of `count` dictionaries, each naming the next
    /// (an object graph as long as the file).
    pub fn pdf_linked_objects(count: usize) -> Vec<u8> {
        let mut objects = vec![
            b"<< /Type /Catalog /Pages 2 0 R /Chain 6 0 R >>".to_vec(),
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_vec(),
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>".to_vec(),
            stream("", &deflate(b"BT /F1 11 Tf 72 720 Td (linked) Tj ET")),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>".to_vec(),
        ];
        for link in 0..count {
            let id = objects.len() + 1;
            objects.push(if link + 1 < count {
                format!("<< /Index {link} /Next {} 0 R >>", id + 1).into_bytes()
            } else {
                format!("<< /Index {link} >>").into_bytes()
            });
        }
        pdf(&objects)
    }

    /// A one-page PDF whose content stream nests `depth` arrays (a parser that recurses per level
    /// runs out of stack).
    pub fn pdf_nested_arrays(depth: usize) -> Vec<u8> {
        let mut content = vec![b'['; depth];
        content.extend(std::iter::repeat_n(b']', depth));
        content.extend_from_slice(b" TJ");
        pdf_with_content(&content)
    }

    /// An HTML page of `count` headings, each a few words.
    pub fn html_headings(count: usize) -> Vec<u8> {
        let mut page = b"<!doctype html><html><body>".to_vec();
        for index in 0..count {
            page.extend_from_slice(format!("<h2>Part {index}</h2>").as_bytes());
        }
        page.extend_from_slice(b"</body></html>");
        page
    }

    /// An HTML page of `count` elements opened and never closed.
    pub fn html_unclosed(count: usize) -> Vec<u8> {
        let mut page = b"<!doctype html><html><body>".to_vec();
        for index in 0..count {
            page.extend_from_slice(if index % 2 == 0 {
                b"<div>x"
            } else {
                b"<span>y"
            });
        }
        page
    }

    /// An HTML page of `count` nested `<div>`s, closed.
    pub fn html_nested(count: usize) -> Vec<u8> {
        let mut page = b"<!doctype html><html><body>".to_vec();
        page.extend(b"<div>".repeat(count));
        page.extend_from_slice(b"deep");
        page.extend(b"</div>".repeat(count));
        page.extend_from_slice(b"</body></html>");
        page
    }

    /// An HTML page holding one word of `bytes` letters (no whitespace anywhere).
    pub fn html_one_word(bytes: usize) -> Vec<u8> {
        let mut page = b"<!doctype html><html><body><p>".to_vec();
        page.extend(std::iter::repeat_n(b'a', bytes));
        page.extend_from_slice(b"</p></body></html>");
        page
    }

    /// A DOCX whose document declares the "billion laughs" entities (each ten of the one before)
    /// and uses the last.
    pub fn docx_billion_laughs() -> Vec<u8> {
        let mut dtd = String::from("<!DOCTYPE w:document [<!ENTITY lol0 \"lol\">");
        for level in 1..10 {
            dtd.push_str(&format!(
                "<!ENTITY lol{level} \"{}\">",
                format!("&lol{};", level - 1).repeat(10)
            ));
        }
        dtd.push_str("]>");
        let document = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>{dtd}<w:document xmlns:w=\"http://schemas.openxmlformats.org/wordprocessingml/2006/main\"><w:body><w:p><w:r><w:t>laughs &lol9;</w:t></w:r></w:p></w:body></w:document>"
        );
        super::docx_package(document)
    }
}
