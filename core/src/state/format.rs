//! The snapshot file format, its durable write and its verified read.
//!
//! All integers little-endian; CRC32 is IEEE (crc32fast).
//!
//! ```text
//! header   48 B  magic "WEIRSTAT" | version u32 | flags u32 (bit 0: full;
//!                bits 8..16: state kind) | page_size u32 | slot_size u32 |
//!                checkpoint u64 | epoch u32 | base_epoch u32 | key_bytes u32 |
//!                crc32 of the 44 bytes before
//! record*        page u32 | key_group u32 | kind u32 (0 full, 1 delta,
//!                2 packed) | count u32 (full: page_size; delta: slots;
//!                packed: payload bytes) | crc32 of the 16 bytes before and
//!                the payload |
//!                payload: full = the page image (page_size bytes);
//!                         delta = count x (slot index u32, slot bytes);
//!                         packed = the page image packed (see `pack.rs`),
//!                         fewer than page_size bytes
//! trailer  24 B  magic "WEIREND1" | records u64 | crc32 of every byte
//!                before the trailer | crc32 of the 20 trailer bytes before
//! ```
//!
//! The handle records the file's size and the CRC32 of the whole file, so a
//! file can also be checked without parsing it (the coordinator does).
//!
//! A file is written under a temp name, fsynced, renamed to its final name
//! and the directory fsynced: a crash at any instant leaves either no file
//! under the final name or a complete one. Once renamed it never changes.

use std::io::Write;
use std::path::Path;

use rayon::prelude::*;

use super::handle::{SlotLayout, StateFile, StateKind};
use super::snapshot::FailPoint;
use crate::error::{Error, Result};
use crate::storage::vfs::{self, File};

const MAGIC: &[u8; 8] = b"WEIRSTAT";
const TRAILER_MAGIC: &[u8; 8] = b"WEIREND1";
const VERSION: u32 = 1;
pub(crate) const HEADER_LEN: usize = 48;
pub(crate) const TRAILER_LEN: usize = 24;
pub(crate) const RECORD_HEADER_LEN: usize = 20;
/// Bytes per unit of parallel whole-file CRC work.
const CRC_CHUNK: usize = 4 << 20;

/// What a page record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecordKind {
    /// The whole page image.
    Full,
    /// This many changed slots, each with its index.
    Delta(u32),
    /// The whole page image, packed into this many bytes (fewer than a
    /// page; see [`super::pack`]). Written by inline snapshots.
    Packed(u32),
}

/// A run of encoded page records with the CRC of its bytes.
#[derive(Default)]
pub(crate) struct Chunk {
    pub(crate) bytes: Vec<u8>,
    pub(crate) records: u64,
    crc: crc32fast::Hasher,
}

impl Chunk {
    /// Empties the chunk, keeping its buffer for the next use.
    pub(crate) fn reset(&mut self) {
        self.bytes.clear();
        self.records = 0;
    }

    /// Appends a record header (CRC still zero) and `payload`; returns the
    /// record's start, to [`Chunk::seal_record`] once the payload is complete.
    pub(crate) fn push_record(&mut self, page: u32, kg: u32, kind: RecordKind, payload: &[&[u8]]) -> usize {
        let start = self.bytes.len();
        let (k, count) = match kind {
            RecordKind::Full => (0u32, payload.iter().map(|p| p.len()).sum::<usize>() as u32),
            RecordKind::Delta(n) => (1, n),
            RecordKind::Packed(n) => (2, n),
        };
        for w in [page, kg, k, count, 0] {
            self.bytes.extend_from_slice(&w.to_le_bytes());
        }
        for p in payload {
            self.bytes.extend_from_slice(p);
        }
        start
    }

    /// Sets the count field of the record starting at `start` (a packed
    /// record's payload length, known once it is packed).
    pub(crate) fn set_record_count(&mut self, start: usize, count: u32) {
        self.bytes[start + 12..start + 16].copy_from_slice(&count.to_le_bytes());
    }

    /// Computes and stores the CRC of the record starting at `start`.
    pub(crate) fn seal_record(&mut self, start: usize) {
        let crc = record_crc(&self.bytes[start..]);
        self.bytes[start + 16..start + 20].copy_from_slice(&crc.to_le_bytes());
        self.records += 1;
    }

    /// Computes the CRC of the whole chunk (on the capturing thread, so
    /// that file checksums are computed in parallel).
    pub(crate) fn finish(&mut self) {
        self.crc = crc32fast::Hasher::new();
        self.crc.update(&self.bytes);
    }
}

/// The CRC of a record (header without its CRC field, then payload).
fn record_crc(record: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&record[..16]);
    h.update(&record[RECORD_HEADER_LEN..]);
    h.finalize()
}

fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The CRC of `bytes`, computed in parallel pieces and combined.
fn par_crc(bytes: &[u8]) -> crc32fast::Hasher {
    let parts: Vec<crc32fast::Hasher> = bytes
        .par_chunks(CRC_CHUNK)
        .map(|c| {
            let mut h = crc32fast::Hasher::new();
            h.update(c);
            h
        })
        .collect();
    let mut all = crc32fast::Hasher::new();
    for p in &parts {
        all.combine(p);
    }
    all
}

/// The fixed facts at the start of a file.
pub(crate) struct FileHeader {
    pub(crate) full: bool,
    pub(crate) layout: SlotLayout,
    pub(crate) checkpoint: u64,
    pub(crate) epoch: u32,
    pub(crate) base_epoch: u32,
}

fn kind_code(kind: StateKind) -> u32 {
    match kind {
        StateKind::Value => 0,
        StateKind::Map => 1,
        StateKind::List => 2,
    }
}

impl FileHeader {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(MAGIC);
        let flags = u32::from(self.full) | kind_code(self.layout.kind) << 8;
        let words = [VERSION, flags, self.layout.page_size, self.layout.slot_size];
        for (i, w) in words.iter().enumerate() {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        b[24..32].copy_from_slice(&self.checkpoint.to_le_bytes());
        b[32..36].copy_from_slice(&self.epoch.to_le_bytes());
        b[36..40].copy_from_slice(&self.base_epoch.to_le_bytes());
        b[40..44].copy_from_slice(&self.layout.key_bytes.to_le_bytes());
        let c = crc(&b[..44]);
        b[44..48].copy_from_slice(&c.to_le_bytes());
        b
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn io_error(context: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::State {
        context,
        message: e.to_string(),
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    crate::storage::disk::sync_dir(dir).map_err(io_error(format!("syncing directory {}", dir.display())))
}

fn injected(what: &str) -> Error {
    Error::State {
        context: "writing a state snapshot".into(),
        message: format!("injected fault: {what}"),
    }
}

fn encode_trailer(records: u64, body_crc: u32) -> [u8; TRAILER_LEN] {
    let mut trailer = [0u8; TRAILER_LEN];
    trailer[0..8].copy_from_slice(TRAILER_MAGIC);
    trailer[8..16].copy_from_slice(&records.to_le_bytes());
    trailer[16..20].copy_from_slice(&body_crc.to_le_bytes());
    let tc = crc(&trailer[..20]);
    trailer[20..24].copy_from_slice(&tc.to_le_bytes());
    trailer
}

/// Bytes of a full snapshot file of `pages` pages of `page_size` bytes.
pub(crate) fn image_bytes(pages: usize, page_size: usize) -> usize {
    HEADER_LEN + pages * (RECORD_HEADER_LEN + page_size) + TRAILER_LEN
}

/// The bytes of a whole snapshot file holding `chunk`'s sealed records,
/// built in memory: what a small store's snapshot carries inline in its
/// handle instead of writing a file (same format, same checks on restore).
pub(crate) fn image(header: &FileHeader, chunk: &Chunk) -> Vec<u8> {
    let head = header.encode();
    let mut out = Vec::with_capacity(HEADER_LEN + chunk.bytes.len() + TRAILER_LEN);
    out.extend_from_slice(&head);
    out.extend_from_slice(&chunk.bytes);
    let mut body = crc32fast::Hasher::new();
    body.update(&head);
    body.combine(&chunk.crc);
    out.extend_from_slice(&encode_trailer(chunk.records, body.finalize()));
    out
}

/// Writes one snapshot file durably, chunk by chunk; see the module docs.
pub(crate) struct FileWriter {
    file: File,
    tmp: std::path::PathBuf,
    path: std::path::PathBuf,
    name: String,
    body: crc32fast::Hasher,
    records: u64,
    size: u64,
    fail: Option<FailPoint>,
    /// Whether `finish` fsyncs the folder (see [`FileWriter::defer_dir_sync`]).
    dir_sync: bool,
}

impl FileWriter {
    /// Creates `root/name` under a temp name and writes the header.
    pub(crate) fn create(root: &Path, name: &str, header: &FileHeader, fail: Option<FailPoint>) -> Result<FileWriter> {
        let path = root.join(name);
        let dir = path.parent().expect("files live in shared/");
        if !vfs::exists(dir) {
            vfs::create_dir_all(dir).map_err(io_error(format!("creating {}", dir.display())))?;
            sync_dir(dir.parent().unwrap_or(root))?;
        }
        let tmp = path.with_extension("pages.tmp");
        let mut file = File::create(&tmp).map_err(io_error(format!("creating state file {}", tmp.display())))?;
        let head = header.encode();
        file.write_all(&head)
            .map_err(io_error(format!("writing state file {}", tmp.display())))?;
        let mut body = crc32fast::Hasher::new();
        body.update(&head);
        Ok(FileWriter {
            file,
            tmp,
            path,
            name: name.to_string(),
            body,
            records: 0,
            size: HEADER_LEN as u64,
            fail,
            dir_sync: true,
        })
    }

    /// Leaves the folder's fsync after the rename to the caller, who makes
    /// the renames of several files durable with one folder sync.
    pub(crate) fn defer_dir_sync(&mut self) {
        self.dir_sync = false;
    }

    fn error(&self) -> impl FnOnce(std::io::Error) -> Error {
        io_error(format!("writing state file {}", self.tmp.display()))
    }

    /// Appends a chunk of sealed page records.
    pub(crate) fn append(&mut self, c: &Chunk) -> Result<()> {
        if let Some(FailPoint::AfterBytes(limit)) = self.fail {
            let room = (limit + HEADER_LEN as u64).saturating_sub(self.size);
            if room < c.bytes.len() as u64 {
                self.file.write_all(&c.bytes[..room as usize]).map_err(self.error())?;
                return Err(injected("write stopped midway"));
            }
        }
        self.file.write_all(&c.bytes).map_err(self.error())?;
        self.body.combine(&c.crc);
        self.records += c.records;
        self.size += c.bytes.len() as u64;
        Ok(())
    }

    /// Writes the trailer, fsyncs, renames into place and fsyncs the
    /// directory; returns the file as a handle lists it.
    pub(crate) fn finish(mut self) -> Result<StateFile> {
        let trailer = encode_trailer(self.records, self.body.clone().finalize());
        self.file.write_all(&trailer).map_err(self.error())?;
        self.size += TRAILER_LEN as u64;
        // Data and size; the other metadata (times) does not matter.
        self.file.sync_data().map_err(self.error())?;
        if self.fail == Some(FailPoint::BeforeRename) {
            return Err(injected("crash before rename"));
        }
        vfs::rename(&self.tmp, &self.path).map_err(io_error(format!("renaming {} into place", self.tmp.display())))?;
        if self.fail == Some(FailPoint::BeforeDirSync) {
            return Err(injected("crash before directory sync"));
        }
        if self.dir_sync {
            sync_dir(self.path.parent().expect("files live in shared/"))?;
        }
        let mut whole = self.body;
        whole.update(&trailer);
        Ok(StateFile {
            path: self.name,
            size: self.size,
            crc32: whole.finalize(),
        })
    }
}

/// A parsed page record of a verified file.
pub(crate) struct Record {
    /// Offset of the record in the file.
    pub(crate) start: usize,
    pub(crate) page: u32,
    pub(crate) kg: u32,
    pub(crate) kind: RecordKind,
}

impl Record {
    /// The payload bytes of the record in `file`.
    pub(crate) fn payload<'a>(&self, file: &'a [u8], layout: &SlotLayout) -> &'a [u8] {
        let len = match self.kind {
            RecordKind::Full => layout.page_size as usize,
            RecordKind::Delta(n) => n as usize * (4 + layout.slot_size as usize),
            RecordKind::Packed(n) => n as usize,
        };
        &file[self.start + RECORD_HEADER_LEN..self.start + RECORD_HEADER_LEN + len]
    }
}

/// The bytes of a checkpoint file: mapped read-only (no copy, and no
/// anonymous memory to fault in), an inline image, or empty.
pub(crate) enum FileBytes {
    Mapped(memmap2::Mmap),
    /// The image of an inline snapshot, carried by its handle.
    Owned(Vec<u8>),
    Empty,
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Owned(v) => v,
            FileBytes::Empty => &[],
        }
    }
}

fn open_mapped(path: &Path, what: String) -> Result<FileBytes> {
    if vfs::is_mounted(path) {
        // A simulated disk cannot be mapped: read it whole.
        return Ok(FileBytes::Owned(vfs::read(path).map_err(io_error(what))?));
    }
    let file = std::fs::File::open(path).map_err(io_error(what.clone()))?;
    let len = file.metadata().map_err(io_error(what.clone()))?.len();
    if len == 0 {
        return Ok(FileBytes::Empty);
    }
    // SAFETY: checkpoint files are immutable once renamed into place (see
    // the module docs); nothing writes or truncates them while a restore
    // reads them. The mapping is read-only.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_error(what))?;
    Ok(FileBytes::Mapped(map))
}

/// A verified file: its bytes, page records and the epoch it was taken at.
pub(crate) struct Verified {
    pub(crate) bytes: FileBytes,
    pub(crate) records: Vec<Record>,
    /// The epoch of the snapshot that wrote the file: every slot stamp in
    /// it is at most this.
    pub(crate) epoch: u32,
}

/// Reads a file of checkpoint `checkpoint` and verifies all of it: size and
/// whole-file CRC against the handle, header, every page record's CRC, and
/// the trailer. Any failure is [`Error::Corrupt`] naming the file, the
/// page record (when one is to blame) and both CRCs.
pub(crate) fn read_verified(root: &Path, checkpoint: u64, file: &StateFile, layout: &SlotLayout) -> Result<Verified> {
    let what = format!("reading state file {} of checkpoint {checkpoint}", file.path);
    let bytes = open_mapped(&root.join(&file.path), what)?;
    verify(bytes, checkpoint, file, layout)
}

/// How errors name the inline image of a snapshot of `checkpoint`.
pub(crate) fn inline_name(checkpoint: u64) -> String {
    format!("(inline state image of checkpoint {checkpoint})")
}

/// [`read_verified`] of the image of an inline snapshot. The image's
/// size and whole CRC are not recorded apart from it (the task state frame
/// that carries it has its own CRC), so those two checks are taken as given;
/// header, every record and the trailer are checked as for a file.
pub(crate) fn verify_inline(image: Vec<u8>, checkpoint: u64, layout: &SlotLayout) -> Result<Verified> {
    let file = StateFile {
        path: inline_name(checkpoint),
        size: image.len() as u64,
        crc32: crc(&image),
    };
    verify(FileBytes::Owned(image), checkpoint, &file, layout)
}

/// Verifies the bytes of `file`; see [`read_verified`].
fn verify(bytes: FileBytes, checkpoint: u64, file: &StateFile, layout: &SlotLayout) -> Result<Verified> {
    let check = FileCheck {
        checkpoint,
        file,
        len: bytes.len(),
    };
    let (complete, body_end) = check_header(&bytes, &check, layout)?;
    // Walk the record headers (sequential: lengths chain), then check the
    // records' CRCs in parallel.
    let (records, parse_error) = walk_records(&bytes, body_end, &check, layout);
    check_records(&bytes, &records, &check, layout)?;
    if let Some(e) = parse_error {
        return Err(e);
    }
    if !complete {
        let what = format!("truncated: {}", check.sizes());
        return Err(check.corrupt(Some(records.len()), file.crc32, crc(&bytes), what));
    }
    check_trailer(&bytes, body_end, records.len(), &check)?;
    let epoch = u32_at(&bytes, 32);
    Ok(Verified { bytes, records, epoch })
}

/// The state file being verified, for its errors.
struct FileCheck<'a> {
    checkpoint: u64,
    file: &'a StateFile,
    /// Its length as read.
    len: usize,
}

impl FileCheck<'_> {
    /// A corruption of the file, at page record `page` if known.
    fn corrupt(&self, page: Option<usize>, expected: u32, actual: u32, what: String) -> Error {
        Error::Corrupt {
            checkpoint: self.checkpoint,
            file: self.file.path.clone(),
            page: page.map(|p| p as u64),
            expected,
            actual,
            what,
        }
    }

    /// The file's length against the one the checkpoint recorded.
    fn sizes(&self) -> String {
        format!("file is {} bytes, the checkpoint recorded {}", self.len, self.file.size)
    }
}

/// Checks the file header against `layout` and the file's length against
/// the recorded one. Returns whether the file is complete (of the recorded
/// length) and where its page records end.
fn check_header(bytes: &[u8], check: &FileCheck, layout: &SlotLayout) -> Result<(bool, usize)> {
    let (checkpoint, file, len) = (check.checkpoint, check.file, check.len);
    if len < HEADER_LEN {
        return Err(check.corrupt(
            None,
            file.crc32,
            crc(bytes),
            format!("truncated header: {}", check.sizes()),
        ));
    }
    let (stored, actual) = (u32_at(bytes, 44), crc(&bytes[..44]));
    if stored != actual {
        return Err(check.corrupt(None, stored, actual, "file header checksum".into()));
    }
    let header_ok = &bytes[0..8] == MAGIC
        && u32_at(bytes, 8) == VERSION
        && u32_at(bytes, 12) >> 8 == kind_code(layout.kind)
        && u32_at(bytes, 16) == layout.page_size
        && u32_at(bytes, 20) == layout.slot_size
        && u32_at(bytes, 40) == layout.key_bytes
        && u64::from_le_bytes(bytes[24..32].try_into().expect("8 bytes")) <= checkpoint;
    if !header_ok {
        return Err(Error::State {
            context: format!("restoring state file {} of checkpoint {checkpoint}", file.path),
            message: format!("file header does not match the restoring store's layout {layout:?}"),
        });
    }
    if len as u64 > file.size {
        return Err(check.corrupt(
            None,
            file.crc32,
            crc(bytes),
            format!("file too long: {}", check.sizes()),
        ));
    }
    let complete = len as u64 == file.size;
    if complete && len < HEADER_LEN + TRAILER_LEN {
        return Err(check.corrupt(
            None,
            file.crc32,
            crc(bytes),
            format!("no room for a trailer: {}", check.sizes()),
        ));
    }
    let body_end = if complete {
        len.saturating_sub(TRAILER_LEN).max(HEADER_LEN)
    } else {
        len
    };
    Ok((complete, body_end))
}

/// The page records up to `body_end`, by their headers (lengths chain, so
/// in order), and the error that stopped the walk early, if any.
fn walk_records(bytes: &[u8], body_end: usize, check: &FileCheck, layout: &SlotLayout) -> (Vec<Record>, Option<Error>) {
    let file = check.file;
    let slot = layout.slot_size as usize;
    let spp = layout.slots_per_page() as u32;
    let mut records = Vec::new();
    let mut parse_error = None;
    let mut at = HEADER_LEN;
    while at < body_end {
        let i = records.len();
        if at + RECORD_HEADER_LEN > body_end {
            let what = format!("page record header cut off: {}", check.sizes());
            parse_error = Some(check.corrupt(Some(i), file.crc32, crc(bytes), what));
            break;
        }
        let (page, kg, k, count) = (
            u32_at(bytes, at),
            u32_at(bytes, at + 4),
            u32_at(bytes, at + 8),
            u32_at(bytes, at + 12),
        );
        let stored = u32_at(bytes, at + 16);
        let kind = match (k, count) {
            (0, c) if c == layout.page_size => Some(RecordKind::Full),
            (1, n) if n >= 1 && n <= spp => Some(RecordKind::Delta(n)),
            (2, n) if n >= 1 && n < layout.page_size => Some(RecordKind::Packed(n)),
            _ => None,
        };
        let Some(kind) = kind else {
            let what = "page record header invalid (kind or length)".to_string();
            parse_error = Some(check.corrupt(Some(i), stored, crc(&bytes[at..at + 16]), what));
            break;
        };
        let rec = Record {
            start: at,
            page,
            kg,
            kind,
        };
        let end = match kind {
            RecordKind::Full => at + RECORD_HEADER_LEN + layout.page_size as usize,
            RecordKind::Delta(n) => at + RECORD_HEADER_LEN + n as usize * (4 + slot),
            RecordKind::Packed(n) => at + RECORD_HEADER_LEN + n as usize,
        };
        if end > body_end {
            let what = format!("page record cut off: {}", check.sizes());
            parse_error = Some(check.corrupt(Some(i), stored, crc(&bytes[at..body_end]), what));
            break;
        }
        records.push(rec);
        at = end;
    }
    (records, parse_error)
}

/// Checks every page record's CRC, in parallel; the error names the first
/// bad one.
fn check_records(bytes: &[u8], records: &[Record], check: &FileCheck, layout: &SlotLayout) -> Result<()> {
    let bad = records.par_iter().enumerate().find_first(|(_, r)| {
        let end = r.start + RECORD_HEADER_LEN + r.payload(bytes, layout).len();
        record_crc(&bytes[r.start..end]) != u32_at(bytes, r.start + 16)
    });
    if let Some((i, r)) = bad {
        let end = r.start + RECORD_HEADER_LEN + r.payload(bytes, layout).len();
        let (stored, actual) = (u32_at(bytes, r.start + 16), record_crc(&bytes[r.start..end]));
        let what = format!(
            "page checksum (page {} of key group {} at byte {})",
            r.page, r.kg, r.start
        );
        return Err(check.corrupt(Some(i), stored, actual, what));
    }
    Ok(())
}

/// Checks the trailer at `body_end` (its CRC, the body's CRC, the count of
/// `records`), then the whole file against the checkpoint's record of it.
fn check_trailer(bytes: &[u8], body_end: usize, records: usize, check: &FileCheck) -> Result<()> {
    let t = &bytes[body_end..];
    let (stored, actual) = (u32_at(t, 20), crc(&t[..20]));
    if t.len() != TRAILER_LEN || stored != actual {
        return Err(check.corrupt(None, stored, actual, "file trailer checksum".into()));
    }
    let body = par_crc(&bytes[..body_end]);
    let (stored, actual) = (u32_at(t, 16), body.clone().finalize());
    if &t[0..8] != TRAILER_MAGIC || stored != actual {
        return Err(check.corrupt(None, stored, actual, "checksum of the file body (trailer)".into()));
    }
    let count = u64::from_le_bytes(t[8..16].try_into().expect("8 bytes"));
    if count != records as u64 {
        let what = format!("trailer counts {count} page records, the file has {records}");
        return Err(check.corrupt(None, stored, actual, what));
    }
    let mut whole = body;
    whole.update(t);
    let actual = whole.finalize();
    if actual != check.file.crc32 {
        return Err(check.corrupt(
            None,
            check.file.crc32,
            actual,
            "whole-file checksum recorded by the checkpoint".into(),
        ));
    }
    Ok(())
}
