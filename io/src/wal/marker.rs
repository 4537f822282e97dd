//! The commit marker of a WAL sink subtask: the last committed epoch and
//! the log position where its records end.
//!
//! The marker file holds two 40-byte slots; writes alternate between them
//! and each is fsynced, so a write torn by a crash damages only the slot
//! being written while the other still holds the previous marker. A
//! reader takes the valid slot with the higher write counter. Slot layout
//! (little-endian):
//!
//! ```text
//! crc32 u32 (of bytes 4..40) | magic "WMK1" | counter u64 | epoch u64 | seg u64 | off u64
//! ```
//!
//! Both slots damaged is corruption and is reported; an all-zero slot was
//! never written. The file is created zeroed before the first marker is
//! written into it: under a temporary name, fsynced, renamed into place,
//! its folder fsynced (a crash mid-creation leaves no marker, never a
//! short one).

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use weir_core::vfs::{File, OpenOptions};

use super::codec::WalPos;
use crate::error::IoContext;
use crate::fsutil::{fault, sync_dir};
use crate::{Error, Result};

/// Bytes of one slot.
const SLOT_BYTES: usize = 40;
const MAGIC: &[u8; 4] = b"WMK1";

/// Fault point before a marker slot is written and fsynced.
pub const FAULT_MARKER: &str = "wal.commit.marker";

/// A committed epoch and where its records end in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// Every epoch up to this one is committed.
    pub epoch: u64,
    /// End of the committed records; uncommitted ones start here.
    pub pos: WalPos,
}

/// The marker file of one sink subtask.
#[derive(Debug)]
pub(crate) struct Marker {
    path: PathBuf,
    file: Option<File>,
    /// Counter of the last slot written or read.
    counter: u64,
}

enum Slot {
    Empty,
    Valid(u64, Committed),
    Bad(String),
}

fn decode_slot(b: &[u8]) -> Slot {
    if b.iter().all(|&x| x == 0) {
        return Slot::Empty;
    }
    let stored = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let actual = crc32fast::hash(&b[4..SLOT_BYTES]);
    if stored != actual || &b[4..8] != MAGIC {
        return Slot::Bad(format!(
            "marker slot CRC mismatch: stored {stored:#010x}, computed {actual:#010x}"
        ));
    }
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    Slot::Valid(
        u64_at(8),
        Committed {
            epoch: u64_at(16),
            pos: WalPos {
                seg: u64_at(24),
                off: u64_at(32),
            },
        },
    )
}

/// What [`decode_marker`] read: the valid slot with the higher write
/// counter, and a damaged slot it went on without.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decoded {
    /// `(counter, committed)`; `None` if no commit was ever recorded.
    pub(crate) best: Option<(u64, Committed)>,
    /// A slot that failed its check while the other one was used (or
    /// never written): the byte it starts at and why. Torn by a crash, or
    /// damaged; either way it is reported, never used.
    pub(crate) skipped: Option<(u64, String)>,
}

/// Decodes a marker file's bytes (see [`Decoded`]). A wrong size or two
/// damaged slots is an error with the byte position to blame. Allocates
/// nothing but the messages.
pub(crate) fn decode_marker(bytes: &[u8]) -> std::result::Result<Decoded, (u64, String)> {
    if bytes.len() != 2 * SLOT_BYTES {
        let size = if bytes.len() > 2 * SLOT_BYTES {
            format!("over {}", 2 * SLOT_BYTES)
        } else {
            bytes.len().to_string()
        };
        return Err((
            bytes.len().min(2 * SLOT_BYTES) as u64,
            format!("file is {size} bytes, expected {}", 2 * SLOT_BYTES),
        ));
    }
    let a = decode_slot(&bytes[..SLOT_BYTES]);
    let b = decode_slot(&bytes[SLOT_BYTES..]);
    let decoded = |best, skipped| Ok(Decoded { best, skipped });
    let at_b = SLOT_BYTES as u64;
    match (a, b) {
        (Slot::Valid(ca, va), Slot::Valid(cb, vb)) => decoded(Some(if ca >= cb { (ca, va) } else { (cb, vb) }), None),
        (Slot::Valid(c, v), Slot::Bad(r)) => decoded(Some((c, v)), Some((at_b, r))),
        (Slot::Bad(r), Slot::Valid(c, v)) => decoded(Some((c, v)), Some((0, r))),
        (Slot::Valid(c, v), Slot::Empty) | (Slot::Empty, Slot::Valid(c, v)) => decoded(Some((c, v)), None),
        (Slot::Empty, Slot::Empty) => decoded(None, None),
        // The very first write was torn by a crash before its fsync
        // returned: no commit was recorded.
        (Slot::Empty, Slot::Bad(r)) => decoded(None, Some((at_b, r))),
        (Slot::Bad(r), Slot::Empty) => decoded(None, Some((0, r))),
        (Slot::Bad(reason), Slot::Bad(_)) => Err((0, format!("both slots damaged: {reason}"))),
    }
}

impl Marker {
    /// Reads the marker at `path` and makes it durable; `None` if there is
    /// none yet.
    #[cfg(test)]
    pub(crate) fn open(path: PathBuf) -> Result<(Self, Option<Committed>)> {
        Self::read(path, true)
    }

    /// [`Marker::open`], the marker made durable first only with `sync`:
    /// without, for a caller that knows this process wrote it durably
    /// (see [`super::target::EpochTarget::open_again`]).
    pub(crate) fn read(path: PathBuf, sync: bool) -> Result<(Self, Option<Committed>)> {
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                // A marker is 80 bytes: a longer file is not read whole.
                Read::by_ref(&mut f)
                    .take(2 * SLOT_BYTES as u64 + 1)
                    .read_to_end(&mut bytes)
                    .ctx("read", &path)?;
                // What was read may never have reached the disk: an earlier
                // process may have stopped, or seen its fsync fail, after
                // writing it. The caller acts on it (deletes the log before
                // it, counts output as committed), so it is made durable
                // first. Its folder entry: the caller synced the folder
                // (`create_dir_durable` syncs one that exists, too).
                if sync {
                    f.sync_data().ctx("fsync commit marker", &path)?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((
                    Marker {
                        path,
                        file: None,
                        counter: 0,
                    },
                    None,
                ))
            }
            Err(e) => return Err(Error::io("open", &path, e)),
        }
        let Decoded { best, skipped } =
            decode_marker(&bytes).map_err(|(at, reason)| Error::corrupt("commit marker", &path, at, reason))?;
        if let Some((at, reason)) = skipped {
            weir_core::corruption::report(
                &path,
                at,
                &format!(
                    "commit marker {}: the slot at byte {at} does not verify ({reason}), torn by a crash or damaged: {}",
                    path.display(),
                    if best.is_some() {
                        "the other slot's marker is used"
                    } else {
                        "the other slot was never written, so no commit is recorded"
                    }
                ),
            );
        }
        let counter = best.map_or(0, |(c, _)| c);
        Ok((
            Marker {
                path,
                file: None,
                counter,
            },
            best.map(|(_, v)| v),
        ))
    }

    /// Durably records `value`.
    pub(crate) fn write(&mut self, value: Committed) -> Result<()> {
        if self.file.is_none() {
            self.file = Some(self.open_for_write()?);
        }
        let file = self.file.as_mut().expect("opened above");
        self.counter += 1;
        let mut slot = [0u8; SLOT_BYTES];
        slot[4..8].copy_from_slice(MAGIC);
        slot[8..16].copy_from_slice(&self.counter.to_le_bytes());
        slot[16..24].copy_from_slice(&value.epoch.to_le_bytes());
        slot[24..32].copy_from_slice(&value.pos.seg.to_le_bytes());
        slot[32..40].copy_from_slice(&value.pos.off.to_le_bytes());
        let crc = crc32fast::hash(&slot[4..]);
        slot[0..4].copy_from_slice(&crc.to_le_bytes());
        let at = (self.counter % 2) * SLOT_BYTES as u64;
        fault(FAULT_MARKER, "write commit marker", &self.path)?;
        file.seek(SeekFrom::Start(at))
            .and_then(|_| file.write_all(&slot))
            .and_then(|_| file.sync_data())
            .ctx("write commit marker", &self.path)
    }

    /// Opens the marker file, creating it zeroed and durable if absent:
    /// written in full under a temporary name, fsynced, renamed into place
    /// and the folder fsynced, so a crash at any instant leaves either no
    /// marker file or a whole zeroed one (never a short file).
    fn open_for_write(&self) -> Result<File> {
        if let Ok(f) = OpenOptions::new().write(true).open(&self.path) {
            return Ok(f);
        }
        let temp = self.path.with_extension("tmp");
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temp)
            .ctx("create", &temp)?;
        f.write_all(&[0; 2 * SLOT_BYTES])
            .and_then(|_| f.sync_all())
            .ctx("initialize", &temp)?;
        drop(f);
        weir_core::vfs::rename(&temp, &self.path).ctx(&format!("rename to {}", self.path.display()), &temp)?;
        sync_dir(self.path.parent().unwrap_or(Path::new(".")), FAULT_MARKER)?;
        OpenOptions::new().write(true).open(&self.path).ctx("open", &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(epoch: u64) -> Committed {
        Committed {
            epoch,
            pos: WalPos { seg: epoch, off: 100 },
        }
    }

    #[test]
    fn latest_write_wins_and_a_torn_slot_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("committed");
        let (mut m, none) = Marker::open(path.clone()).unwrap();
        assert_eq!(none, None);
        for e in 1..=3 {
            m.write(value(e)).unwrap();
            assert_eq!(Marker::open(path.clone()).unwrap().1, Some(value(e)));
        }
        // Write 3 went to slot 1; tear it: the marker is write 2's.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[SLOT_BYTES + 20] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (mut m, v) = Marker::open(path.clone()).unwrap();
        assert_eq!(v, Some(value(2)));
        assert_slot_reported(&path, SLOT_BYTES as u64);
        // Writing goes on after the torn slot.
        m.write(value(4)).unwrap();
        assert_eq!(Marker::open(path.clone()).unwrap().1, Some(value(4)));
        // Both slots damaged: reported with the file.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[10] ^= 1;
        bytes[SLOT_BYTES + 10] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = Marker::open(path.clone()).unwrap_err().to_string();
        assert!(e.contains("commit marker") && e.contains("committed"), "{e}");
    }

    #[test]
    fn a_torn_first_write_means_no_marker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("committed");
        let mut bytes = vec![0u8; 2 * SLOT_BYTES];
        bytes[SLOT_BYTES + 3] = 7;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(Marker::open(path.clone()).unwrap().1, None);
        assert_slot_reported(&path, SLOT_BYTES as u64);
    }

    /// Every bit of a marker flipped, one at a time, with both slots
    /// written (counters 2 and 3) and with one (counter 1, the other slot
    /// zero). The flipped bit's slot always fails its check (CRC32 catches
    /// every single-bit error; an all-zero slot with a bit set is not
    /// zero): it is skipped, reported from its first byte (at or before
    /// the flipped one), and never used: what is read is exactly what the
    /// other slot alone gives, as if the damaged one had never been
    /// written. Then every cut and a byte appended: an error at the cut.
    #[test]
    fn every_flipped_bit_is_in_a_slot_reported_at_or_before_it_and_never_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("committed");
        let (mut m, _) = Marker::open(path.clone()).unwrap();
        m.write(value(1)).unwrap();
        let one = std::fs::read(&path).unwrap();
        m.write(value(2)).unwrap();
        m.write(value(3)).unwrap();
        let both = std::fs::read(&path).unwrap();
        assert_eq!(decode_marker(&one).unwrap().best, Some((1, value(1))));
        assert_eq!(decode_marker(&both).unwrap().best, Some((3, value(3))));
        for bytes in [one, both] {
            for (i, bit, b) in weir_core::fuzzing::bit_flips(&bytes) {
                let slot = i / SLOT_BYTES * SLOT_BYTES;
                let mut without = bytes.clone();
                without[slot..slot + SLOT_BYTES].fill(0);
                let d =
                    decode_marker(&b).unwrap_or_else(|(at, e)| panic!("flip of bit {bit} at {i}: error at {at}: {e}"));
                assert_eq!(d.skipped.map(|s| s.0), Some(slot as u64), "flip of bit {bit} at {i}");
                assert_eq!(
                    d.best,
                    decode_marker(&without).unwrap().best,
                    "flip of bit {bit} at {i}"
                );
            }
            for len in 0..bytes.len() {
                let (at, _) = decode_marker(&bytes[..len]).unwrap_err();
                assert_eq!(at, len as u64, "cut at {len}");
            }
            let (at, _) = decode_marker(&[&bytes[..], &[0]].concat()).unwrap_err();
            assert_eq!(at, 2 * SLOT_BYTES as u64, "a byte appended");
        }
    }

    /// The slot at byte `at` of the marker at `path` was reported as
    /// damaged (`weir_core::corruption::report`), naming the file.
    fn assert_slot_reported(path: &Path, at: u64) {
        let reports = weir_core::corruption::recent_under(path);
        let r = reports.last().expect("the damaged slot is reported");
        assert_eq!(r.offset, at, "{r:?}");
        assert!(
            r.what.contains(&*path.to_string_lossy()) && r.what.contains("slot"),
            "{r:?}"
        );
    }

    /// Found by the storage simulation (WAL seed 8): a marker whose fsync
    /// failed in one process was read by the next, which deleted the log
    /// segments before it; a crash then brought the older marker back,
    /// naming deleted segments. A marker read back is made durable before
    /// anyone acts on it.
    #[test]
    fn a_marker_read_back_survives_a_crash() {
        use std::sync::Arc;
        use weir_core::vfs::sim::{Faults, SimFs};
        let real = tempfile::tempdir().unwrap();
        let (mut m, _) = Marker::open(real.path().join("committed")).unwrap();
        m.write(value(3)).unwrap();
        let bytes = std::fs::read(real.path().join("committed")).unwrap();
        // Every seed decides the crash differently (data kept, lost, torn).
        for seed in 0..24 {
            let root = PathBuf::from(format!("/weir-sim-unit/marker-{seed}"));
            let fs = SimFs::new(&root, seed, Faults::default());
            weir_core::vfs::mount(&root, Arc::new(fs.clone()));
            let path = root.join("committed");
            // An earlier process wrote it and stopped before its fsync (the
            // folder entry is durable: the marker existed before).
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            f.write_all(&vec![0; bytes.len()]).unwrap();
            f.sync_data().unwrap();
            sync_dir(&root, FAULT_MARKER).unwrap();
            f.seek(SeekFrom::Start(0)).unwrap();
            f.write_all(&bytes).unwrap();
            drop(f);
            assert_eq!(Marker::open(path.clone()).unwrap().1, Some(value(3)));
            fs.crash();
            let after = Marker::open(path.clone()).unwrap().1;
            weir_core::vfs::unmount(&root);
            assert_eq!(
                after,
                Some(value(3)),
                "seed {seed}: the marker read before the crash was lost"
            );
        }
    }
}
