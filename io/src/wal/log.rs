//! The log of one WAL sink subtask: segment files `<seq>.wal` (20-digit
//! sequence numbers, so name order is log order) in the subtask's folder.
//!
//! [`LogWriter`] appends frames through a buffer that is written out when
//! it reaches its limit and fsynced only by [`LogWriter::sync`], once per
//! checkpoint barrier (group commit). A segment is closed (fsynced) when it
//! reaches its size limit at a record boundary; a frame never spans two
//! segments.
//!
//! [`LogReader`] reads a range of positions back, verifying every segment
//! header and every frame; any damage inside the range is an error naming
//! the segment file and the byte offset.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::codec::{self, check_segment_header, segment_header, Decoded, WalPos, SEGMENT_HEADER_BYTES};
use crate::error::IoContext;
use crate::fsutil::{fault, list_names, sync_dir};
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

/// Appends frames to the log of one subtask.
#[derive(Debug)]
pub(crate) struct LogWriter {
    dir: PathBuf,
    subtask: u32,
    /// Sequence number of the segment being written.
    seq: u64,
    path: PathBuf,
    file: File,
    /// Bytes already written to `file`.
    written: u64,
    /// Frames not yet written; the sink encodes records straight into it.
    pub(crate) buf: Vec<u8>,
    /// `buf` is written out when it holds this many bytes.
    buf_limit: usize,
    /// A segment is closed once it holds this many bytes.
    segment_bytes: u64,
    /// Bytes written to `file` since its last fsync.
    file_dirty: bool,
    /// A segment was created since the folder's last fsync.
    dir_dirty: bool,
}

impl LogWriter {
    /// Creates segment `seq` (replacing any file of that name) and starts
    /// writing there.
    pub(crate) fn create(dir: &Path, subtask: u32, seq: u64, buf_limit: usize, segment_bytes: u64) -> Result<Self> {
        let path = segment_path(dir, seq);
        let file = create_segment(&path)?;
        let mut buf = Vec::with_capacity(buf_limit + (buf_limit >> 2));
        buf.extend_from_slice(&segment_header(seq, subtask));
        Ok(LogWriter {
            dir: dir.to_path_buf(),
            subtask,
            seq,
            path,
            file,
            written: 0,
            buf,
            buf_limit,
            segment_bytes,
            file_dirty: false,
            dir_dirty: true,
        })
    }

    /// The position after the last frame appended (written or buffered).
    #[inline]
    pub(crate) fn pos(&self) -> WalPos {
        WalPos {
            seg: self.seq,
            off: self.written + self.buf.len() as u64,
        }
    }

    /// Writes the buffer out if it is full, and closes the segment if it is.
    #[inline]
    pub(crate) fn maybe_flush(&mut self) -> Result<()> {
        if self.buf.len() >= self.buf_limit {
            self.flush()?;
            self.maybe_roll()?;
        }
        Ok(())
    }

    /// Closes the segment and starts the next one if the segment is full.
    pub(crate) fn maybe_roll(&mut self) -> Result<()> {
        if self.written + self.buf.len() as u64 >= self.segment_bytes {
            self.roll()?;
        }
        Ok(())
    }

    /// Writes the buffer to the segment (no fsync).
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        fault(FAULT_APPEND, "append to WAL segment", &self.path)?;
        self.file
            .write_all(&self.buf)
            .ctx("append to WAL segment", &self.path)?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        self.file_dirty = true;
        Ok(())
    }

    #[cold]
    fn roll(&mut self) -> Result<()> {
        self.flush()?;
        fault(FAULT_ROLL, "close WAL segment", &self.path)?;
        if self.file_dirty {
            weir_core::disk::sync_data(&self.file).ctx("fsync WAL segment", &self.path)?;
        }
        let seq = self.seq + 1;
        let path = segment_path(&self.dir, seq);
        self.file = create_segment(&path)?;
        self.path = path;
        self.seq = seq;
        self.written = 0;
        self.file_dirty = false;
        self.dir_dirty = true;
        self.buf.extend_from_slice(&segment_header(seq, self.subtask));
        Ok(())
    }

    /// Makes everything appended so far durable: writes the buffer, fsyncs
    /// the segment and, if segments were created, the folder. Does nothing
    /// if nothing changed since the last sync.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.flush()?;
        if self.file_dirty {
            fault(FAULT_FSYNC, "fsync WAL segment", &self.path)?;
            weir_core::disk::sync_data(&self.file).ctx("fsync WAL segment", &self.path)?;
            self.file_dirty = false;
        }
        if self.dir_dirty {
            sync_dir(&self.dir, FAULT_FSYNC)?;
            self.dir_dirty = false;
        }
        Ok(())
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

    /// Decodes frames from `start` up to `end` of an open segment.
    fn scan(
        &mut self,
        path: &Path,
        file: &mut File,
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

fn read_some(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match file.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
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
