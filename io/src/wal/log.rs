//! The log of one WAL sink subtask: segment files `<seq>.wal` (20-digit
//! sequence numbers, so name order is log order) in the subtask's folder.
//!
//! [`LogIo`] is the log thread's handler (see
//! [`weir_core::io_thread`]): the sink's worker encodes frames into
//! buffers and decides where they go (segment, rolls); the thread writes
//! each buffer to its segment (creating it with its header), fsyncs a
//! segment it closes (the roll) and, at a barrier, fsyncs the open segment
//! and the folder (one group commit per epoch). A frame never spans two
//! segments.
//!
//! [`LogReader`] reads a range of positions back, verifying every segment
//! header and every frame; any damage inside the range is an error naming
//! the segment file and the byte offset.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use weir_core::vfs::{File, OpenOptions};

use weir_core::io_thread::IoHandler;
use weir_core::{BoxError, SyncJob};

use super::codec::{self, check_segment_header, segment_header, Decoded, WalPos, SEGMENT_HEADER_BYTES};
use crate::error::IoContext;
use crate::fsutil::{create_dir_durable, fault, list_names, remove_if_exists, sync_dir};
use crate::{Error, Result};

/// Fault point before a buffer of frames is written to a segment.
pub const FAULT_APPEND: &str = "wal.append";
/// Fault point before the log is fsynced at a barrier.
pub const FAULT_FSYNC: &str = "wal.fsync";
/// Fault point before a full segment is closed and the next one created.
pub const FAULT_ROLL: &str = "wal.roll";

/// Bytes read from a segment at once when reading back: 4 MiB.
const READ_CHUNK: usize = 4 << 20;

/// Path of segment `seq` in `dir`.
pub(crate) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.wal"))
}

/// Sequence numbers of the segments in `dir`, ascending.
pub(crate) fn list_segments(dir: &Path) -> Result<Vec<u64>> {
    let mut seqs: Vec<u64> = list_names(dir)?
        .iter()
        .filter_map(|n| n.strip_suffix(".wal"))
        .filter(|s| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|s| s.parse().ok())
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

/// What the sink's worker asks of its log thread ([`LogIo`]).
pub(crate) enum LogRequest {
    /// The log half of a start without a checkpoint, once `after` (the
    /// committer's half, which checks the marker) succeeded: create the
    /// log folder durably, delete leftover segments, fsync the folder.
    Start { after: SyncJob },
    /// Append `buf` (whole frames, unsealed: the thread writes their CRCs,
    /// [`codec::seal_frames`]) to segment `seq`, creating it (with its
    /// header) if it is not the open one; `close`: fsync and close it
    /// afterwards (the roll: the next append goes to `seq + 1`).
    Append { seq: u64, buf: Vec<u8>, close: bool },
    /// Make everything appended so far durable: fdatasync the open
    /// segment if it was written since the last sync, and the folder if a
    /// segment was created since. At the barrier of `checkpoint` (`None`:
    /// at the end).
    Sync { checkpoint: Option<u64> },
}

/// What the log thread hands back, in request order.
pub(crate) enum LogReply {
    Started,
    /// The buffer, cleared for reuse, and the bytes it held.
    Appended {
        buf: Vec<u8>,
        len: usize,
    },
    Synced,
}

/// The log thread of one WAL sink subtask: owns the open segment and does
/// every write and sync of the log. It keeps no position of its own: the
/// worker decides where frames go (segment and rolls) and tells it.
#[derive(Debug)]
pub(crate) struct LogIo {
    dir: PathBuf,
    subtask: u32,
    /// The open segment (or the last one closed; 0 before the first):
    /// its sequence number, path and file.
    seq: u64,
    path: PathBuf,
    file: Option<File>,
    /// Bytes written to `file` since its last fsync.
    file_dirty: bool,
    /// A segment was created since the folder's last fsync.
    dir_dirty: bool,
}

impl LogIo {
    /// The log thread's handler for the log in `dir`; nothing is touched
    /// until the first request.
    pub(crate) fn new(dir: PathBuf, subtask: u32) -> Self {
        LogIo {
            path: dir.clone(),
            dir,
            subtask,
            seq: 0,
            file: None,
            file_dirty: false,
            dir_dirty: false,
        }
    }

    /// The log half of a fresh start; see [`LogRequest::Start`].
    fn start(&mut self) -> Result<()> {
        create_dir_durable(&self.dir)?;
        let old = list_segments(&self.dir)?;
        for &seq in &old {
            remove_if_exists(&segment_path(&self.dir, seq))?;
        }
        if !old.is_empty() {
            sync_dir(&self.dir, super::FAULT_RESTORE_TRUNCATE)?;
        }
        Ok(())
    }

    fn append(&mut self, seq: u64, buf: &[u8], close: bool) -> Result<()> {
        if self.file.is_none() || self.seq != seq {
            let path = segment_path(&self.dir, seq);
            fault(FAULT_APPEND, "append to WAL segment", &path)?;
            if self.file.is_some() || seq <= self.seq {
                // The worker closes a segment before it moves on: a bug.
                return Err(Error::io(
                    "append to WAL segment",
                    &path,
                    std::io::Error::other(format!("segment {} is still open, or later than {seq}", self.seq)),
                ));
            }
            let mut file = create_segment(&path)?;
            file.write_all(&segment_header(seq, self.subtask))
                .ctx("append to WAL segment", &path)?;
            self.file = Some(file);
            self.seq = seq;
            self.path = path;
            self.file_dirty = true;
            self.dir_dirty = true;
        } else {
            fault(FAULT_APPEND, "append to WAL segment", &self.path)?;
        }
        let file = self.file.as_mut().expect("opened above");
        if !buf.is_empty() {
            file.write_all(buf).ctx("append to WAL segment", &self.path)?;
            self.file_dirty = true;
        }
        if close {
            fault(FAULT_ROLL, "close WAL segment", &self.path)?;
            if self.file_dirty {
                file.sync_data().ctx("fsync WAL segment", &self.path)?;
            }
            self.file = None;
            self.file_dirty = false;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        if self.file_dirty {
            if let Some(file) = &self.file {
                fault(FAULT_FSYNC, "fsync WAL segment", &self.path)?;
                file.sync_data().ctx("fsync WAL segment", &self.path)?;
            }
            self.file_dirty = false;
        }
        if self.dir_dirty {
            sync_dir(&self.dir, FAULT_FSYNC)?;
            self.dir_dirty = false;
        }
        Ok(())
    }
}

impl IoHandler for LogIo {
    type Request = LogRequest;
    type Reply = LogReply;

    fn handle(&mut self, request: LogRequest) -> std::result::Result<LogReply, BoxError> {
        match request {
            LogRequest::Start { after } => {
                // Never delete segments of a log whose target shows
                // committed output: the committer refuses such a start.
                after()?;
                self.start()?;
                Ok(LogReply::Started)
            }
            LogRequest::Append { seq, mut buf, close } => {
                // The worker leaves the frames' CRCs to this thread.
                codec::seal_frames(&mut buf);
                self.append(seq, &buf, close)?;
                let len = buf.len();
                buf.clear();
                Ok(LogReply::Appended { buf, len })
            }
            LogRequest::Sync { checkpoint } => {
                self.sync().map_err(|e| -> BoxError {
                    match checkpoint {
                        Some(n) => format!("WAL sink subtask {}, barrier of checkpoint {n}: {e}", self.subtask).into(),
                        None => format!("WAL sink subtask {}, at the end: {e}", self.subtask).into(),
                    }
                })?;
                Ok(LogReply::Synced)
            }
        }
    }
}

/// Where a scan of one segment stopped early: the offset of the first
/// frame that is not whole and verified, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stopped {
    pub(crate) offset: u64,
    pub(crate) reason: String,
}

/// Reads ranges of the log back, verifying them.
#[derive(Debug, Default)]
pub(crate) struct LogReader {
    buf: Vec<u8>,
}

impl LogReader {
    /// Calls `each(epoch, payload, end of frame)` for every frame in
    /// `[from, to)`, in order. Every byte of the range must be a verified
    /// frame; anything else is [`Error::Corrupt`] with file and offset.
    pub(crate) fn read_range(
        &mut self,
        dir: &Path,
        subtask: u32,
        from: WalPos,
        to: WalPos,
        mut each: impl FnMut(u64, &[u8], WalPos) -> Result<()>,
    ) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        for seq in from.seg..=to.seg {
            let path = segment_path(dir, seq);
            let (mut file, len) = open_segment(&path, seq, subtask)?;
            let start = if seq == from.seg {
                from.off.max(SEGMENT_HEADER_BYTES as u64)
            } else {
                SEGMENT_HEADER_BYTES as u64
            };
            let end = if seq == to.seg { to.off } else { len };
            if len < end {
                return Err(Error::corrupt(
                    "WAL segment",
                    &path,
                    len,
                    format!("the segment ends at byte {len}, before the durable position {end}: data was lost"),
                ));
            }
            if let Some(s) = self.scan(&path, &mut file, start, end, |e, p, off| {
                each(e, p, WalPos { seg: seq, off })
            })? {
                return Err(Error::corrupt("WAL record", &path, s.offset, s.reason));
            }
        }
        Ok(())
    }

    /// Scans segment `seq` from `start` to its end, counting whole frames;
    /// returns the frames, the bytes they take and where and why the scan
    /// stopped early (a torn tail, when this is the end of the log).
    pub(crate) fn scan_tail(
        &mut self,
        dir: &Path,
        subtask: u32,
        seq: u64,
        start: u64,
    ) -> Result<(u64, u64, Option<Stopped>)> {
        let path = segment_path(dir, seq);
        let (mut file, len) = open_segment(&path, seq, subtask)?;
        let mut frames = 0;
        let mut last_end = start;
        let stopped = self.scan(&path, &mut file, start, len, |_, _, end| {
            frames += 1;
            last_end = end;
            Ok(())
        })?;
        Ok((frames, last_end - start, stopped))
    }

    /// Decodes frames from `start` up to `end` of an open segment (any
    /// reader: a file, or bytes in memory for the fuzz tests). Its buffer
    /// grows only while one frame fills it, so it never holds more than
    /// twice the bytes read or [`READ_CHUNK`], whichever is more, up to one
    /// largest frame.
    pub(crate) fn scan<R: Read + Seek>(
        &mut self,
        path: &Path,
        file: &mut R,
        start: u64,
        end: u64,
        mut each: impl FnMut(u64, &[u8], u64) -> Result<()>,
    ) -> Result<Option<Stopped>> {
        if start >= end {
            return Ok(None);
        }
        // A buffer as large as the range, up to READ_CHUNK: small commits
        // (a short checkpoint interval) do not pay for a large buffer.
        let want = (end - start).min(READ_CHUNK as u64) as usize;
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        file.seek(SeekFrom::Start(start)).ctx("seek in WAL segment", path)?;
        // buf[lo..hi] holds the file bytes from offset `pos` on.
        let (mut lo, mut hi, mut pos) = (0usize, 0usize, start);
        while pos < end {
            match codec::decode_frame(&self.buf[lo..hi]) {
                Decoded::Frame { epoch, payload, size } => {
                    let next = pos + size as u64;
                    if next > end {
                        return Ok(Some(Stopped {
                            offset: pos,
                            reason: format!("record runs past the end position {end}"),
                        }));
                    }
                    each(epoch, payload, next)?;
                    lo += size;
                    pos = next;
                }
                Decoded::Incomplete => {
                    self.buf.copy_within(lo..hi, 0);
                    hi -= lo;
                    lo = 0;
                    if hi == self.buf.len() {
                        // One frame larger than the buffer: grow (bounded by the frame limit).
                        let grown = (self.buf.len() * 2).min(codec::HEADER_BYTES + codec::MAX_PAYLOAD_BYTES);
                        self.buf.resize(grown, 0);
                    }
                    let room = (self.buf.len() - hi) as u64;
                    let want = room.min(end - pos - hi as u64) as usize;
                    let n = if want == 0 {
                        0
                    } else {
                        read_some(file, &mut self.buf[hi..hi + want]).ctx("read WAL segment", path)?
                    };
                    if n == 0 {
                        return Ok(Some(Stopped {
                            offset: pos,
                            reason: format!(
                                "record cut short: {} bytes left before the end position {end}",
                                end - pos
                            ),
                        }));
                    }
                    hi += n;
                }
                Decoded::Corrupt(reason) => return Ok(Some(Stopped { offset: pos, reason })),
            }
        }
        Ok(None)
    }
}

fn read_some<R: Read>(file: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match file.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full<R: Read>(file: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match read_some(file, &mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn create_segment(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .ctx("create WAL segment", path)
}

/// Opens segment `seq` and checks its header; returns it and its length.
fn open_segment(path: &Path, seq: u64, subtask: u32) -> Result<(File, u64)> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::corrupt(
                "WAL segment",
                path,
                0,
                "the segment is missing, but uncommitted records are recorded in it",
            ))
        }
        Err(e) => return Err(Error::io("open WAL segment", path, e)),
    };
    let len = file.metadata().ctx("stat WAL segment", path)?.len();
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    let n = read_full(&mut file, &mut header).ctx("read WAL segment header", path)?;
    check_segment_header(&header[..n], seq, subtask).map_err(|r| Error::corrupt("WAL segment header", path, 0, r))?;
    Ok((file, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a restore does with the log after the restored checkpoint's
    /// end (`WalSink`'s restore, step 2): `scan_tail` from that end, the
    /// first frame that does not verify reported at its `Stopped::offset`
    /// and cut off with everything after it. Every bit of a segment
    /// flipped, one at a time:
    ///
    /// - in the segment header: an error naming the file (the restore
    ///   fails);
    /// - in a frame before the restored end: not read by the scan (the same
    ///   result as without the flip); `read_range` reads those bytes and
    ///   refuses damage there with an error naming the file;
    /// - in a frame after it: the scan stops at that frame's first byte
    ///   (at or before the flipped one), having passed exactly the whole
    ///   frames before it, which are cut off unused anyway.
    ///
    /// Then every cut at or after the restored end (a shorter segment is
    /// refused before the scan): the scan stops at or before the cut.
    #[test]
    fn every_flipped_bit_after_the_restored_end_stops_the_scan_at_or_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let (seq, subtask) = (2, 1);
        let path = segment_path(dir.path(), seq);
        let mut bytes = segment_header(seq, subtask).to_vec();
        let mut ends = Vec::new();
        for (epoch, records) in [(3, 2), (3, 0), (3, 5), (4, 1), (4, 12), (5, 3)] {
            let payload: String = (0..records).map(|r| format!("{epoch},key-{r},{}\n", r * 37)).collect();
            codec::encode_frame(&mut bytes, epoch, payload.as_bytes()).unwrap();
            ends.push(bytes.len() as u64);
        }
        let (start, len) = (ends[2], bytes.len() as u64);
        let scan = |b: &[u8]| {
            std::fs::write(&path, b).unwrap();
            LogReader::default().scan_tail(dir.path(), subtask, seq, start)
        };
        // The end of the last whole frame at or before byte `at` (>= start).
        let frame_end = |at: u64| ends.iter().copied().filter(|&e| e <= at).max().unwrap_or(start);
        let whole = scan(&bytes).unwrap();
        assert_eq!(whole, (3, len - start, None));
        for (i, bit, b) in weir_core::fuzzing::bit_flips(&bytes) {
            let flip = format!("flip of bit {bit} at {i}");
            let i = i as u64;
            if i < SEGMENT_HEADER_BYTES as u64 {
                let e = scan(&b).unwrap_err().to_string();
                assert!(
                    e.contains(&*path.to_string_lossy()) && e.contains("at byte 0"),
                    "{flip}: {e}"
                );
            } else if i < start {
                assert_eq!(scan(&b).unwrap(), whole, "{flip}: read before the restored end");
            } else {
                let before = ends.iter().filter(|&&e| e > start && e <= i).count() as u64;
                let frame = frame_end(i);
                let (frames, valid, stopped) = scan(&b).unwrap();
                let stopped = stopped.unwrap_or_else(|| panic!("{flip}: not detected"));
                assert_eq!(
                    (frames, valid, stopped.offset),
                    (before, frame - start, frame),
                    "{flip}: {}",
                    stopped.reason
                );
            }
        }
        for cut in start..=len {
            let (_, valid, stopped) = scan(&bytes[..cut as usize]).unwrap();
            let whole_end = frame_end(cut);
            assert_eq!(start + valid, whole_end, "cut at {cut}");
            assert_eq!(
                stopped.map(|s| s.offset),
                (whole_end < cut).then_some(whole_end),
                "cut at {cut}"
            );
        }
    }
}
