//! The direct sink: appends each batch to a file at once. At-least-once,
//! and the baseline for latency comparisons: a record is visible as soon
//! as the `write` system call for its bytes returns.
//!
//! Subtask `i` appends to `part-<i><suffix>` in the target folder. The
//! worker only encodes: lines go into a buffer in memory, and the sink's
//! own thread ([`weir_core::io_thread::IoThread`]) does every system call.
//! One write is in flight at a time, and writes are handed over at most
//! every [`DirectFileSink::flush_interval`] (default
//! [`DEFAULT_FLUSH_INTERVAL`], 500 µs) unless [`FLUSH_BYTES`] wait: while
//! the thread writes, the worker fills the next buffer, so a slow disk gets
//! larger writes instead of more of them, and the thread wakes (taking a
//! core from a worker for a few microseconds) a bounded number of times a
//! second however small the batches are (`direct.write` before each
//! write). After a write the thread naps until a little more than the
//! interval after that hand-over before it parks, so that the next
//! hand-over finds it awake and costs the worker no wake-up call (a
//! barrier's cuts the nap short). A record is visible at most that
//! interval, one write and the nap's margin after it reached the sink. At
//! each barrier the file is fsynced (`direct.fsync`) once the barrier's
//! writes returned, and the checkpoint is acknowledged once that sync is
//! done, so that a completed checkpoint never depends on lines a crash
//! could lose; nothing is fsynced per batch. The barrier's fsync runs on
//! the snapshot pool through a second handle of the file
//! ([`Appender::sync_handle`]), not on the sink's thread, so that the
//! writes behind the barrier go on during it: in line, every fsync (about
//! a millisecond here, at each of 100 checkpoints a second) held back the
//! records handed over meanwhile, and at-least-once visibility p99 was
//! 2 ms against 0.7 ms without checkpoints. The first failed fsync fails
//! every later one and the sink's task (an fsync is never retried: the
//! kernel may have dropped the data). At the end the sink's thread syncs.
//!
//! Bounded memory: when more than [`MAX_PENDING_BYTES`] wait for the
//! thread or are being written, [`Sink::ready`] says false and the task stops reading input
//! (backpressure, like a full ring) until the thread catches up.
//!
//! After a failure the source replays from the checkpoint and the lines
//! written since then appear again: duplicates, never losses. A crash can
//! also cut the last line short; when the sink opens the file again it
//! removes a trailing partial line (everything after the last `\n`), so
//! the file only ever gains whole lines from this sink.

use std::io::{Read, Seek, SeekFrom, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use weir_core::vfs::{File, OpenOptions};

use weir_core::io_thread::{IoHandler, IoThread};
use weir_core::{clock, BoxError, PreCommit, Sink, SinkContext};

use crate::error::IoContext;
use crate::fsutil::{create_dir_durable, fault};
use crate::handover::Handover;
use crate::latency::StampRuns;
use crate::Result;

/// Fault point before a buffer is written.
pub const FAULT_WRITE: &str = "direct.write";
/// Fault point before the file is fsynced.
pub const FAULT_FSYNC: &str = "direct.fsync";

/// Every fault point of [`DirectFileSink`].
pub const DIRECT_FAULT_POINTS: &[&str] = &[FAULT_WRITE, FAULT_FSYNC];

/// Bytes examined from the end of the file, per step, for a partial line.
const TAIL_STEP: u64 = 64 << 10;

/// Encoded bytes held for the sink's thread (waiting, or in writes in
/// flight) beyond which the sink says it is not ready (4 MiB): at 32 bytes
/// a line, 130,000 lines, a fraction of a second of a fast disk's writing.
/// Memory stays below this plus one scheduling turn's output.
pub const MAX_PENDING_BYTES: usize = 4 << 20;

/// Least time between two writes handed to the sink's thread, by default:
/// 500 µs, so that at most 2,000 wake-ups a second take a core from a
/// worker, while a record waits at most that long to be written.
pub const DEFAULT_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_micros(500);

/// Bytes waiting that are written at once, without waiting for the flush
/// interval: 256 KiB.
pub const FLUSH_BYTES: usize = 256 << 10;

/// Requests to the sink's thread: at most one write, the writes and syncs
/// of barriers and the end, and the open. 64 bounds the barriers that can
/// queue behind a stalled disk before the worker waits.
const IO_QUEUE: usize = 64;

enum Request {
    /// Open the file (create the folder, cut a partial last line).
    Open,
    /// Append `buf`; `stamps` are its records' emission times.
    Write { buf: Vec<u8>, stamps: StampRuns },
    /// Fsync what was written.
    Sync,
}

enum Reply {
    /// The target is open; syncs may go through this handle.
    Opened(Option<Arc<SyncHandle>>),
    /// The buffer, cleared for reuse, its length, and when its bytes
    /// became visible.
    Written {
        buf: Vec<u8>,
        stamps: StampRuns,
        visible_ns: u64,
        len: usize,
    },
    Synced,
}

/// Where a direct sink's bytes go, on the sink's own thread: the file
/// ([`FileAppender`]), or another target whose writes are visible once
/// they return (a Kafka topic: [`crate::kafka::KafkaAppender`]).
pub trait Appender: Send + 'static {
    /// What and where, for thread names and errors.
    fn describe(&self) -> String;
    /// Prepares the target (first request on the thread).
    fn open(&mut self) -> Result<()>;
    /// Appends `buf`, whole records as the sink's `encode` wrote them;
    /// a reader can see them once this returns.
    fn append(&mut self, buf: &[u8]) -> Result<()>;
    /// Makes everything appended durable (at the end, and at barriers
    /// when there is no [`Appender::sync_handle`]).
    fn sync(&mut self) -> Result<()>;
    /// A handle that makes everything appended so far durable from another
    /// thread, while appends go on (asked after each [`Appender::open`]):
    /// the sink's barrier syncs then run on the snapshot pool and hold no
    /// append back. `None` (the default): they run on the sink's thread,
    /// in order after the appends.
    fn sync_handle(&mut self) -> Result<Option<SyncHandle>> {
        Ok(None)
    }
}

/// Makes an appender's target durable from a thread other than the sink's
/// ([`Appender::sync_handle`]). Failure is final: after the first failed
/// sync every later one fails with the same error, and the sink fails its
/// task, since after a failed `fsync` the kernel may have dropped data that
/// a later `fsync` would not report.
pub struct SyncHandle {
    sync: Box<dyn Fn() -> Result<()> + Send + Sync>,
    failed: OnceLock<String>,
}

impl SyncHandle {
    /// A handle whose syncs call `sync`.
    pub fn new(sync: impl Fn() -> Result<()> + Send + Sync + 'static) -> Self {
        SyncHandle {
            sync: Box::new(sync),
            failed: OnceLock::new(),
        }
    }

    /// Syncs, unless an earlier sync failed.
    fn sync(&self) -> Result<(), BoxError> {
        if let Some(e) = self.failed.get() {
            return Err(format!("an earlier sync failed: {e}").into());
        }
        (self.sync)().map_err(|e| {
            let msg = e.to_string();
            let _ = self.failed.set(msg);
            e.into()
        })
    }

    /// The first failure, if a sync failed.
    fn failure(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }
}

impl std::fmt::Debug for SyncHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncHandle")
            .field("failed", &self.failed.get())
            .finish()
    }
}

/// The direct sink's file: appended to, fsynced at barriers.
#[derive(Debug)]
pub struct FileAppender {
    path: PathBuf,
    file: Option<File>,
    /// Written since the last fsync.
    dirty: bool,
}

impl FileAppender {
    /// Appends to the file at `path` (its folder is created).
    pub fn new(path: PathBuf) -> Self {
        FileAppender {
            path,
            file: None,
            dirty: false,
        }
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
            // The file's entry in its folder, durably: a checkpoint counts
            // on the lines synced into it, and a crash must not take back
            // a file created since the folder's last fsync (with all of
            // them). Once per open, never per record.
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                weir_core::disk::sync_dir(dir).ctx("fsync folder", dir)?;
            }
            let len = f.metadata().ctx("stat", &self.path)?.len();
            let whole = whole_lines_len(&mut f, len).ctx("read the end of", &self.path)?;
            if whole < len {
                // A line cut short by a crash: remove it, durably.
                f.set_len(whole)
                    .and_then(|_| f.sync_all())
                    .ctx("cut a partial last line from", &self.path)?;
            }
            self.file = Some(f);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }
}

impl Appender for FileAppender {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn open(&mut self) -> Result<()> {
        self.file().map(|_| ())
    }

    fn append(&mut self, buf: &[u8]) -> Result<()> {
        fault(FAULT_WRITE, "append to", &self.path)?;
        let path = self.path.clone();
        self.file()?.write_all(buf).ctx("append to", &path)?;
        self.dirty = true;
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        if self.dirty {
            let path = self.path.clone();
            fsync(self.file()?, &path)?;
            self.dirty = false;
        }
        Ok(())
    }

    /// A second handle of the file, opened for reading: `fdatasync` on it
    /// makes the file's data durable whichever handle wrote it.
    fn sync_handle(&mut self) -> Result<Option<SyncHandle>> {
        self.file()?;
        let path = self.path.clone();
        let file = OpenOptions::new()
            .read(true)
            .open(&path)
            .ctx("open for syncing", &path)?;
        Ok(Some(SyncHandle::new(move || fsync(&file, &path))))
    }
}

/// The direct sink's fsync of its file (`direct.fsync` first), from either
/// handle.
fn fsync(file: &File, path: &Path) -> Result<()> {
    fault(FAULT_FSYNC, "fsync", path)?;
    file.sync_data().ctx("fsync", path)
}

/// The sink's thread: owns the appender.
struct DirectIo<A>(A);

impl<A: Appender> IoHandler for DirectIo<A> {
    type Request = Request;
    type Reply = Reply;

    fn handle(&mut self, request: Request) -> Result<Reply, BoxError> {
        match request {
            Request::Open => {
                self.0.open()?;
                Ok(Reply::Opened(self.0.sync_handle()?.map(Arc::new)))
            }
            Request::Write { mut buf, stamps } => {
                self.0.append(&buf)?;
                // Visible now: a reader of the target sees these records.
                let visible_ns = clock::now_ns();
                let len = buf.len();
                buf.clear();
                Ok(Reply::Written {
                    buf,
                    stamps,
                    visible_ns,
                    len,
                })
            }
            Request::Sync => {
                self.0.sync()?;
                Ok(Reply::Synced)
            }
        }
    }
}

/// One subtask of the direct file sink; see the module docs.
///
/// ```
/// use weir_core::harness::Harness;
/// use weir_io::DirectFileSink;
///
/// let dir = tempfile::tempdir().unwrap();
/// let encode = |r: &u8, out: &mut Vec<u8>| out.extend_from_slice(format!("{r}\n").as_bytes());
/// let mut sink = DirectFileSink::new(dir.path(), 0, encode, |_: &u8| 0);
/// let mut h = Harness::new(0, 1);
/// h.write_sink(&mut sink, &mut vec![1, 2]).unwrap();
/// // Written by the sink's thread at once, before any checkpoint.
/// sink.wait_idle().unwrap();
/// assert_eq!(std::fs::read_to_string(sink.path()).unwrap(), "1\n2\n");
/// ```
pub struct DirectFileSink<T, F, E, A: Appender = FileAppender> {
    /// Makes the appender, at each start of the thread.
    make: Box<dyn Fn() -> A + Send>,
    /// What the appender writes to, for names and errors.
    name: String,
    /// The file, for the file appender.
    path: PathBuf,
    encode: F,
    emitted_ns: E,
    /// Started at the first call (a restore, or the first write, barrier or
    /// finish).
    io: Option<IoThread<DirectIo<A>>>,
    /// Encoded lines on their way to the thread (see [`crate::handover`]).
    hand: Handover<Vec<u8>>,
    /// `finish` was called: ready once everything is done.
    finishing: bool,
    /// The waker was handed to the thread.
    waker_set: bool,
    /// Barrier syncs off the sink's thread, once it opened the target and
    /// offered one ([`Appender::sync_handle`]).
    syncer: Option<Arc<SyncHandle>>,
    _records: PhantomData<fn(&T)>,
}

impl<T, F, E> DirectFileSink<T, F, E, FileAppender>
where
    F: Fn(&T, &mut Vec<u8>),
    E: Fn(&T) -> u64,
{
    /// The sink of `subtask`, appending to `part-<subtask>.csv` in `dir`.
    /// `encode(record, out)` appends a record's line and its `\n`;
    /// `emitted_ns(record)` gives its emission time (0: unknown).
    pub fn new(dir: impl Into<PathBuf>, subtask: usize, encode: F, emitted_ns: E) -> Self {
        let path = dir.into().join(format!("part-{subtask:03}.csv"));
        let file = path.clone();
        let mut sink = Self::with_appender(Box::new(move || FileAppender::new(file.clone())), encode, emitted_ns);
        sink.name = path.display().to_string();
        sink.path = path;
        sink
    }

    /// The file this subtask appends to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl<T, F, E, A> DirectFileSink<T, F, E, A>
where
    F: Fn(&T, &mut Vec<u8>),
    E: Fn(&T) -> u64,
    A: Appender,
{
    /// A direct sink whose thread appends through the appenders `make`
    /// makes (one per start of the thread: the first call, each restore).
    pub fn with_appender(make: Box<dyn Fn() -> A + Send>, encode: F, emitted_ns: E) -> Self {
        let name = make().describe();
        DirectFileSink {
            make,
            name,
            path: PathBuf::new(),
            encode,
            emitted_ns,
            io: None,
            hand: Handover::new(DEFAULT_FLUSH_INTERVAL.as_nanos() as u64, FLUSH_BYTES),
            finishing: false,
            waker_set: false,
            syncer: None,
            _records: PhantomData,
        }
    }

    /// Sets the least time between two writes handed to the sink's thread
    /// (default [`DEFAULT_FLUSH_INTERVAL`]): shorter makes records visible
    /// sooner and wakes the thread more often.
    pub fn flush_interval(mut self, interval: std::time::Duration) -> Self {
        self.hand
            .set_interval_ns(interval.as_nanos().min(u128::from(u64::MAX)) as u64);
        self
    }

    /// Encoded bytes handed to the sink and not yet written by its thread
    /// (waiting, or in writes in flight).
    pub fn buffered_bytes(&self) -> usize {
        self.hand.buffered()
    }

    /// The sink's thread, started (with the file's opening as its first
    /// request) at the first call.
    fn io(&mut self) -> Result<&mut IoThread<DirectIo<A>>, BoxError> {
        if self.io.is_none() {
            let name = format!("weir-direct-{}", self.name);
            let handler = DirectIo((self.make)());
            let mut io = IoThread::spawn(&name, handler, IO_QUEUE)
                .map_err(|e| crate::Error::io("start the I/O thread of", Path::new(&self.name), e))?;
            io.set_nap(self.hand.thread_nap());
            io.submit(Request::Open)?;
            self.io = Some(io);
        }
        Ok(self.io.as_mut().expect("started above"))
    }

    /// Hands the pending bytes to the thread if due (see
    /// [`Handover::take`]; `None`: at once).
    fn send(&mut self, now: Option<u64>) -> Result<(), BoxError> {
        if let Some((buf, stamps)) = self.hand.take(now) {
            self.io()?.submit(Request::Write { buf, stamps })?;
        }
        Ok(())
    }

    /// Takes the thread's replies: recycles buffers, notes visibility.
    fn take_replies(&mut self) -> Result<(), BoxError> {
        let Some(io) = self.io.as_mut() else {
            return Ok(());
        };
        while let Some(reply) = io.try_reply()? {
            match reply {
                Reply::Written {
                    buf,
                    stamps,
                    visible_ns,
                    len,
                } => self.hand.returned(buf, stamps, visible_ns, len),
                Reply::Opened(syncer) => self.syncer = syncer,
                Reply::Synced => {}
            }
        }
        // A barrier's sync that failed on the pool fails the task too.
        if let Some(e) = self.syncer.as_ref().and_then(|s| s.failure()) {
            return Err(format!("{}: a checkpoint's fsync failed: {e}", self.name).into());
        }
        Ok(())
    }

    /// Hands this sink's worker to the thread for wake-ups, once.
    fn wake_me(&mut self, ctx: &SinkContext<'_>) -> Result<(), BoxError> {
        if !self.waker_set {
            self.io()?.set_waker(ctx.waker());
            self.waker_set = true;
        }
        Ok(())
    }

    /// Waits (blocking) until the thread wrote and synced everything handed
    /// to it, and takes its replies: for tests and tools, never on a worker.
    pub fn wait_idle(&mut self) -> Result<(), BoxError> {
        self.send(None)?;
        if let Some(io) = &self.io {
            io.wait_for(io.last_ticket())?;
        }
        self.take_replies()
    }
}

/// Length of the file up to and including its last `\n` (0 if none).
///
/// The file is the user's output and has no checksum, so the answer is
/// read twice: the bytes it rests on (from that `\n` to the end; bytes
/// before it are never used) must come back the same both times, or the
/// open fails with an error naming the file and the bytes (the disk
/// returned damaged bytes; a cut in the wrong place would drop a whole
/// line or keep part of one). Once per open, never per record.
fn whole_lines_len<R: Read + Seek>(f: &mut R, len: u64) -> std::io::Result<u64> {
    let mut chunk = Vec::new();
    let first = last_line_end(f, len, &mut chunk)?;
    let second = last_line_end(f, len, &mut chunk)?;
    if first != second {
        let from = first.0.min(second.0).saturating_sub(1);
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "bytes {from}..{len} (the end of its last whole line and what follows) read differently twice: \
                 the disk returned damaged bytes; nothing was cut"
            ),
        ));
    }
    Ok(first.0)
}

/// One reading of [`whole_lines_len`]: the length up to and including the
/// last `\n`, and a CRC32 of the bytes from that `\n` to `len` (fed from
/// the end, a chunk at a time: two readings of the same bytes agree).
fn last_line_end<R: Read + Seek>(f: &mut R, len: u64, chunk: &mut Vec<u8>) -> std::io::Result<(u64, u32)> {
    let mut crc = crc32fast::Hasher::new();
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(TAIL_STEP);
        chunk.resize((end - start) as usize, 0);
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(chunk)?;
        if let Some(i) = memchr::memrchr(b'\n', chunk) {
            crc.update(&chunk[i..]);
            return Ok((start + i as u64 + 1, crc.finalize()));
        }
        crc.update(chunk);
        end = start;
    }
    Ok((0, crc.finalize()))
}

impl<T, F, E, A> Sink<T> for DirectFileSink<T, F, E, A>
where
    T: Send + 'static,
    F: Fn(&T, &mut Vec<u8>) + Send + 'static,
    E: Fn(&T) -> u64 + Send + 'static,
    A: Appender,
{
    fn write(&mut self, batch: &mut Vec<T>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.wake_me(ctx)?;
        crate::latency::record_arrival(ctx, batch, &self.emitted_ns);
        for r in batch.iter() {
            (self.encode)(r, &mut self.hand.pending);
            self.hand.pending_stamps.push((self.emitted_ns)(r));
        }
        batch.clear();
        self.take_replies()?;
        let now = ctx.now_ns();
        self.send(Some(now))
    }

    fn open(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        // The thread, and the file's opening as its first request, before
        // the first record.
        self.wake_me(ctx)
    }

    fn ready(&mut self, ctx: &mut SinkContext<'_>) -> Result<bool, BoxError> {
        if self.io.is_some() {
            self.wake_me(ctx)?;
        }
        self.take_replies()?;
        if self.finishing {
            self.hand.visible.flush_all(ctx);
        } else {
            self.hand.visible.flush(ctx);
        }
        let now = ctx.now_ns();
        self.send(Some(now))?;
        if self.finishing {
            return Ok(self.hand.idle() && self.io.as_ref().is_none_or(|io| io.in_flight() == 0));
        }
        Ok(self.buffered_bytes() < MAX_PENDING_BYTES)
    }

    fn finish(&mut self, _ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.send(None)?;
        let io = self.io()?;
        io.submit(Request::Sync)?;
        // Off the flush cadence: not worth the nap's wait.
        io.wake();
        self.finishing = true;
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        self.pre_commit_detached(checkpoint)?.wait()
    }

    fn pre_commit_detached(&mut self, _checkpoint: u64) -> Result<PreCommit, BoxError> {
        // Everything written before the barrier, then its sync.
        self.send(None)?;
        self.take_replies()?;
        let syncer = self.syncer.clone();
        let io = self.io()?;
        let Some(syncer) = syncer else {
            // No handle (yet): the thread syncs, in order after the writes.
            let ticket = io.submit(Request::Sync)?;
            io.wake();
            return Ok(PreCommit::with_sync(Vec::new(), io.completion(ticket)));
        };
        // The barrier's writes are off the flush cadence: the thread
        // handles them now, not at the end of its nap.
        io.wake();
        // The pool waits for the barrier's writes, then syncs through the
        // handle while the thread writes what came after the barrier.
        let written = io.completion(io.last_ticket());
        Ok(PreCommit::with_sync(
            Vec::new(),
            Box::new(move || {
                written()?;
                syncer.sync()
            }),
        ))
    }

    fn restore(&mut self, _checkpoint: u64, _state: &[u8]) -> Result<(), BoxError> {
        // At-least-once: keep what is there (whole lines), append the replay.
        self.io = None;
        self.syncer = None;
        self.hand.reset();
        self.waker_set = false;
        self.finishing = false;
        let io = self.io()?;
        io.wait_for(io.last_ticket())?;
        self.take_replies()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A file whose first read returns byte `flip` with one bit flipped
    /// (rot on the way, as the storage simulation injects it); later reads
    /// are right.
    struct FlipFirstRead {
        inner: Cursor<Vec<u8>>,
        flip: u64,
        flipped: bool,
    }

    impl Read for FlipFirstRead {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let at = self.inner.position();
            let n = self.inner.read(buf)?;
            if !self.flipped && (at..at + n as u64).contains(&self.flip) {
                buf[(self.flip - at) as usize] ^= 0x04;
                self.flipped = true;
            }
            Ok(n)
        }
    }

    impl Seek for FlipFirstRead {
        fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
            self.inner.seek(pos)
        }
    }

    fn whole_with_flip(bytes: &[u8], flip: u64) -> std::io::Result<u64> {
        let mut f = FlipFirstRead {
            inner: Cursor::new(bytes.to_vec()),
            flip,
            flipped: false,
        };
        whole_lines_len(&mut f, bytes.len() as u64)
    }

    #[test]
    fn the_end_of_the_last_whole_line_is_found() {
        assert_eq!(whole_with_flip(b"1\n22\n3", u64::MAX).unwrap(), 5);
        assert_eq!(whole_with_flip(b"1\n22\n", u64::MAX).unwrap(), 5);
        assert_eq!(whole_with_flip(b"partial", u64::MAX).unwrap(), 0);
        assert_eq!(whole_with_flip(b"", u64::MAX).unwrap(), 0);
    }

    /// A flipped bit in the bytes the cut rests on (the last `\n`, or a
    /// byte after it that reads as `\n`) would drop a whole line or keep
    /// part of one: the second reading disagrees, and the open fails with
    /// the bytes to blame. A flip before them is never used.
    #[test]
    fn a_byte_read_damaged_where_the_cut_is_decided_fails_the_open() {
        // '\n' ^ 0x04 = 0x0e: the last newline vanishes on the first read.
        let e = whole_with_flip(b"1\n22\n3", 4).unwrap_err();
        assert!(
            e.to_string().contains("bytes 1..6") && e.to_string().contains("read differently twice"),
            "{e}"
        );
        // 0x0e ^ 0x04 = '\n': a newline appears in the partial line.
        let e = whole_with_flip(b"1\n22\n3\x0e3", 7).unwrap_err();
        assert!(e.to_string().contains("read differently twice"), "{e}");
        // Any other byte of the deciding range differs too.
        assert!(whole_with_flip(b"1\n22\n3", 5).is_err());
        // Before the last newline: not used, the answer stands.
        assert_eq!(whole_with_flip(b"1\n22\n3", 2).unwrap(), 5);
    }

    /// Through the appender: the error names the file (on a simulated disk
    /// that flips a bit of every read, so the two readings of a one-line
    /// file disagree unless they flip the same bit).
    #[test]
    fn a_damaged_read_at_open_is_an_error_naming_the_file() {
        use std::sync::Arc;
        use weir_core::vfs::sim::{Faults, SimFs};
        let mut failed = 0;
        for seed in 0..8 {
            let root = PathBuf::from(format!("/weir-sim-unit/direct-open-{seed}"));
            let fs = SimFs::new(&root, seed, Faults::default());
            weir_core::vfs::mount(&root, Arc::new(fs.clone()));
            let path = root.join("out/part-000.csv");
            let mut a = FileAppender::new(path.clone());
            a.append(b"12,3\n").unwrap();
            a.sync().unwrap();
            fs.set_faults(Faults {
                read_flip: 1,
                ..Faults::default()
            });
            let r = FileAppender::new(path.clone()).open();
            weir_core::vfs::unmount(&root);
            if let Err(e) = r {
                let e = e.to_string();
                assert!(
                    e.contains(&*path.to_string_lossy()) && e.contains("read differently twice"),
                    "{e}"
                );
                failed += 1;
            }
        }
        assert!(failed > 0, "no seed's two readings disagreed");
    }
}
