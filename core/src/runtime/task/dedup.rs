//! Exactly-once by deduplication ([`CheckpointMode::Dedup`]): what an input
//! task keeps to drop replayed records and to recover alone.
//!
//! Rings are FIFO and have one producer each, so a record's id on an input
//! channel is its position in that channel: how many records the channel
//! delivered before it. A task needs no catalog of ids, only two numbers
//! per channel (16 bytes), taken at its snapshot for checkpoint `n`:
//!
//! - how many records the channel had delivered when barrier `n` came out
//!   of it, and
//! - how many it had delivered when the task snapshotted.
//!
//! Inputs are never blocked (as at-least-once), so the second can exceed the
//! first: those records are in the snapshot's state already. After a
//! restore from `n`, the producer replays from its own position at barrier
//! `n` (a source from its offset), and the task drops the difference
//! ([`Positions::skips`]) before anything of its chain sees a record.
//!
//! The task's upstream backup ([`Backup`]) keeps every record it took since
//! the snapshot of its last completed checkpoint, encoded, in the order it
//! took them, with the watermarks between them. It lives at the receiving
//! end of the rings, in the task's shell, which a failure of the task's
//! operators does not destroy: when the chain fails, the job builds a new
//! chain, restores it from the last completed checkpoint, and feeds it the
//! backup in the original order; no producer stops or replays. The backup is
//! bounded ([`crate::CheckpointConfig::dedup_backup_limit`]): past the bound it
//! lets go of everything until the task's next snapshot, and a failure
//! meanwhile restarts the whole job (see [`Backup::records`]).
//!
//! [`CheckpointMode::Dedup`]: crate::CheckpointMode::Dedup

use std::collections::VecDeque;

use serde::de::DeserializeOwned;

use crate::data::encode_into;
use crate::error::BoxError;

/// The operator index under which a task's channel positions are stored in
/// its task state (beside the operators' own states, which use indexes
/// from 0).
pub(crate) const POSITIONS_OP: u32 = u32::MAX - 1;

/// Per input channel: records delivered at the barrier, and at the
/// snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Positions {
    pub(crate) channels: Vec<(u64, u64)>,
}

impl Positions {
    pub(crate) fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("positions always encode")
    }

    /// The positions stored for a task with `inputs` channels at checkpoint
    /// `checkpoint`, checked.
    pub(crate) fn decode(bytes: &[u8], inputs: usize, checkpoint: u64) -> Result<Self, BoxError> {
        let p: Positions = postcard::from_bytes(bytes).map_err(|e| {
            format!(
                "checkpoint {checkpoint}: the task's channel positions ({} bytes) do not decode: {e}",
                bytes.len()
            )
        })?;
        if p.channels.len() != inputs {
            return Err(format!(
                "checkpoint {checkpoint}: channel positions for {} input channels, the task has {inputs}; \
                 a dedup checkpoint restores at the same parallelism",
                p.channels.len()
            )
            .into());
        }
        if let Some((i, (b, s))) = p.channels.iter().enumerate().find(|(_, (b, s))| s < b) {
            return Err(format!(
                "checkpoint {checkpoint}: input channel {i} delivered {s} records at the snapshot but {b} at the barrier"
            )
            .into());
        }
        Ok(p)
    }

    /// Per channel, the records a replay from the barrier must drop: those
    /// taken past the barrier before the snapshot.
    pub(crate) fn skips(&self) -> Vec<u64> {
        self.channels.iter().map(|(b, s)| s - b).collect()
    }
}

/// One entry of the backup, in the order the task took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    /// `count` records of input `input`, the first at position `first` of
    /// that channel, encoded in `bytes` bytes.
    Records {
        input: u32,
        first: u64,
        count: u32,
        bytes: u32,
    },
    /// A watermark read from input `input`.
    Watermark { input: u32, wm: i64 },
}

/// A snapshot's place in the backup: everything before it is in the
/// snapshot's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    checkpoint: u64,
    /// Items and bytes appended before it, counted from the task's start.
    items: u64,
    bytes: u64,
}

/// What a recovered chain is fed again: the records and watermarks the
/// failed one took since the restored checkpoint.
pub(crate) struct Replayed<T> {
    /// `(input, position in that channel, record)`, in the order taken.
    pub(crate) records: Vec<(u32, u64, T)>,
    /// Watermarks: `(records of `records` before it, input, watermark)`.
    pub(crate) watermarks: Vec<(usize, usize, i64)>,
}

/// An input task's upstream backup (see the module docs).
///
/// Invariants: `items` and `bytes` hold exactly what was appended after
/// `dropped_items` / `dropped_bytes`; marks are in increasing checkpoint
/// order and each lies within what is held.
pub(crate) struct Backup {
    bytes: Vec<u8>,
    items: VecDeque<Item>,
    marks: VecDeque<Mark>,
    dropped_items: u64,
    dropped_bytes: u64,
    /// Bytes held at most; past them the backup lets go of everything
    /// (see [`Backup::records`]).
    limit: usize,
    /// Records held.
    records: u64,
    /// The backup outgrew its limit and holds nothing until the task's
    /// next snapshot, which becomes its new base.
    overflowed: bool,
    /// Times the backup outgrew its limit.
    overflows: u64,
}

impl Backup {
    /// An empty backup whose base is checkpoint `base` (the one the task
    /// restored from, 0 for none), holding at most `limit` bytes.
    pub(crate) fn new(base: u64, limit: usize) -> Self {
        let mut marks = VecDeque::new();
        marks.push_back(Mark {
            checkpoint: base,
            items: 0,
            bytes: 0,
        });
        Backup {
            bytes: Vec::new(),
            items: VecDeque::new(),
            marks,
            dropped_items: 0,
            dropped_bytes: 0,
            limit: limit.max(1),
            records: 0,
            overflowed: false,
            overflows: 0,
        }
    }

    /// Appends records of `input` taken at positions `first..`.
    ///
    /// Past its limit the backup lets go of everything and keeps nothing
    /// until the task's next snapshot: the task cannot recover alone until
    /// that snapshot's checkpoint completes (a failure meanwhile restarts
    /// the whole job, which stays exactly-once by positions). The bound
    /// never stops the task from reading: a task that stopped would leave
    /// the next barrier behind the records in its rings, or in its
    /// producers' staging, and no checkpoint could complete to free it.
    pub(crate) fn records<T: serde::Serialize>(
        &mut self,
        input: usize,
        first: u64,
        records: &[T],
    ) -> Result<(), BoxError> {
        if records.is_empty() || self.overflowed {
            return Ok(());
        }
        let before = self.bytes.len();
        for r in records {
            encode_into(r, &mut self.bytes)
                .map_err(|e| format!("a record could not be kept in the dedup backup: {e}"))?;
        }
        let bytes = (self.bytes.len() - before) as u32;
        self.items.push_back(Item::Records {
            input: input as u32,
            first,
            count: records.len() as u32,
            bytes,
        });
        self.records += records.len() as u64;
        if self.bytes.len() > self.limit {
            self.overflow();
        }
        Ok(())
    }

    /// Lets go of everything held (see [`Backup::records`]).
    #[cold]
    fn overflow(&mut self) {
        self.dropped_items += self.items.len() as u64;
        self.dropped_bytes += self.bytes.len() as u64;
        self.items.clear();
        self.bytes = Vec::new();
        self.marks.clear();
        self.records = 0;
        self.overflowed = true;
        self.overflows += 1;
    }

    /// Times the backup outgrew its limit so far.
    pub(crate) fn overflows(&self) -> u64 {
        self.overflows
    }

    /// True from the moment the backup outgrew its limit until the task's
    /// next snapshot.
    #[cfg(test)]
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Appends a watermark read from `input`.
    pub(crate) fn watermark(&mut self, input: usize, wm: i64) {
        if self.overflowed {
            return;
        }
        self.items.push_back(Item::Watermark {
            input: input as u32,
            wm,
        });
    }

    /// Marks the task's snapshot for `checkpoint`.
    pub(crate) fn mark(&mut self, checkpoint: u64) {
        debug_assert!(self.marks.back().is_none_or(|m| m.checkpoint < checkpoint));
        // After an overflow this snapshot is the new base (nothing is held).
        self.overflowed = false;
        self.marks.push_back(Mark {
            checkpoint,
            items: self.dropped_items + self.items.len() as u64,
            bytes: self.dropped_bytes + self.bytes.len() as u64,
        });
    }

    /// Checkpoint `checkpoint` completed: drops what its snapshot holds.
    pub(crate) fn completed(&mut self, checkpoint: u64) {
        if self.marks.front().is_none_or(|m| m.checkpoint >= checkpoint) {
            // Nothing held before it: the common case, checked every turn.
            return;
        }
        let Some(k) = self.marks.iter().rposition(|m| m.checkpoint <= checkpoint) else {
            return;
        };
        let m = self.marks[k];
        self.marks.drain(..k);
        let items = (m.items - self.dropped_items) as usize;
        let bytes = (m.bytes - self.dropped_bytes) as usize;
        for it in self.items.drain(..items) {
            if let Item::Records { count, .. } = it {
                self.records -= u64::from(count);
            }
        }
        self.bytes.drain(..bytes);
        self.dropped_items = m.items;
        self.dropped_bytes = m.bytes;
    }

    /// The checkpoints a recovery can replay this backup from (see
    /// [`Backup::since`]): those of the snapshots it holds a mark of.
    /// Empty after an overflow, until the task's next snapshot.
    pub(crate) fn replayable_from(&self) -> Vec<u64> {
        self.marks.iter().map(|m| m.checkpoint).collect()
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Records held.
    pub(crate) fn held_records(&self) -> u64 {
        self.records
    }

    /// For a recovery from checkpoint `checkpoint`: forgets the marks of
    /// later snapshots (their checkpoints are aborted) and decodes what was
    /// taken since `checkpoint`'s snapshot, which stays held until a later
    /// checkpoint completes. An error if the backup does not reach back to
    /// that snapshot.
    pub(crate) fn since<T: DeserializeOwned>(&mut self, checkpoint: u64) -> Result<Replayed<T>, BoxError> {
        self.completed(checkpoint);
        match self.marks.front() {
            Some(m) if m.checkpoint == checkpoint => {}
            other => {
                let starts = other.map_or("at the task's next snapshot".to_string(), |m| {
                    format!("at checkpoint {}", m.checkpoint)
                });
                return Err(format!(
                    "the dedup backup starts {starts}, not at checkpoint {checkpoint}, the one restored: it \
                     outgrew CheckpointConfig::dedup_backup_limit since, so the task cannot recover alone and \
                     the whole job restarts instead"
                )
                .into());
            }
        }
        self.marks.truncate(1);
        let mut out = Replayed {
            records: Vec::with_capacity(self.records as usize),
            watermarks: Vec::new(),
        };
        let mut rest = &self.bytes[..];
        for it in &self.items {
            match *it {
                Item::Records {
                    input,
                    first,
                    count,
                    bytes,
                } => {
                    let (mut chunk, tail) = rest.split_at(bytes as usize);
                    rest = tail;
                    for k in 0..u64::from(count) {
                        let (r, more) = postcard::take_from_bytes::<T>(chunk).map_err(|e| {
                            format!(
                                "the dedup backup does not decode at input {input} position {}: {e}",
                                first + k
                            )
                        })?;
                        chunk = more;
                        out.records.push((input, first + k, r));
                    }
                }
                Item::Watermark { input, wm } => out.watermarks.push((out.records.len(), input as usize, wm)),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn positions_roundtrip_and_give_the_records_past_the_barrier() {
        let p = Positions {
            channels: vec![(10, 10), (3, 8)],
        };
        let back = Positions::decode(&p.encode(), 2, 5).unwrap();
        assert_eq!(back.skips(), vec![0, 5]);
        let e = Positions::decode(&p.encode(), 3, 5).unwrap_err().to_string();
        assert!(e.contains("2 input channels, the task has 3"), "{e}");
        let bad = Positions { channels: vec![(9, 4)] };
        let e = Positions::decode(&bad.encode(), 1, 5).unwrap_err().to_string();
        assert!(e.contains("input channel 0"), "{e}");
    }

    #[test]
    fn a_backup_holds_what_came_after_the_last_completed_snapshot() {
        let mut b = Backup::new(0, 1 << 20);
        b.records(0, 0, &[1u64, 2, 3]).unwrap();
        b.mark(1);
        b.watermark(1, 77);
        b.records(1, 0, &[10u64]).unwrap();
        b.mark(2);
        b.records(0, 3, &[4u64]).unwrap();
        b.completed(1);
        assert_eq!(b.held_records(), 2);
        // A recovery from 1 forgets mark 2 (aborted) and replays in order.
        let r = b.since::<u64>(1).unwrap();
        assert_eq!(r.records, vec![(1, 0, 10), (0, 3, 4)]);
        assert_eq!(r.watermarks, vec![(0, 1, 77)]);
        assert_eq!(b.replayable_from(), vec![1], "mark 2 forgotten");
        // Still held: the recovered chain has not completed a checkpoint.
        assert_eq!(b.held_records(), 2);
        assert!(b.since::<u64>(0).is_err(), "the backup no longer reaches back to 0");
    }

    #[test]
    fn past_its_limit_the_backup_lets_go_until_the_next_snapshot() {
        let mut b = Backup::new(0, 16);
        b.records(0, 0, &[u64::MAX; 2]).unwrap();
        assert!(
            b.overflowed() && b.bytes() == 0,
            "20 bytes over a 16-byte limit: all let go"
        );
        b.records(0, 2, &[1u64]).unwrap();
        b.watermark(0, 5);
        assert_eq!(b.bytes(), 0, "nothing kept until the next snapshot");
        let e = b.since::<u64>(0).err().unwrap().to_string();
        assert!(e.contains("next snapshot") && e.contains("whole job restarts"), "{e}");
        // What the job thread checks before it builds a replacement.
        assert!(b.replayable_from().is_empty());
        b.mark(1);
        assert_eq!(b.replayable_from(), vec![1]);
        assert!(!b.overflowed());
        b.records(0, 3, &[7u64]).unwrap();
        assert_eq!(
            b.since::<u64>(1).unwrap().records,
            vec![(0, 3, 7)],
            "kept again from the new base"
        );
        assert!(b.since::<u64>(0).is_err());
    }

    proptest! {
        /// Records appended in runs, snapshots marked between runs, and a
        /// completion and recovery at every mark: the replay is exactly the
        /// records after the recovered mark, in order, with their ids.
        #[test]
        fn recovery_replays_exactly_what_came_after_the_restored_snapshot(
            runs in proptest::collection::vec((0usize..3, 1usize..20, any::<bool>()), 1..40),
            pick in any::<prop::sample::Index>(),
        ) {
            let mut b = Backup::new(0, usize::MAX);
            let mut next = [0u64; 3];
            let mut all = Vec::new();
            let mut marks = vec![(0u64, 0usize)];
            let mut id = 0;
            for (input, n, mark) in runs {
                let recs: Vec<u64> = (0..n as u64).map(|k| next[input] * 7 + k).collect();
                b.records(input, next[input], &recs).unwrap();
                for (k, r) in recs.iter().enumerate() {
                    all.push((input as u32, next[input] + k as u64, *r));
                }
                next[input] += n as u64;
                if mark {
                    id += 1;
                    b.mark(id);
                    marks.push((id, all.len()));
                }
            }
            let (ck, at) = marks[pick.index(marks.len())];
            let replay = b.since::<u64>(ck).unwrap();
            prop_assert_eq!(replay.records, all[at..].to_vec());
        }
    }
}
