//! The direct sink: appends each batch to a file at once. At-least-once,
//! and the baseline for latency comparisons: a record is visible as soon
//! as the `write` call for its batch returns.
//!
//! Subtask `i` appends to `part-<i><suffix>` in the target folder, one
//! `write` system call per batch of whole lines (`direct.write`). At each
//! barrier and at the end the file is fsynced (`direct.fsync`), so that a
//! completed checkpoint never depends on lines a crash could lose; nothing
//! is fsynced per batch.
//!
//! After a failure the source replays from the checkpoint and the lines
//! written since then appear again: duplicates, never losses. A crash can
//! also cut the last line short; when the sink opens the file again it
//! removes a trailing partial line (everything after the last `\n`), so
//! the file only ever gains whole lines from this sink.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::marker::PhantomData;
use std::path::PathBuf;

use weir_core::{BoxError, Sink, SinkContext};

use crate::error::IoContext;
use crate::fsutil::{create_dir_durable, fault};
use crate::Result;

/// Fault point before a batch is written.
pub const FAULT_WRITE: &str = "direct.write";
/// Fault point before the file is fsynced.
pub const FAULT_FSYNC: &str = "direct.fsync";

/// Every fault point of [`DirectFileSink`].
pub const DIRECT_FAULT_POINTS: &[&str] = &[FAULT_WRITE, FAULT_FSYNC];

/// Bytes examined from the end of the file, per step, for a partial line.
const TAIL_STEP: u64 = 64 << 10;

/// One subtask of the direct file sink; see the module docs.
///
/// ```
/// use weir_core::harness::Harness;
/// use weir_io::DirectFileSink;
///
/// let dir = tempfile::tempdir().unwrap();
/// let encode = |r: &u8, out: &mut Vec<u8>| out.extend_from_slice(format!("{r}\n").as_bytes());
/// let mut sink = DirectFileSink::new(dir.path(), 0, encode, |_: &u8| 0);
/// Harness::new(0, 1).write_sink(&mut sink, &mut vec![1, 2]).unwrap();
/// // Visible at once, before any checkpoint.
/// assert_eq!(std::fs::read_to_string(sink.path()).unwrap(), "1\n2\n");
/// ```
pub struct DirectFileSink<T, F, E> {
    path: PathBuf,
    encode: F,
    emitted_ns: E,
    file: Option<File>,
    buf: Vec<u8>,
    /// Written since the last fsync.
    dirty: bool,
    _records: PhantomData<fn(&T)>,
}

impl<T, F, E> DirectFileSink<T, F, E>
where
    F: Fn(&T, &mut Vec<u8>),
    E: Fn(&T) -> u64,
{
    /// The sink of `subtask`, appending to `part-<subtask>.csv` in `dir`.
    /// `encode(record, out)` appends a record's line and its `\n`;
    /// `emitted_ns(record)` gives its emission time (0: unknown).
    pub fn new(dir: impl Into<PathBuf>, subtask: usize, encode: F, emitted_ns: E) -> Self {
        let path = dir.into().join(format!("part-{subtask:03}.csv"));
        DirectFileSink {
            path,
            encode,
            emitted_ns,
            file: None,
            buf: Vec::new(),
            dirty: false,
            _records: PhantomData,
        }
    }

    /// The file this subtask appends to.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    fn file(&mut self) -> Result<&mut File> {
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                create_dir_durable(dir)?;
            }
            let mut f = OpenOptions::new()
                .read(true)
                .append(true)
                .create(true)
                .open(&self.path)
                .ctx("open for appending", &self.path)?;
            let whole = whole_lines_len(&mut f).ctx("read the end of", &self.path)?;
            let len = f.metadata().ctx("stat", &self.path)?.len();
            if whole < len {
                // A line cut short by a crash: remove it, durably.
                f.set_len(whole)
                    .and_then(|_| weir_core::disk::sync_all(&f))
                    .ctx("cut a partial last line from", &self.path)?;
            }
            self.file = Some(f);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    fn sync(&mut self) -> Result<()> {
        if self.dirty {
            fault(FAULT_FSYNC, "fsync", &self.path)?;
            let path = self.path.clone();
            weir_core::disk::sync_data(self.file()?).ctx("fsync", &path)?;
            self.dirty = false;
        }
        Ok(())
    }
}

/// Length of the file up to and including its last `\n` (0 if none).
fn whole_lines_len(f: &mut File) -> std::io::Result<u64> {
    let len = f.metadata()?.len();
    let mut end = len;
    let mut chunk = Vec::new();
    while end > 0 {
        let start = end.saturating_sub(TAIL_STEP);
        chunk.resize((end - start) as usize, 0);
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut chunk)?;
        if let Some(i) = memchr::memrchr(b'\n', &chunk) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

impl<T, F, E> Sink<T> for DirectFileSink<T, F, E>
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Send + 'static,
    E: Fn(&T) -> u64 + Send + 'static,
{
    fn write(&mut self, batch: &mut Vec<T>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.buf.clear();
        for r in batch.iter() {
            (self.encode)(r, &mut self.buf);
        }
        fault(FAULT_WRITE, "append to", &self.path)?;
        let path = self.path.clone();
        let buf = std::mem::take(&mut self.buf);
        let written = self.file()?.write_all(&buf).ctx("append to", &path);
        self.buf = buf;
        written?;
        self.dirty = true;
        // Visible now.
        crate::latency::record_visible(ctx, batch, &self.emitted_ns);
        batch.clear();
        Ok(())
    }

    fn finish(&mut self, _ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        Ok(self.sync()?)
    }

    fn pre_commit(&mut self, _checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        self.sync()?;
        Ok(Vec::new())
    }

    fn restore(&mut self, _checkpoint: u64, _state: &[u8]) -> Result<(), BoxError> {
        // At-least-once: keep what is there (whole lines), append the replay.
        self.file = None;
        self.file()?;
        Ok(())
    }
}
