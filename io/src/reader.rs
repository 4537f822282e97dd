//! A source of newline-delimited records from any [`Read`]: standard input,
//! a pipe, a socket. It is **not replayable**: what was read is gone, so
//! [`Source::is_replayable`] is false and the runtime refuses it in the
//! exactly-once modes (aligned, unaligned); it runs with at-least-once
//! checkpoints (which then cannot replay it either: records after the last
//! checkpoint are lost on a failure) or without checkpointing.
//!
//! A read can block for as long as the other end likes, and a source's
//! `poll` must not block a worker thread. So a reader thread, started at the
//! first poll, reads chunks of [`CHUNK`] bytes into a bounded channel of
//! [`QUEUED_CHUNKS`]; `poll` takes what has arrived and returns
//! [`SourcePoll::Idle`] when nothing has. Chunk buffers go back to the
//! reader thread for reuse: nothing is allocated per line.
//!
//! Use it with parallelism 1: every subtask would read the same stream.

use std::io::Read;
use std::marker::PhantomData;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};

use weir_core::{BoxError, Source, SourceContext, SourcePoll};

use crate::lines::{BadRecords, LineInfo, LineParser, ParseError, MAX_LINE_BYTES};
use crate::{Error, Result};

/// Bytes per read: 64 KiB, a pipe's capacity on Linux.
pub const CHUNK: usize = 64 << 10;

/// Chunks read ahead before the reader thread waits: 16 (1 MiB), so a
/// fast producer is not stalled by one slow poll, and memory stays bounded.
pub const QUEUED_CHUNKS: usize = 16;

/// What the reader thread sends: data, end of stream (an empty chunk), or
/// a read error.
type Chunk = std::io::Result<Vec<u8>>;

/// A non-replayable line source over a reader; see the module docs.
///
/// ```
/// use weir_core::harness::Harness;
/// use weir_core::{Source, SourcePoll};
/// use weir_io::{LineInfo, ParseError, ReaderSource};
///
/// let input = std::io::Cursor::new(b"a\nbb\nccc".to_vec());
/// let mut src = ReaderSource::new("cursor", input, |l: &[u8], _: &LineInfo<'_>| Ok::<_, ParseError>(l.len()));
/// assert!(!Source::<usize>::is_replayable(&src));
/// let mut h = Harness::new(0, 1);
/// let mut all = Vec::new();
/// loop {
///     let mut out = Vec::new();
///     let status = h.poll_source(&mut src, &mut out, 10).unwrap();
///     all.extend(out);
///     if status == SourcePoll::Done { break; }
/// }
/// assert_eq!(all, vec![1, 2, 3]);
/// ```
pub struct ReaderSource<T, P> {
    name: String,
    /// The reader, until the reader thread takes it.
    reader: Option<Box<dyn Read + Send>>,
    chunks: Option<Receiver<Chunk>>,
    /// Returns emptied chunk buffers to the reader thread.
    spare: Option<SyncSender<Vec<u8>>>,
    parser: LineParser<P>,
    /// Bytes received and not yet parsed start at `buf[start]`.
    buf: Vec<u8>,
    start: usize,
    line_number: u64,
    done: bool,
    _records: PhantomData<fn() -> T>,
}

impl<T, P> ReaderSource<T, P> {
    /// A source reading lines from `reader`, named `name` in [`LineInfo`]
    /// and in errors.
    pub fn new(name: impl Into<String>, reader: impl Read + Send + 'static, parse: P) -> Self {
        ReaderSource {
            name: name.into(),
            reader: Some(Box::new(reader)),
            chunks: None,
            spare: None,
            parser: LineParser::new(parse, BadRecords::Fail),
            buf: Vec::new(),
            start: 0,
            line_number: 1,
            done: false,
            _records: PhantomData,
        }
    }

    /// A source reading lines from standard input, named `<stdin>`.
    pub fn stdin(parse: P) -> Self {
        Self::new("<stdin>", std::io::stdin(), parse)
    }

    /// Sets what happens to lines the parse function rejects (default:
    /// [`BadRecords::Fail`]).
    pub fn bad_records(mut self, policy: BadRecords) -> Self {
        self.parser.set_policy(policy);
        self
    }

    fn start_reader(&mut self) -> Result<()> {
        let Some(mut reader) = self.reader.take() else {
            return Ok(());
        };
        let (tx, rx) = mpsc::sync_channel::<Chunk>(QUEUED_CHUNKS);
        let (spare_tx, spare_rx) = mpsc::sync_channel::<Vec<u8>>(QUEUED_CHUNKS);
        std::thread::Builder::new()
            .name(format!("weir-reader-{}", self.name))
            .spawn(move || loop {
                let mut chunk = spare_rx.try_recv().unwrap_or_else(|_| Vec::with_capacity(CHUNK));
                chunk.resize(CHUNK, 0);
                let msg = match reader.read(&mut chunk) {
                    Ok(n) => {
                        chunk.truncate(n);
                        Ok(chunk)
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let last = !matches!(&msg, Ok(c) if !c.is_empty());
                // A send fails when the source is gone: stop reading.
                if tx.send(msg).is_err() || last {
                    return;
                }
            })
            .map_err(|e| Error::io("start a reader thread for", std::path::Path::new(&self.name), e))?;
        self.chunks = Some(rx);
        self.spare = Some(spare_tx);
        Ok(())
    }

    fn poll_lines(&mut self, out: &mut Vec<T>, max: usize, now: u64) -> Result<SourcePoll>
    where
        P: FnMut(&[u8], &LineInfo<'_>) -> Result<T, ParseError>,
    {
        if self.done {
            return Ok(SourcePoll::Done);
        }
        self.start_reader()?;
        let result = loop {
            if out.len() >= max {
                break SourcePoll::Ready;
            }
            if let Some(i) = memchr::memchr(b'\n', &self.buf[self.start..]) {
                self.parse_line(self.start..self.start + i, now, out)?;
                self.start += i + 1;
                continue;
            }
            let rx = self.chunks.as_ref().expect("reader started");
            match rx.try_recv() {
                Ok(Ok(chunk)) if chunk.is_empty() => {
                    if self.start < self.buf.len() {
                        self.parse_line(self.start..self.buf.len(), now, out)?;
                    }
                    self.buf.clear();
                    self.start = 0;
                    self.done = true;
                    break SourcePoll::Done;
                }
                Ok(Ok(chunk)) => {
                    self.buf.drain(..self.start);
                    self.start = 0;
                    if self.buf.len() + chunk.len() > MAX_LINE_BYTES + CHUNK && !chunk.contains(&b'\n') {
                        return Err(Error::LineTooLong {
                            file: self.name.clone(),
                            line: self.line_number,
                            limit: MAX_LINE_BYTES,
                        });
                    }
                    self.buf.extend_from_slice(&chunk);
                    if let Some(spare) = &self.spare {
                        let _ = spare.try_send(chunk);
                    }
                }
                Ok(Err(e)) => return Err(Error::io("read", std::path::Path::new(&self.name), e)),
                Err(TryRecvError::Empty) => {
                    break if out.is_empty() {
                        SourcePoll::Idle
                    } else {
                        SourcePoll::Ready
                    }
                }
                Err(TryRecvError::Disconnected) => {
                    return Err(Error::io(
                        "read",
                        std::path::Path::new(&self.name),
                        std::io::Error::other("the reader thread stopped"),
                    ))
                }
            }
        };
        self.parser.sync_rejected()?;
        Ok(result)
    }

    fn parse_line(&mut self, range: std::ops::Range<usize>, now: u64, out: &mut Vec<T>) -> Result<()>
    where
        P: FnMut(&[u8], &LineInfo<'_>) -> Result<T, ParseError>,
    {
        let info = LineInfo {
            file: &self.name,
            line_number: self.line_number,
            emitted_ns: now,
        };
        self.parser.line(&self.buf[range], &info, out)?;
        self.line_number += 1;
        Ok(())
    }
}

impl<T, P> Source<T> for ReaderSource<T, P>
where
    T: Send + 'static,
    P: FnMut(&[u8], &LineInfo<'_>) -> Result<T, ParseError> + Send + 'static,
{
    fn poll(&mut self, out: &mut Vec<T>, max: usize, ctx: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError> {
        let now = ctx.now_ns();
        Ok(self.poll_lines(out, max, now)?)
    }

    fn is_replayable(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::harness::Harness;

    fn parse(line: &[u8], info: &LineInfo<'_>) -> Result<(u64, String), ParseError> {
        if line == b"bad" {
            return Err("bad line".into());
        }
        Ok((info.line_number, String::from_utf8_lossy(line).into_owned()))
    }

    #[test]
    fn lines_across_chunks_arrive_in_order_and_it_is_not_replayable() {
        let mut text = String::new();
        for i in 0..50_000 {
            text.push_str(&format!("line {i}\n"));
        }
        let mut src = ReaderSource::new("mem", std::io::Cursor::new(text.into_bytes()), parse);
        assert!(!Source::<(u64, String)>::is_replayable(&src));
        assert!(Source::<(u64, String)>::seek(&mut src, &[]).is_err());
        let mut h = Harness::new(0, 1);
        let mut all = Vec::new();
        loop {
            let mut out = Vec::new();
            let status = h.poll_source(&mut src, &mut out, 1000).unwrap();
            all.extend(out);
            match status {
                SourcePoll::Done => break,
                SourcePoll::Idle => std::thread::yield_now(),
                SourcePoll::Ready => {}
            }
        }
        assert_eq!(all.len(), 50_000);
        assert!(all
            .iter()
            .enumerate()
            .all(|(i, r)| r.0 == i as u64 + 1 && r.1 == format!("line {i}")));
    }

    #[test]
    fn a_bad_line_names_the_stream_and_line() {
        let mut src = ReaderSource::new("pipe", std::io::Cursor::new(b"a\nbad\n".to_vec()), parse);
        let mut h = Harness::new(0, 1);
        let err = loop {
            match h.poll_source(&mut src, &mut Vec::new(), 10) {
                Ok(SourcePoll::Done) => panic!("the bad line was accepted"),
                Ok(_) => std::thread::yield_now(),
                Err(e) => break e.to_string(),
            }
        };
        assert!(err.contains("pipe, line 2: bad line"), "{err}");
    }
}
