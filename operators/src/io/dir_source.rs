//! DirSource and JsonlSource: the embedded default's inputs, no broker needed.
//!
//! [`DirSource`] walks a directory recursively (honouring `.gitignore`, `.ignore` and hidden files like
//! git does, via the `ignore` crate), extracts HTML, PDF and DOCX files (recognised by extension or
//! content; one that cannot be read goes to the DLQ as `unparseable`, once per content), skips other
//! binary files (a NUL byte in the first `preview_window` bytes, 8 KiB unless configured, or invalid UTF-8), and sends an upsert for every new or
//! changed file (by content hash) and a delete for every file that disappeared. It rescans on an interval, so the index follows edits. Document id = path
//! relative to the root; version = a per-document counter seeded from the index, so a restart re-sends
//! every file with a newer version and the differential upsert finds the unchanged chunks unchanged.
//!
//! [`JsonlSource`] reads a file of document events (the Kafka wire format, one per line), once.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::ingest::decode::{check_bounds, decode_event, DecodeConfig, DecodeError, DlqReason};
use crate::ingest::dlq::{DlqRecord, Origin};
use crate::ingest::extract::{self, Extracted, FileReader};
use crate::model::{DocKey, DocKind, DocOp, Document};

/// Bytes at a file's start searched for a NUL byte unless configured (`[source] preview_window`).
pub const DEFAULT_PREVIEW_WINDOW: usize = 8192;

/// One scan's findings for a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    hash: [u8; 32],
}

/// Incremental directory scanner (the pure core of the directory source).
#[derive(Debug)]
pub struct DirSource {
    root: PathBuf,
    tenant: String,
    max_bytes: usize,
    extensions: Extensions,
    preview_window: usize,
    files: Arc<dyn FileReader>,
    seen: HashMap<String, Seen>,
    versions: HashMap<String, u64>,
}

/// Which files a scan reads, by extension (case-insensitive, without the dot; `tar.gz` matches
/// `a.tar.gz`): with `include`, only files ending in one of them; never those ending in one of
/// `exclude`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extensions {
    /// Only these (none: every extension).
    pub include: Vec<String>,
    /// Never these.
    pub exclude: Vec<String>,
}

impl Extensions {
    /// The lists as given (`.md`, `MD` and `md` alike).
    pub fn new(include: &[String], exclude: &[String]) -> Self {
        let normal = |list: &[String]| {
            list.iter()
                .map(|e| e.trim().trim_start_matches('.').to_lowercase())
                .filter(|e| !e.is_empty())
                .collect()
        };
        Self {
            include: normal(include),
            exclude: normal(exclude),
        }
    }

    /// Whether a file named `name` is read.
    pub fn admits(&self, name: &str) -> bool {
        let name = name.to_lowercase();
        let ends = |ext: &String| {
            name.len() > ext.len() + 1
                && name.ends_with(ext.as_str())
                && name.as_bytes()[name.len() - ext.len() - 1] == b'.'
        };
        (self.include.is_empty() || self.include.iter().any(ends)) && !self.exclude.iter().any(ends)
    }
}

/// What a file turned out to be.
enum FileContent {
    Text(String),
    /// An HTML, PDF or DOCX file, extracted.
    Extracted(DocKind, Extracted),
    Binary,
}

/// Reads a file: one of the formats [`extract::detect`] recognises is extracted (or refused with
/// the reason), other files are text when they are UTF-8 without a NUL in the first `preview`
/// bytes.
fn read_file(
    doc_id: &str,
    bytes: Vec<u8>,
    (max_bytes, preview): (usize, usize),
    files: &dyn FileReader,
) -> Result<FileContent, extract::ExtractError> {
    if let Some(kind) = extract::detect(doc_id, &bytes) {
        let limits = extract::ExtractLimits::for_documents(max_bytes);
        return files
            .read(kind, &bytes, &limits)
            .map(|file| FileContent::Extracted(kind, file));
    }
    if bytes[..bytes.len().min(preview)].contains(&0) {
        return Ok(FileContent::Binary);
    }
    Ok(String::from_utf8(bytes).map_or(FileContent::Binary, FileContent::Text))
}

impl DirSource {
    /// A scanner of `root` for `tenant`. `known` are documents already in the index (doc id → version):
    /// those missing on disk at the first scan are deleted.
    pub fn new(
        root: PathBuf,
        tenant: String,
        max_bytes: usize,
        known: BTreeMap<String, u64>,
    ) -> Self {
        let seen = known
            .keys()
            .map(|id| (id.clone(), Seen { hash: [0; 32] }))
            .collect();
        Self {
            root,
            tenant,
            max_bytes,
            extensions: Extensions::default(),
            preview_window: DEFAULT_PREVIEW_WINDOW,
            files: Arc::new(extract::InProcess),
            seen,
            versions: known.into_iter().collect(),
        }
    }

    /// Reads only the files `extensions` admits (a file it no longer admits is deleted from the
    /// index at the next scan, as a vanished one is).
    pub fn with_extensions(mut self, extensions: Extensions) -> Self {
        self.extensions = extensions;
        self
    }

    /// Reads HTML, PDF and DOCX files with `files` (the job: its sandbox; in this process otherwise).
    pub fn with_files(mut self, files: Arc<dyn FileReader>) -> Self {
        self.files = files;
        self
    }

    /// Searches the first `bytes` of a file for the NUL byte that marks it binary (at least 1).
    pub fn with_preview_window(mut self, bytes: usize) -> Self {
        self.preview_window = bytes.max(1);
        self
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn next_version(&mut self, doc_id: &str) -> u64 {
        let version = self.versions.entry(doc_id.to_string()).or_insert(0);
        *version += 1;
        *version
    }

    /// Scans once: upserts for new or changed files, deletes for vanished ones, DLQ records for refusals.
    pub fn scan(&mut self) -> Vec<Result<DocOp, DlqRecord>> {
        self.scan_until(&AtomicBool::new(false))
    }

    /// [`Self::scan`], given up (nothing found, nothing remembered) once `stop` is set: the job is
    /// stopping and a scan reading many files should not hold it.
    pub fn scan_until(&mut self, stop: &AtomicBool) -> Vec<Result<DocOp, DlqRecord>> {
        let mut out = Vec::new();
        let mut present: HashMap<String, Seen> = HashMap::new();
        let walker = ignore::WalkBuilder::new(&self.root)
            .hidden(true)
            .git_ignore(true)
            .git_exclude(true)
            .require_git(false)
            .build();
        for entry in walker.flatten() {
            if !entry.file_type().is_some_and(|t| t.is_file())
                || !self.extensions.admits(&entry.file_name().to_string_lossy())
            {
                continue;
            }
            if stop.load(Ordering::SeqCst) {
                return Vec::new();
            }
            self.scan_file(&entry, &mut present, &mut out);
        }
        self.delete_vanished(&present, &mut out);
        self.seen = present;
        out
    }

    /// Scans one file: records it in `present`, pushes its upsert or refusal if new or changed.
    fn scan_file(
        &mut self,
        entry: &ignore::DirEntry,
        present: &mut HashMap<String, Seen>,
        out: &mut Vec<Result<DocOp, DlqRecord>>,
    ) {
        let path = entry.path();
        let doc_id = path
            .strip_prefix(&self.root)
            .unwrap_or(path)
            .to_string_lossy()
            .replace('\\', "/");
        let origin = Origin::File {
            path: doc_id.clone(),
            line: None,
        };
        if let Err(refused) = check_bounds(&self.tenant, &doc_id, Some(&doc_id), None, &[]) {
            self.refuse_path(&doc_id, origin, refused, present, out);
            return;
        }
        let size = entry.metadata().map(|m| m.len() as usize).unwrap_or(0);
        if size > self.max_bytes {
            self.refuse_oversize(entry, &doc_id, size, origin, present, out);
            return;
        }
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) => {
                // A file that is there but cannot be read now is not a deleted one: what the index
                // holds of it stays, and the next scan reads it again.
                tracing::warn!(path = %doc_id, %error, "unreadable file skipped");
                if let Some(seen) = self.seen.get(&doc_id) {
                    present.insert(doc_id, *seen);
                }
                return;
            }
        };
        let seen = Seen {
            hash: *blake3::hash(&bytes).as_bytes(),
        };
        let unchanged = self.seen.get(&doc_id) == Some(&seen);
        present.insert(doc_id.clone(), seen);
        if unchanged {
            return;
        }
        let (kind, text, file_title) = match read_file(
            &doc_id,
            bytes,
            (self.max_bytes, self.preview_window),
            &*self.files,
        ) {
            Ok(FileContent::Text(text)) => (DocKind::Auto, text, None),
            Ok(FileContent::Extracted(kind, file)) => (kind, file.text, file.title),
            Ok(FileContent::Binary) => {
                // Not a document: a text file that turned binary (or invalid UTF-8) is
                // deleted from the index as a vanished one is, not left as it was.
                tracing::debug!(path = %doc_id, "binary file skipped");
                present.remove(&doc_id);
                return;
            }
            Err(refused) => {
                // Refused once per content: the hash above is remembered.
                out.push(Err(DlqRecord::new(
                    DlqReason::Unparseable,
                    format!("{}: {refused}", DlqReason::Unparseable.as_str()),
                    origin,
                    Some(self.tenant.clone()),
                    Some(doc_id.as_bytes()),
                    None,
                )));
                return;
            }
        };
        out.push(Ok(self.upsert(path, doc_id, kind, text, file_title)));
    }

    /// Refuses a path too long or too deep to index (once while it stays).
    fn refuse_path(
        &self,
        doc_id: &str,
        origin: Origin,
        refused: DecodeError,
        present: &mut HashMap<String, Seen>,
        out: &mut Vec<Result<DocOp, DlqRecord>>,
    ) {
        // A path too long or too deep to index: refused once while it stays.
        let seen = Seen {
            hash: *blake3::hash(b"refused path").as_bytes(),
        };
        let unchanged = self.seen.get(doc_id) == Some(&seen);
        present.insert(doc_id.to_string(), seen);
        if !unchanged {
            out.push(Err(DlqRecord::new(
                refused.reason,
                refused.to_string(),
                origin,
                Some(self.tenant.clone()),
                None,
                None,
            )));
        }
    }

    /// Refuses a file of `size` bytes, over the limit (once per content change).
    fn refuse_oversize(
        &self,
        entry: &ignore::DirEntry,
        doc_id: &str,
        size: usize,
        origin: Origin,
        present: &mut HashMap<String, Seen>,
        out: &mut Vec<Result<DocOp, DlqRecord>>,
    ) {
        // Refused once per content change: remember it by size and modification time.
        let modified = entry
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .map(|t| format!("{t:?}"))
            .unwrap_or_default();
        let seen = Seen {
            hash: *blake3::hash(format!("{size}/{modified}").as_bytes()).as_bytes(),
        };
        let unchanged = self.seen.get(doc_id) == Some(&seen);
        present.insert(doc_id.to_string(), seen);
        if unchanged {
            return;
        }
        let message = format!(
            "oversize: file of {size} bytes exceeds the limit of {} bytes",
            self.max_bytes
        );
        out.push(Err(DlqRecord::new(
            DlqReason::Oversize,
            message,
            origin,
            Some(self.tenant.clone()),
            Some(doc_id.as_bytes()),
            None,
        )));
    }

    /// The upsert of a new or changed file, at the document's next version.
    fn upsert(
        &mut self,
        path: &Path,
        doc_id: String,
        kind: DocKind,
        text: String,
        file_title: Option<String>,
    ) -> DocOp {
        let version = self.next_version(&doc_id);
        let title =
            file_title.or_else(|| path.file_name().map(|n| n.to_string_lossy().into_owned()));
        // The file's modification time is when the document last changed.
        let updated_ms = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64);
        DocOp::Upsert(Document {
            key: DocKey::new(self.tenant.clone(), doc_id.clone()),
            version,
            source: doc_id,
            kind,
            title,
            text,
            acl: Vec::new(),
            updated_ms,
            metadata: Default::default(),
        })
    }

    /// Deletes, in id order, the documents seen before that are not `present` now.
    fn delete_vanished(
        &mut self,
        present: &HashMap<String, Seen>,
        out: &mut Vec<Result<DocOp, DlqRecord>>,
    ) {
        let mut vanished: Vec<String> = self
            .seen
            .keys()
            .filter(|id| !present.contains_key(*id))
            .cloned()
            .collect();
        vanished.sort();
        for doc_id in vanished {
            let version = self.next_version(&doc_id);
            out.push(Ok(DocOp::Delete {
                key: DocKey::new(self.tenant.clone(), doc_id),
                version: Some(version),
            }));
        }
    }
}

/// Reads document events from a JSONL file (Kafka wire format, one event per line).
// The `Err` side is a DLQ record flowing through the dataflow as data, not an error path.
#[allow(clippy::result_large_err)]
pub fn read_jsonl(
    path: &Path,
    decode: &DecodeConfig,
) -> std::io::Result<Vec<Result<DocOp, DlqRecord>>> {
    let text = std::fs::read(path)?;
    let name = path.to_string_lossy().into_owned();
    Ok(text
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.iter().all(u8::is_ascii_whitespace))
        .map(|(index, line)| {
            decode_event(None, Some(line), decode).map_err(|error| {
                let origin = Origin::File {
                    path: name.clone(),
                    line: Some(index as u64 + 1),
                };
                DlqRecord::new(
                    error.reason,
                    error.to_string(),
                    origin,
                    None,
                    None,
                    Some(line),
                )
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(ops: &[Result<DocOp, DlqRecord>]) -> Vec<String> {
        let mut out: Vec<String> = ops
            .iter()
            .map(|op| match op {
                Ok(DocOp::Upsert(doc)) => format!("upsert {} v{}", doc.key.doc_id, doc.version),
                Ok(DocOp::Delete { key, .. }) => format!("delete {}", key.doc_id),
                Err(record) => format!("dlq {} {}", record.reason, record.origin),
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn incremental_scans_with_gitignore_binary_and_deletes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join(".gitignore"), "target/\n*.log\n").unwrap();
        std::fs::write(root.join("README.md"), "# Hello\n\nWorld.\n").unwrap();
        std::fs::write(root.join("src/lib.rs"), "fn main() {}\n").unwrap();
        std::fs::write(root.join("debug.log"), "ignored\n").unwrap();
        std::fs::create_dir_all(root.join("target")).unwrap();
        std::fs::write(root.join("target/out.txt"), "ignored\n").unwrap();
        std::fs::write(root.join("image.bin"), [0u8, 1, 2, 3]).unwrap();
        std::fs::write(root.join("big.txt"), "x".repeat(100)).unwrap();
        let mut source = DirSource::new(
            root.to_path_buf(),
            "local".into(),
            64,
            BTreeMap::from([("gone.md".to_string(), 4)]),
        );
        let first = source.scan();
        assert_eq!(
            kinds(&first),
            vec![
                "delete gone.md",
                "dlq oversize big.txt",
                "upsert README.md v1",
                "upsert src/lib.rs v1"
            ],
            "hidden, ignored and binary files are skipped"
        );
        assert!(source.scan().is_empty(), "nothing changed");
        std::fs::write(root.join("README.md"), "# Hello\n\nChanged.\n").unwrap();
        std::fs::remove_file(root.join("src/lib.rs")).unwrap();
        assert_eq!(
            kinds(&source.scan()),
            vec!["delete src/lib.rs", "upsert README.md v2"]
        );
        // A text file that turns binary (here: invalid UTF-8) leaves the index, once; a binary
        // file stays out however often it is scanned.
        std::fs::write(root.join("README.md"), [b'#', b' ', 0xff, 0xfe]).unwrap();
        assert_eq!(kinds(&source.scan()), vec!["delete README.md"]);
        assert!(source.scan().is_empty(), "deleted once");
        std::fs::write(root.join("README.md"), "# Back\n").unwrap();
        assert_eq!(kinds(&source.scan()), vec!["upsert README.md v4"]);
    }

    #[test]
    fn extension_lists_choose_the_files_read_and_a_file_no_longer_admitted_leaves_the_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::write(root.join("guide.md"), "# Guide\n\nText.\n").unwrap();
        std::fs::write(root.join("NOTES.MD"), "Notes.\n").unwrap();
        std::fs::write(root.join("lib.rs"), "fn main() {}\n").unwrap();
        std::fs::write(root.join("data.tar.gz.txt"), "listing\n").unwrap();
        std::fs::write(root.join("md"), "no extension\n").unwrap();
        let scan = |include: &[&str], exclude: &[&str]| {
            let own = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            DirSource::new(root.to_path_buf(), "local".into(), 1 << 20, BTreeMap::new())
                .with_extensions(Extensions::new(&own(include), &own(exclude)))
                .scan()
        };
        assert_eq!(
            kinds(&scan(&[".md", "RS"], &[])),
            vec![
                "upsert NOTES.MD v1",
                "upsert guide.md v1",
                "upsert lib.rs v1"
            ]
        );
        assert_eq!(
            kinds(&scan(&[], &["md", "txt"])),
            vec!["upsert lib.rs v1", "upsert md v1"]
        );
        // Excluded after being indexed: deleted like a vanished file.
        let mut source =
            DirSource::new(root.to_path_buf(), "local".into(), 1 << 20, BTreeMap::new());
        assert_eq!(source.scan().len(), 5);
        let mut source = source.with_extensions(Extensions::new(&[], &["rs".to_string()]));
        assert_eq!(kinds(&source.scan()), vec!["delete lib.rs"]);
    }

    #[test]
    fn the_preview_window_decides_how_far_a_nul_byte_makes_a_file_binary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let mut late = "text before the NUL byte\n".repeat(400).into_bytes();
        assert!(late.len() > 9000);
        late[9000] = 0;
        std::fs::write(root.join("late.txt"), &late).unwrap();
        let mut early = b"text".to_vec();
        early.push(0);
        std::fs::write(root.join("early.txt"), &early).unwrap();
        let scan = |window: usize| {
            DirSource::new(root.to_path_buf(), "local".into(), 1 << 20, BTreeMap::new())
                .with_preview_window(window)
                .scan()
        };
        // The default 8 KiB does not reach byte 9000: the file is text (the NUL stays in it).
        assert_eq!(
            kinds(&scan(DEFAULT_PREVIEW_WINDOW)),
            vec!["upsert late.txt v1"]
        );
        // A 16 KiB window sees it: both files are skipped as binary.
        assert!(scan(16 << 10).is_empty());
        // A window too short for the early NUL reads that file too.
        assert_eq!(
            kinds(&scan(4)),
            vec!["upsert early.txt v1", "upsert late.txt v1"]
        );
    }

    #[test]
    fn jsonl_lines_decode_or_dead_letter_with_line_numbers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("events.jsonl");
        std::fs::write(
            &path,
            "{\"tenant\":\"t\",\"doc_id\":\"a\",\"version\":1,\"text\":\"x\"}\n\n{broken\n",
        )
        .unwrap();
        let ops = read_jsonl(&path, &DecodeConfig::default()).expect("read");
        assert_eq!(ops.len(), 2);
        assert!(ops[0].is_ok());
        let record = ops[1].as_ref().unwrap_err();
        assert_eq!(record.reason, crate::ingest::dlq::DlqReason::MalformedJson);
        assert!(
            record.origin.to_string().ends_with("events.jsonl:3"),
            "{}",
            record.origin
        );
    }
}
