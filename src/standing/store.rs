//! Subscriptions kept across restarts: one file per subscription, `<id>.json` under
//! `standing.path`, holding what the subscription was made with and its latest version.
//!
//! Files are written by a thread of their own (the evaluator never waits on the disk), each as a
//! temporary file renamed over the old one, so a file is whole or absent even after a kill. A file
//! is written when a subscription is made and at each new version, and removed when it ends
//! (unsubscribed, expired, its credential withdrawn); a job stopping keeps them. Only the latest
//! version is kept on disk: after a restart a stream resumes from it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Version;

/// The layout of the files this code writes.
pub(super) const FORMAT: u32 = 1;
/// The largest file read back (a latest version of the largest budget is far smaller).
const MAX_FILE_BYTES: u64 = 16 << 20;
/// The longest subscription id kept (ids the job makes are 40 characters or fewer).
const MAX_ID_CHARS: usize = 128;

/// What a file holds, as written.
#[derive(Serialize)]
pub(super) struct Saved<'a> {
    pub format: u32,
    pub subscription_id: &'a str,
    pub tenant: &'a str,
    /// The name the subscription's credential is known by (its environment variable, never the
    /// token), so a restart can check that it still opens the query.
    pub credential: &'a str,
    pub query: &'a Map<String, Value>,
    pub min_interval_ms: u64,
    /// When it expires (ms since the epoch).
    pub expires_ms: u64,
    /// Its versions go to the contexts topic (made over Kafka).
    pub publish: bool,
    pub latest: &'a Version,
}

/// What a file holds, as read back.
#[derive(Deserialize)]
pub(super) struct Restored {
    pub format: u32,
    pub subscription_id: String,
    pub tenant: String,
    pub credential: String,
    pub query: Map<String, Value>,
    pub min_interval_ms: u64,
    pub expires_ms: u64,
    #[serde(default)]
    pub publish: bool,
    pub latest: Version,
}

enum Write {
    Save(String, Vec<u8>),
    Remove(String),
    /// Answered once the writes before it are done.
    Flush(mpsc::Sender<()>),
}

/// The directory of kept subscriptions and its writer thread.
pub(super) struct Store {
    dir: PathBuf,
    writes: Mutex<mpsc::Sender<Write>>,
}

/// Whether `id` can name a file: what the job makes, nothing a path could be built from.
pub(super) fn safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_CHARS
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
}

impl Store {
    /// Opens (creating) `dir` and starts its writer.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).map_err(|error| {
            anyhow::anyhow!(
                "cannot create {} for subscriptions (standing.path): {error}",
                dir.display()
            )
        })?;
        let (sender, receiver) = mpsc::channel::<Write>();
        let root = dir.to_path_buf();
        std::thread::Builder::new()
            .name("standing-store".into())
            .spawn(move || {
                for write in receiver {
                    let (id, done) = match write {
                        Write::Save(id, bytes) => {
                            let done = save(&root, &id, &bytes);
                            (id, done)
                        }
                        Write::Flush(done) => {
                            let _ = done.send(());
                            continue;
                        }
                        Write::Remove(id) => {
                            let done = match std::fs::remove_file(file(&root, &id)) {
                                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                                    Ok(())
                                }
                                other => other,
                            };
                            (id, done)
                        }
                    };
                    if let Err(error) = done {
                        tracing::warn!(subscription = %id, %error, "cannot keep a subscription on disk: it lives on in memory, not across a restart");
                    }
                }
            })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            writes: Mutex::new(sender),
        })
    }

    /// Writes a subscription's file (after the writes asked before).
    pub fn save(&self, saved: &Saved<'_>) {
        if !safe_id(saved.subscription_id) {
            return;
        }
        match serde_json::to_vec(saved) {
            Ok(bytes) => self.send(Write::Save(saved.subscription_id.to_string(), bytes)),
            Err(error) => {
                tracing::warn!(subscription = saved.subscription_id, %error, "cannot encode a subscription")
            }
        }
    }

    /// Removes a subscription's file.
    pub fn remove(&self, id: &str) {
        if safe_id(id) {
            self.send(Write::Remove(id.to_string()));
        }
    }

    /// Waits (at most `timeout`) until the writes asked so far are on disk.
    pub fn flush(&self, timeout: std::time::Duration) {
        let (done, flushed) = mpsc::channel();
        self.send(Write::Flush(done));
        let _ = flushed.recv_timeout(timeout);
    }

    fn send(&self, write: Write) {
        let _ = super::lock(&self.writes).send(write);
    }

    /// The subscriptions kept: each readable file of this format; the others are named in the log
    /// and left where they are.
    pub fn load(&self) -> Vec<Restored> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "cannot read the kept subscriptions");
                return Vec::new();
            }
        };
        let mut restored = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(id) = path
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.strip_suffix(".json"))
            else {
                continue;
            };
            match read(&path) {
                Ok(record) if record.format == FORMAT && record.subscription_id == id => {
                    restored.push(record)
                }
                Ok(record) => {
                    tracing::warn!(file = %path.display(), format = record.format, "not a subscription this version keeps: left as it is")
                }
                Err(error) => {
                    tracing::warn!(file = %path.display(), %error, "unreadable subscription file: left as it is")
                }
            }
        }
        restored.sort_by(|a, b| a.subscription_id.cmp(&b.subscription_id));
        restored
    }
}

/// The file of subscription `id` under `root`.
fn file(root: &Path, id: &str) -> PathBuf {
    root.join(format!("{id}.json"))
}

/// Writes `bytes` as `id`'s file: a temporary file first, renamed over the old one.
fn save(root: &Path, id: &str, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = root.join(format!(".{id}.json.tmp"));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, file(root, id))
}

/// Reads one file, at most [`MAX_FILE_BYTES`] of it.
fn read(path: &Path) -> anyhow::Result<Restored> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    anyhow::ensure!(
        bytes.len() as u64 <= MAX_FILE_BYTES,
        "larger than {MAX_FILE_BYTES} bytes"
    );
    Ok(serde_json::from_slice(&bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_could_leave_the_directory_are_not_files() {
        assert!(safe_id("sub-12-00ff00ff00ff00ff"));
        for bad in ["", "../x", "a/b", "a.json", "x\0", &"a".repeat(129)] {
            assert!(!safe_id(bad), "{bad:?}");
        }
    }
}
