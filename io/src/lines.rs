//! Newline-delimited input shared by the line sources: what the user's
//! parse function sees ([`LineInfo`]), what it reports ([`ParseError`]),
//! and what happens to a line it rejects ([`BadRecords`]).
//!
//! A line is the bytes up to, not including, a `\n`; a last line without
//! one counts too. The parse function gets a borrowed slice of the
//! source's read buffer: the sources allocate nothing per line.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::IoContext;
use crate::{Error, Result};

/// Longest line the line sources accept: 16 MiB. A longer "line" is almost
/// surely not line-oriented input, and the read buffer must hold a whole line.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// Longest piece of a bad line quoted in an error message: 200 bytes.
pub const MAX_QUOTED_TEXT: usize = 200;

/// Where a line comes from, passed to the parse function with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineInfo<'a> {
    /// The file's path as the source names it (or the stream's name).
    pub file: &'a str,
    /// 1-based line number in that file.
    pub line_number: u64,
    /// The clock reading of this poll on [`weir_core::clock`]: the
    /// emission time to stamp records with, for latency measurements.
    pub emitted_ns: u64,
}

/// Why a line is not a valid record, as the parse function reports it.
///
/// ```
/// use weir_io::ParseError;
/// let e = ParseError::new("value is not an integer");
/// assert_eq!(e.to_string(), "value is not an integer");
/// let e: ParseError = format!("expected 2 fields, got {}", 3).into();
/// assert_eq!(e.reason(), "expected 2 fields, got 3");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(String);

impl ParseError {
    /// A parse error with this reason.
    pub fn new(reason: impl Into<String>) -> Self {
        ParseError(reason.into())
    }

    /// What is wrong with the line.
    pub fn reason(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

impl From<String> for ParseError {
    fn from(s: String) -> Self {
        ParseError(s)
    }
}

impl From<&str> for ParseError {
    fn from(s: &str) -> Self {
        ParseError(s.to_string())
    }
}

/// What a line source does with a line the parse function rejects.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BadRecords {
    /// Stop: the poll fails with [`Error::Malformed`] naming the file, the
    /// line number and the reason. The default.
    #[default]
    Fail,
    /// Skip the line and append it to the rejected-records file `rejected`,
    /// one line per rejected record: `file<TAB>line number<TAB>reason<TAB>text`
    /// (tabs and newlines in the reason become spaces; the text is the raw
    /// line). Every subtask appends to the same file, each record with one
    /// `O_APPEND` write, so records never interleave. After a recovery,
    /// replayed bad lines are written again: the file is at-least-once.
    Skip {
        /// The rejected-records file, created if absent.
        rejected: PathBuf,
    },
}

/// Parses lines with the user's function and applies the [`BadRecords`]
/// policy; owned by one source subtask.
pub(crate) struct LineParser<P> {
    parse: P,
    policy: BadRecords,
    /// Open once the first line is rejected under [`BadRecords::Skip`].
    rejected: Option<File>,
    /// Reused buffer for one rejected-record line.
    scratch: Vec<u8>,
    /// Records rejected since the rejected file was last fsynced.
    unsynced: bool,
}

impl<P> LineParser<P> {
    pub(crate) fn new(parse: P, policy: BadRecords) -> Self {
        LineParser {
            parse,
            policy,
            rejected: None,
            scratch: Vec::new(),
            unsynced: false,
        }
    }

    pub(crate) fn set_policy(&mut self, policy: BadRecords) {
        self.policy = policy;
    }

    /// Parses one line into `out`, or deals with it as the policy says.
    #[inline]
    pub(crate) fn line<T>(&mut self, line: &[u8], info: &LineInfo<'_>, out: &mut Vec<T>) -> Result<()>
    where
        P: FnMut(&[u8], &LineInfo<'_>) -> Result<T, ParseError>,
    {
        match (self.parse)(line, info) {
            Ok(record) => {
                out.push(record);
                Ok(())
            }
            Err(e) => self.reject(line, info, e),
        }
    }

    #[cold]
    fn reject(&mut self, line: &[u8], info: &LineInfo<'_>, e: ParseError) -> Result<()> {
        let BadRecords::Skip { rejected } = &self.policy else {
            return Err(malformed(info.file, info.line_number, e.0, line));
        };
        if self.rejected.is_none() {
            self.rejected = Some(open_append(rejected)?);
        }
        let file = self.rejected.as_mut().expect("opened above");
        self.scratch.clear();
        self.scratch.extend_from_slice(info.file.as_bytes());
        write!(self.scratch, "\t{}\t", info.line_number).expect("writing to a Vec");
        self.scratch
            .extend(e.0.bytes().map(|b| if b == b'\t' || b == b'\n' { b' ' } else { b }));
        self.scratch.push(b'\t');
        self.scratch.extend_from_slice(line);
        self.scratch.push(b'\n');
        // One write per record: O_APPEND keeps concurrent subtasks' records whole.
        file.write_all(&self.scratch).ctx("append to", rejected)?;
        self.unsynced = true;
        Ok(())
    }

    /// Fsyncs the rejected-records file if records were added since the
    /// last call.
    pub(crate) fn sync_rejected(&mut self) -> Result<()> {
        if let (true, Some(f), BadRecords::Skip { rejected }) = (self.unsynced, &self.rejected, &self.policy) {
            weir_core::disk::sync_data(f).ctx("fsync", rejected)?;
        }
        self.unsynced = false;
        Ok(())
    }
}

fn open_append(path: &Path) -> Result<File> {
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).ctx("create folder", dir)?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .ctx("open for appending", path)
}

/// An [`Error::Malformed`] quoting the start of `line`.
pub(crate) fn malformed(file: &str, line_number: u64, reason: String, line: &[u8]) -> Error {
    let quoted = &line[..line.len().min(MAX_QUOTED_TEXT)];
    let mut text = String::from_utf8_lossy(quoted).into_owned();
    if line.len() > MAX_QUOTED_TEXT {
        text.push_str("...");
    }
    Error::Malformed {
        file: file.to_string(),
        line: line_number,
        reason,
        text,
    }
}
