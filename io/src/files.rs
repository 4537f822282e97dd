//! A replayable source of newline-delimited records from one file or a
//! folder of files.
//!
//! - Files: a path to a file reads that file; a path to a folder reads its
//!   regular files whose names do not start with `.`, in name order.
//!   Subtask `i` of `p` reads the files whose index in that order is `i`
//!   modulo `p`, so a folder is split across subtasks file by file.
//! - Records: each line (without its `\n`) goes through the user's parse
//!   function with its [`LineInfo`]; see [`crate::lines`] for what a line
//!   is and for [`BadRecords`].
//! - Offsets: `(file, byte position of the next line, its line number)`,
//!   with the file named by index and name, so that a changed folder is
//!   noticed at seek instead of replaying the wrong file. The source is
//!   bounded: it is done after its last file.
//! - Cost: files are read in chunks of [`READ_CHUNK`] bytes into one
//!   buffer; lines are found with `memchr` and passed as slices of it. The
//!   source allocates nothing per line (the parse function may).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use weir_core::{BoxError, Source, SourceContext, SourcePoll};

use crate::error::IoContext;
use crate::lines::{BadRecords, LineInfo, LineParser, ParseError, MAX_LINE_BYTES};
use crate::{Error, Result};

/// Bytes read from a file at once: 1 MiB, large enough that the read
/// system call costs nothing per line, small enough to stay in cache.
pub const READ_CHUNK: usize = 1 << 20;

/// Version byte of the offset encoding.
const OFFSET_VERSION: u8 = 1;

/// One input file of this subtask.
#[derive(Debug)]
struct InputFile {
    /// Name within the folder (the file name for a single file).
    name: String,
    path: PathBuf,
    /// `path` as shown in [`LineInfo::file`] and in errors.
    display: String,
    /// Bytes of this file and of every later one of the subtask, when
    /// listed: the backlog (source lag) is this minus the position read.
    bytes_from_here: u64,
}

/// One subtask of a newline-delimited file source; see the module docs.
///
/// ```
/// use weir_core::harness::Harness;
/// use weir_core::SourcePoll;
/// use weir_io::{FileSource, LineInfo, ParseError};
///
/// let dir = tempfile::tempdir().unwrap();
/// std::fs::write(dir.path().join("a.txt"), "1\n2\n3\n").unwrap();
/// let parse = |line: &[u8], _: &LineInfo<'_>| -> Result<u64, ParseError> {
///     let s = std::str::from_utf8(line).map_err(|_| ParseError::new("not UTF-8"))?;
///     s.parse().map_err(|e| ParseError::new(format!("not a number: {e}")))
/// };
/// let mut src = FileSource::new(dir.path(), 0, 1, parse);
/// let mut out = Vec::new();
/// let status = Harness::new(0, 1).poll_source(&mut src, &mut out, 100).unwrap();
/// assert_eq!((status, out), (SourcePoll::Done, vec![1, 2, 3]));
/// ```
pub struct FileSource<T, P> {
    root: PathBuf,
    subtask: usize,
    parallelism: usize,
    parser: LineParser<P>,
    /// This subtask's files, listed at the first poll or seek.
    files: Option<Vec<InputFile>>,
    /// Index into `files` of the file being read; `files.len()` when done.
    cur: usize,
    /// The open current file, positioned at `buf_pos + end`.
    reader: Option<File>,
    /// Read buffer: `buf[start..end]` holds bytes not yet parsed.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// File offset of `buf[0]`; `buf_pos + start` is the next line's offset.
    buf_pos: u64,
    /// The reader returned end of file.
    eof: bool,
    /// Line number of the line starting at `buf[start]`, 1-based.
    line_number: u64,
    _records: PhantomData<fn() -> T>,
}

impl<T, P> FileSource<T, P> {
    /// The source instance of `subtask` out of `parallelism`, reading `path`
    /// (a file or a folder) with `parse`. Nothing is opened until the first
    /// poll or seek, where a missing path is reported.
    ///
    /// # Panics
    /// If `subtask >= parallelism`: the runtime never asks for that.
    pub fn new(path: impl Into<PathBuf>, subtask: usize, parallelism: usize, parse: P) -> Self {
        assert!(subtask < parallelism, "subtask {subtask} out of range 0..{parallelism}");
        FileSource {
            root: path.into(),
            subtask,
            parallelism,
            parser: LineParser::new(parse, BadRecords::Fail),
            files: None,
            cur: 0,
            reader: None,
            buf: Vec::new(),
            start: 0,
            end: 0,
            buf_pos: 0,
            eof: false,
            line_number: 1,
            _records: PhantomData,
        }
    }

    /// Sets what happens to lines the parse function rejects (default:
    /// [`BadRecords::Fail`]).
    pub fn bad_records(mut self, policy: BadRecords) -> Self {
        self.parser.set_policy(policy);
        self
    }

    /// The files this subtask reads, in order (lists the folder if needed).
    pub fn files(&mut self) -> Result<Vec<PathBuf>> {
        Ok(self.listed()?.iter().map(|f| f.path.clone()).collect())
    }

    fn listed(&mut self) -> Result<&[InputFile]> {
        if self.files.is_none() {
            self.files = Some(list_inputs(&self.root, self.subtask, self.parallelism)?);
        }
        Ok(self.files.as_deref().expect("listed above"))
    }

    /// Opens the current file at `buf_pos`.
    fn open_current(&mut self) -> Result<()> {
        let f = &self.files.as_ref().expect("listed before reading")[self.cur];
        let mut file = File::open(&f.path).ctx("open input file", &f.path)?;
        let len = file.metadata().ctx("stat input file", &f.path)?.len();
        if self.buf_pos > len {
            return Err(Error::BadOffset {
                source_name: "files",
                reason: format!(
                    "{} has {len} bytes, but the offset points at byte {}: the file changed",
                    f.display, self.buf_pos
                ),
            });
        }
        if self.buf_pos > 0 {
            file.seek(SeekFrom::Start(self.buf_pos))
                .ctx("seek in input file", &f.path)?;
        }
        if self.buf.is_empty() {
            self.buf = vec![0; READ_CHUNK];
        }
        self.reader = Some(file);
        self.start = 0;
        self.end = 0;
        self.eof = false;
        Ok(())
    }

    /// Moves unparsed bytes to the front and reads more; grows the buffer
    /// when one line fills it.
    fn refill(&mut self) -> Result<()> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.buf_pos += self.start as u64;
            self.end -= self.start;
            self.start = 0;
        }
        let f = &self.files.as_ref().expect("listed before reading")[self.cur];
        if self.end == self.buf.len() {
            if self.buf.len() >= MAX_LINE_BYTES {
                return Err(Error::LineTooLong {
                    file: f.display.clone(),
                    line: self.line_number,
                    limit: MAX_LINE_BYTES,
                });
            }
            let grown = (self.buf.len() * 2).min(MAX_LINE_BYTES);
            self.buf.resize(grown, 0);
        }
        let reader = self.reader.as_mut().expect("refill with an open file");
        let n = reader.read(&mut self.buf[self.end..]).ctx("read input file", &f.path)?;
        if n == 0 {
            self.eof = true;
        }
        self.end += n;
        Ok(())
    }

    /// Goes on with the next file.
    fn next_file(&mut self) {
        self.reader = None;
        self.cur += 1;
        self.buf_pos = 0;
        self.start = 0;
        self.end = 0;
        self.eof = false;
        self.line_number = 1;
    }

    pub(crate) fn poll_lines(&mut self, out: &mut Vec<T>, max: usize, now: u64) -> Result<SourcePoll>
    where
        P: FnMut(&[u8], &LineInfo<'_>) -> Result<T, ParseError>,
    {
        self.listed()?;
        let result = loop {
            let n_files = self.files.as_ref().map_or(0, Vec::len);
            if self.cur >= n_files {
                break SourcePoll::Done;
            }
            if out.len() >= max {
                break SourcePoll::Ready;
            }
            if self.reader.is_none() {
                self.open_current()?;
            }
            let pending = &self.buf[self.start..self.end];
            let (line_len, consumed) = match memchr::memchr(b'\n', pending) {
                Some(i) => (i, i + 1),
                None if self.eof => (pending.len(), pending.len()),
                None => {
                    self.refill()?;
                    continue;
                }
            };
            if consumed == 0 {
                // End of this file, and no unterminated last line.
                self.next_file();
                continue;
            }
            let info = LineInfo {
                file: &self.files.as_ref().expect("listed above")[self.cur].display,
                line_number: self.line_number,
                emitted_ns: now,
            };
            let line = &self.buf[self.start..self.start + line_len];
            self.parser.line(line, &info, out)?;
            self.start += consumed;
            self.line_number += 1;
        };
        self.parser.sync_rejected()?;
        Ok(result)
    }

    pub(crate) fn encode_offset(&self) -> Vec<u8> {
        let name = self
            .files
            .as_ref()
            .and_then(|f| f.get(self.cur))
            .map_or("", |f| f.name.as_str());
        let mut out = Vec::with_capacity(23 + name.len());
        out.push(OFFSET_VERSION);
        out.extend_from_slice(&(self.cur as u32).to_le_bytes());
        out.extend_from_slice(&(self.buf_pos + self.start as u64).to_le_bytes());
        out.extend_from_slice(&self.line_number.to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out
    }

    pub(crate) fn seek_to(&mut self, offset: &[u8]) -> Result<()> {
        let bad = |reason: String| Error::BadOffset {
            source_name: "files",
            reason,
        };
        if offset.len() < 23 || offset[0] != OFFSET_VERSION {
            return Err(bad(format!(
                "expected a version-{OFFSET_VERSION} offset of at least 23 bytes, got {} bytes",
                offset.len()
            )));
        }
        let cur = u32::from_le_bytes(offset[1..5].try_into().expect("4 bytes")) as usize;
        let pos = u64::from_le_bytes(offset[5..13].try_into().expect("8 bytes"));
        let line = u64::from_le_bytes(offset[13..21].try_into().expect("8 bytes"));
        let name_len = u16::from_le_bytes(offset[21..23].try_into().expect("2 bytes")) as usize;
        let name = std::str::from_utf8(&offset[23..])
            .ok()
            .filter(|n| n.len() == name_len)
            .ok_or_else(|| bad("the file name in the offset is damaged".into()))?;
        self.listed()?;
        let files = self.files.as_deref().expect("listed above");
        match files.get(cur) {
            Some(f) if f.name == name => {}
            // Past the last file, or taken before the folder was listed.
            _ if name.is_empty() && (cur == files.len() || (cur, pos, line) == (0, 0, 1)) => {}
            other => {
                return Err(bad(format!(
                    "the offset names file #{cur} {name:?}, but {} now has {} there: the input changed",
                    self.root.display(),
                    other.map_or("no file".to_string(), |f| format!("{:?}", f.name))
                )))
            }
        }
        if line == 0 {
            return Err(bad("line number 0".into()));
        }
        // Every line before it took at least its `\n`: line `n` starts at
        // byte `n - 1` or later. This also bounds the line number by the
        // file's size, so counting lines on from it cannot overflow.
        if line - 1 > pos {
            return Err(bad(format!(
                "line number {line} cannot start at byte {pos} (each earlier line takes at least one byte): the offset is damaged"
            )));
        }
        self.reader = None;
        self.cur = cur;
        self.buf_pos = pos;
        self.start = 0;
        self.end = 0;
        self.eof = false;
        self.line_number = line;
        Ok(())
    }
}

/// The files of subtask `subtask` of `parallelism` under `root`.
fn list_inputs(root: &Path, subtask: usize, parallelism: usize) -> Result<Vec<InputFile>> {
    let meta = std::fs::metadata(root).ctx("open input", root)?;
    let mut all = Vec::new();
    if meta.is_dir() {
        for entry in std::fs::read_dir(root).ctx("list input folder", root)? {
            let entry = entry.ctx("list input folder", root)?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let path = entry.path();
            // Follows symbolic links: a link to a file is an input file.
            if name.starts_with('.') || !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                continue;
            }
            all.push((name, path));
        }
        all.sort();
    } else {
        let name = root
            .file_name()
            .map_or_else(|| root.display().to_string(), |n| n.to_string_lossy().into_owned());
        all.push((name, root.to_path_buf()));
    }
    let mut mine: Vec<InputFile> = all
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % parallelism == subtask)
        .map(|(_, (name, path))| InputFile {
            display: path.display().to_string(),
            // Only for the backlog metric: a file that cannot be read fails
            // the job at its first read, with the reason.
            bytes_from_here: std::fs::metadata(&path).map_or(0, |m| m.len()),
            name,
            path,
        })
        .collect();
    let mut later = 0;
    for f in mine.iter_mut().rev() {
        later += f.bytes_from_here;
        f.bytes_from_here = later;
    }
    Ok(mine)
}

impl<T, P> Source<T> for FileSource<T, P>
where
    T: Send + 'static,
    P: FnMut(&[u8], &LineInfo<'_>) -> Result<T, ParseError> + Send + 'static,
{
    fn poll(&mut self, out: &mut Vec<T>, max: usize, ctx: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError> {
        let now = ctx.now_ns();
        Ok(self.poll_lines(out, max, now)?)
    }

    fn offset(&self) -> Vec<u8> {
        self.encode_offset()
    }

    fn seek(&mut self, offset: &[u8]) -> Result<(), BoxError> {
        Ok(self.seek_to(offset)?)
    }

    fn is_replayable(&self) -> bool {
        true
    }

    /// Bytes not yet parsed, in the current file and the later ones, by
    /// the sizes the files had when listed (the first poll or seek).
    fn backlog(&self) -> Option<u64> {
        let files = self.files.as_deref()?;
        let read = self.buf_pos + self.start as u64;
        Some(
            files
                .get(self.cur)
                .map_or(0, |f| f.bytes_from_here.saturating_sub(read)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::harness::Harness;

    type Parsed = (String, u64, i64);

    /// `key,value` lines; records carry (file name, line number, value).
    fn parse(line: &[u8], info: &LineInfo<'_>) -> Result<Parsed, ParseError> {
        let s = std::str::from_utf8(line).map_err(|_| ParseError::new("not UTF-8"))?;
        let (_, v) = s.split_once(',').ok_or("expected key,value")?;
        let v = v.parse().map_err(|e| ParseError::new(format!("value {v:?}: {e}")))?;
        let file = Path::new(info.file).file_name().unwrap().to_string_lossy().into_owned();
        Ok((file, info.line_number, v))
    }

    type Src = FileSource<Parsed, fn(&[u8], &LineInfo<'_>) -> Result<Parsed, ParseError>>;

    fn source(path: &Path, i: usize, p: usize) -> Src {
        FileSource::new(
            path,
            i,
            p,
            parse as fn(&[u8], &LineInfo<'_>) -> Result<Parsed, ParseError>,
        )
    }

    fn drain(src: &mut Src, batch: usize) -> Result<Vec<Parsed>, BoxError> {
        let mut h = Harness::new(0, 1);
        let mut all = Vec::new();
        loop {
            let mut out = Vec::new();
            let status = h.poll_source(src, &mut out, batch)?;
            assert!(out.len() <= batch);
            all.extend(out);
            if status == SourcePoll::Done {
                return Ok(all);
            }
        }
    }

    fn folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.csv"), "k,3\nk,4\n").unwrap();
        // No newline at the end: the last line still counts.
        std::fs::write(dir.path().join("a.csv"), "k,1\nk,2").unwrap();
        std::fs::write(dir.path().join("c.csv"), "").unwrap();
        std::fs::write(dir.path().join("d.csv"), "k,5\n").unwrap();
        std::fs::write(dir.path().join(".hidden"), "k,99\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        dir
    }

    #[test]
    fn reads_a_folder_in_name_order() {
        let dir = folder();
        let got = drain(&mut source(dir.path(), 0, 1), 2).unwrap();
        let values: Vec<i64> = got.iter().map(|r| r.2).collect();
        assert_eq!(values, vec![1, 2, 3, 4, 5]);
        assert_eq!(got[1], ("a.csv".to_string(), 2, 2));
        assert_eq!(got[2], ("b.csv".to_string(), 1, 3));
        // A single file works too.
        let one = drain(&mut source(&dir.path().join("b.csv"), 0, 1), 10).unwrap();
        assert_eq!(one.iter().map(|r| r.2).collect::<Vec<_>>(), vec![3, 4]);
    }

    /// The backlog counts the bytes not yet parsed, across files, down to 0.
    #[test]
    fn backlog_is_the_bytes_left() {
        let dir = folder();
        let mut src = source(dir.path(), 0, 1);
        assert_eq!(src.backlog(), None, "not listed before the first poll");
        let mut h = Harness::new(0, 1);
        let mut seen = Vec::new();
        loop {
            let mut out = Vec::new();
            let status = h.poll_source(&mut src, &mut out, 1).unwrap();
            seen.push(src.backlog().unwrap());
            if status == SourcePoll::Done {
                break;
            }
        }
        // a.csv (7 bytes) + b.csv (8) + c.csv (0) + d.csv (4) = 19 bytes.
        assert!(seen[0] < 19 && seen[0] >= 15, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[1] <= w[0]), "never grows: {seen:?}");
        assert_eq!(*seen.last().unwrap(), 0);
    }

    #[test]
    fn a_folder_is_split_across_subtasks_by_file_index() {
        let dir = folder();
        // Files in order: a, b, c, d -> subtask 0: a, c; subtask 1: b, d.
        let s0 = drain(&mut source(dir.path(), 0, 2), 1).unwrap();
        let s1 = drain(&mut source(dir.path(), 1, 2), 1).unwrap();
        assert_eq!(s0.iter().map(|r| r.2).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(s1.iter().map(|r| r.2).collect::<Vec<_>>(), vec![3, 4, 5]);
        let s2 = drain(&mut source(dir.path(), 2, 3), 1).unwrap();
        assert!(s2.is_empty(), "subtask 2 of 3 has only the empty file");
    }

    #[test]
    fn seek_replays_exactly_from_every_offset() {
        let dir = folder();
        let all = drain(&mut source(dir.path(), 0, 1), 100).unwrap();
        // Take an offset after every record, then replay from each one.
        let mut src = source(dir.path(), 0, 1);
        let mut h = Harness::new(0, 1);
        let mut offsets = vec![Source::<Parsed>::offset(&src)];
        loop {
            let mut out = Vec::new();
            let status = h.poll_source(&mut src, &mut out, 1).unwrap();
            offsets.push(Source::<Parsed>::offset(&src));
            if status == SourcePoll::Done {
                break;
            }
        }
        for (k, off) in offsets.iter().enumerate() {
            let mut again = source(dir.path(), 0, 1);
            Source::<Parsed>::seek(&mut again, off).unwrap();
            let rest = drain(&mut again, 3).unwrap();
            assert_eq!(rest, all[k.min(all.len())..], "replay from offset #{k}");
        }
    }

    #[test]
    fn seek_refuses_damaged_offsets_and_changed_folders() {
        let dir = folder();
        let mut src = source(dir.path(), 0, 1);
        let mut h = Harness::new(0, 1);
        h.poll_source(&mut src, &mut Vec::new(), 3).unwrap();
        let off = Source::<Parsed>::offset(&src);
        assert!(Source::<Parsed>::seek(&mut src, &off[..10]).is_err());
        std::fs::remove_file(dir.path().join("a.csv")).unwrap();
        let mut fresh = source(dir.path(), 0, 1);
        let e = Source::<Parsed>::seek(&mut fresh, &off).unwrap_err().to_string();
        assert!(e.contains("the input changed"), "{e}");
    }

    /// An offset whose line number is past what its byte position allows
    /// is refused (cargo-fuzz's `file_offset` target found line
    /// u64::MAX - 1 at byte 1 overflowing the line count on the next line).
    #[test]
    fn an_offset_with_an_impossible_line_number_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "1\n22\n333\n").unwrap();
        std::fs::write(dir.path().join("b.txt"), "x\n#y\nz").unwrap();
        let found: [u8; 28] = [
            1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 254, 255, 255, 255, 255, 255, 255, 255, 5, 0, 98, 46, 116, 120, 116,
        ];
        let mut src = source(dir.path(), 0, 1);
        let e = Source::<Parsed>::seek(&mut src, &found).unwrap_err().to_string();
        assert!(
            e.contains("line number 18446744073709551614 cannot start at byte 1"),
            "{e}"
        );
        // The largest line number a position allows is accepted.
        let mut ok = found;
        ok[13..21].copy_from_slice(&2u64.to_le_bytes());
        Source::<Parsed>::seek(&mut src, &ok).unwrap();
    }

    #[test]
    fn a_malformed_line_fails_with_file_line_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("in.csv"), "k,1\nk,2\nk,two\nk,4\n").unwrap();
        let e = drain(&mut source(dir.path(), 0, 1), 10).unwrap_err().to_string();
        assert!(e.contains("in.csv, line 3"), "{e}");
        assert!(e.contains("value \"two\""), "{e}");
        assert!(e.contains("k,two"), "the text is quoted: {e}");
    }

    #[test]
    fn skip_mode_writes_rejected_records_and_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        std::fs::create_dir(&input).unwrap();
        std::fs::write(input.join("x.csv"), "k,1\nbad line\nk,3\nk,\t4\n").unwrap();
        let rejected = dir.path().join("rejected.tsv");
        let mut src = source(&input, 0, 1).bad_records(BadRecords::Skip {
            rejected: rejected.clone(),
        });
        let got = drain(&mut src, 10).unwrap();
        assert_eq!(got.iter().map(|r| r.2).collect::<Vec<_>>(), vec![1, 3]);
        let text = std::fs::read_to_string(&rejected).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let f = input.join("x.csv").display().to_string();
        assert_eq!(lines[0], format!("{f}\t2\texpected key,value\tbad line"));
        assert!(lines[1].starts_with(&format!("{f}\t4\tvalue ")), "{}", lines[1]);
        assert!(lines[1].ends_with("\tk,\t4"), "the raw text comes last: {}", lines[1]);
    }

    #[test]
    fn long_lines_grow_the_buffer_and_lines_split_across_reads() {
        let dir = tempfile::tempdir().unwrap();
        let long = "9".repeat(READ_CHUNK + 10);
        let mut text = String::new();
        for i in 0..200_000 {
            text.push_str(&format!("k,{i}\n"));
        }
        text.push_str(&format!("k,{long}\n"));
        std::fs::write(dir.path().join("f"), &text).unwrap();
        let e = drain(&mut source(dir.path(), 0, 1), 4096).unwrap_err().to_string();
        // The huge number does not parse as i64, but the line was read whole.
        assert!(e.contains("line 200001"), "{e}");
        assert!(e.contains("number too large"), "{e}");
    }

    #[test]
    fn a_missing_input_is_reported_with_its_path() {
        let e = drain(&mut source(Path::new("/nonexistent/weir-input"), 0, 1), 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/weir-input"), "{e}");
    }
}
