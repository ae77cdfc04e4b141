//! IndexCheckpoint: how far into each partition of the documents topic an embedded index has got.
//!
//! The consumer group's committed offsets say how far the *group* got. With the embedded index each
//! job instance has its own index, so when a partition moves to another instance (a rebalance) and
//! later comes back, the group's offset has moved past events this index never saw: resuming there
//! would lose their upserts and leave the chunks they retracted stale. The checkpoint is this index's
//! own position, written next to the shards after every acknowledged batch (offsets are recorded only
//! once the index flushed what precedes them), and a partition assigned to the source starts from it
//! (see `kafka_source`); a partition the index never consumed starts from the group's offset.
//!
//! The file is replaced atomically (write, fsync, rename), and positions only move forward. A crash
//! between the index write and the checkpoint write leaves the checkpoint behind: the tail is replayed
//! into an idempotent, version-guarded index. With the Qdrant server backend the index is shared by
//! every instance and the group's offsets are its checkpoint, so no file is kept.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Errors reading or writing a checkpoint file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file could not be read or written.
    #[error("index checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a checkpoint of this topic.
    #[error("index checkpoint {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Stored {
    topic: String,
    /// Partition → next offset to consume.
    partitions: BTreeMap<i32, i64>,
}

/// The index's position per partition of one topic, shared by the workers of a process.
#[derive(Debug)]
pub struct IndexCheckpoint {
    path: PathBuf,
    state: Mutex<Stored>,
}

impl IndexCheckpoint {
    /// Opens the checkpoint of `topic` in the index directory `dir` (empty when there is none yet).
    pub fn open(dir: &Path, topic: &str) -> Result<Self, CheckpointError> {
        let path = dir.join(format!("checkpoint-{topic}.json"));
        let state = match std::fs::read(&path) {
            Ok(bytes) => {
                let stored: Stored =
                    serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Invalid {
                        path: path.clone(),
                        message: e.to_string(),
                    })?;
                if stored.topic != topic {
                    return Err(CheckpointError::Invalid {
                        path,
                        message: format!("holds topic {:?}, not {topic:?}", stored.topic),
                    });
                }
                stored
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Stored {
                topic: topic.to_string(),
                partitions: BTreeMap::new(),
            },
            Err(source) => return Err(CheckpointError::Io { path, source }),
        };
        Ok(Self {
            path,
            state: Mutex::new(state),
        })
    }

    /// The next offset of `partition` this index has not consumed, if it ever consumed any.
    pub fn next_offset(&self, partition: i32) -> Option<i64> {
        self.state
            .lock()
            .expect("checkpoint lock")
            .partitions
            .get(&partition)
            .copied()
    }

    /// Records that everything before `next` is in the index, for each `(partition, next)`, and
    /// persists the checkpoint when it moved. Positions never move backwards.
    pub fn advance(&self, positions: &[(i32, i64)]) -> Result<(), CheckpointError> {
        let mut state = self.state.lock().expect("checkpoint lock");
        let mut moved = false;
        for &(partition, next) in positions {
            let entry = state.partitions.entry(partition).or_insert(-1);
            if next > *entry {
                *entry = next;
                moved = true;
            }
        }
        if !moved {
            return Ok(());
        }
        let io = |source| CheckpointError::Io {
            path: self.path.clone(),
            source,
        };
        let temporary = self.path.with_extension("json.tmp");
        let mut file = std::fs::File::create(&temporary).map_err(io)?;
        file.write_all(&serde_json::to_vec(&*state).expect("serialisable"))
            .map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&temporary, &self.path).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_persist_move_only_forward_and_belong_to_one_topic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let checkpoint = IndexCheckpoint::open(dir.path(), "docs").expect("open");
        assert_eq!(checkpoint.next_offset(0), None, "never consumed");
        checkpoint.advance(&[(0, 10), (1, 4)]).expect("advance");
        checkpoint.advance(&[(0, 7), (1, 9)]).expect("advance");
        let reopened = IndexCheckpoint::open(dir.path(), "docs").expect("reopen");
        assert_eq!(reopened.next_offset(0), Some(10), "never backwards");
        assert_eq!(reopened.next_offset(1), Some(9));
        assert_eq!(reopened.next_offset(2), None);
        std::fs::rename(
            dir.path().join("checkpoint-docs.json"),
            dir.path().join("checkpoint-other.json"),
        )
        .expect("rename");
        let error = IndexCheckpoint::open(dir.path(), "other").expect_err("wrong topic");
        assert!(
            error.to_string().contains("holds topic \"docs\""),
            "{error}"
        );
    }
}
