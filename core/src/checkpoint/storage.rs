//! The on-disk layout of checkpoints and the durable-write protocol.
//!
//! ```text
//! <dir>/
//!   chk-0000000042/            one folder per checkpoint
//!     task-003-001.state       task state of chain 3, subtask 1 (large ones only)
//!     MANIFEST                 made empty ahead, written last: 42 is
//!                              complete once it holds a whole manifest
//!   shared/                    files shared between checkpoints (state backend)
//! ```
//!
//! Every task or shared file is written to a hidden temporary name, fsynced,
//! renamed to its final name, and its folder fsynced, so a crash at any
//! instant leaves either no file or the whole file. The manifest is written
//! only after every file it names is durable, and differently: its file and
//! folder are made, empty, ahead of the checkpoint's trigger (after the
//! previous one completed), and their entries synced; completing it is
//! then one write into that file and one `fdatasync` (a temporary name and
//! a rename would cost a second sync, of the folder, on the path to
//! visible output). A crash during that write can leave the file empty,
//! cut short, or with some 512-byte sectors written and others not; the
//! manifest's framing tells such a file (*unfinished*: the checkpoint never
//! completed, and is never restored) from one damaged after it was durable
//! (an error naming the file and the byte): see [`Manifest::encode`]. A
//! checkpoint folder without a whole manifest is garbage from an unfinished
//! checkpoint and is never restored.
//!
//! Manifest format (version 3): the *payload* cut into 512-byte sectors,
//! each starting with a tag (the first: the magic `WMF3`, the payload's
//! length and a CRC32 of both; every other one: `A5 5A` and the sector's
//! number), so that no sector of a written manifest is ever all zeros. The
//! payload (the whole file in versions 1 and 2, still read): one line of
//! JSON ([`Manifest`]), then a line
//! `crc32 <8 hex digits>` holding the CRC32 of the JSON line's bytes, then
//! the *inline* task states: a task whose whole state is small (at most
//! [`INLINE_TASK_STATE_MAX`] bytes, and no state-backend files) does not get
//! a file of its own; its state frame (the same bytes a task file would
//! hold) follows the CRC line, and its [`ManifestTask`] gives the offset,
//! size and CRC32 of the frame. A checkpoint made of inline states only is
//! one durable file write: no other file has to be made durable first, which
//! is most of a small job's checkpoint time.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::storage::vfs::{self, OpenOptions};

/// Name of a checkpoint's manifest inside its folder.
pub const MANIFEST: &str = "MANIFEST";
/// The manifest format written: 3 (1 had no inline task states, 2 was not
/// framed in sectors; both are read).
pub const MANIFEST_VERSION: u32 = 3;
/// The unit a crash tears a write at, and the manifest's framing unit.
const SECTOR: usize = 512;
/// The first sector's tag: magic.
const FRAME_MAGIC: &[u8; 4] = b"WMF3";
/// The first sector's tag: magic, payload length (u64 LE), CRC32 of both.
const FIRST_TAG: usize = 16;
/// Every other sector's tag: `A5 5A` and the sector's number (u16 LE).
const TAG: usize = 4;
/// Folder for files shared between checkpoints.
pub const SHARED: &str = "shared";
const CHK_PREFIX: &str = "chk-";

/// A file a checkpoint relies on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// Path relative to the checkpoint directory root.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC32 of the whole file.
    pub crc32: u32,
}

/// One task's entry in a manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestTask {
    /// Chain group index in the job graph.
    pub group: usize,
    /// Subtask index.
    pub subtask: usize,
    /// The task's state: its own file, or (with `inline_offset`) the bytes
    /// `inline_offset..inline_offset + size` of the manifest's inline part,
    /// `path` then naming the manifest.
    pub file: FileRef,
    /// Where the task's state starts in the manifest's inline part, for an
    /// inline state; `None` for a state in its own file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_offset: Option<u64>,
    /// Bytes of operator state.
    pub state_bytes: u64,
    /// Bytes of channel state (unaligned).
    pub channel_state_bytes: u64,
    /// Synchronous snapshot time, µs.
    pub sync_us: u64,
    /// Asynchronous snapshot time, µs.
    pub async_us: u64,
    /// Alignment time, µs.
    pub alignment_us: u64,
}

/// One chain of the job graph, as recorded in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestGroup {
    /// Stable operator ids of the chain (`<group>.<index>:<name>`).
    pub operators: Vec<String>,
    /// Parallelism at the time of the checkpoint.
    pub parallelism: usize,
}

/// The description of one completed checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version ([`MANIFEST_VERSION`] when written; 1 to 3 are read).
    pub version: u32,
    /// Job name.
    pub job: String,
    /// Fingerprint of the job graph: restoring into another graph is refused.
    pub fingerprint: String,
    /// Checkpoint id.
    pub id: u64,
    /// Mode the checkpoint was taken in.
    pub mode: super::CheckpointMode,
    /// True for the final checkpoint of a bounded job.
    pub is_final: bool,
    /// Wall-clock trigger time, milliseconds since the Unix epoch.
    pub trigger_unix_ms: u64,
    /// Trigger to durable manifest, µs.
    pub duration_us: u64,
    /// Chains of the job graph.
    pub groups: Vec<ManifestGroup>,
    /// Per-task entries.
    pub tasks: Vec<ManifestTask>,
    /// Every file this checkpoint relies on, with size and CRC32 (inline
    /// task states are not files and are not listed).
    pub files: Vec<FileRef>,
    /// The inline task states: the manifest's bytes after its CRC line,
    /// each frame verified against its task's CRC32 by [`Manifest::decode`].
    #[serde(skip)]
    pub inline: Vec<u8>,
}

impl ManifestTask {
    /// The task's state frame: a slice of the manifest's inline part, or
    /// the contents of its file under `root` (not verified here: see
    /// [`verify_files`]).
    pub fn state_bytes_in<'m>(
        &self,
        root: &Path,
        manifest: &'m Manifest,
    ) -> std::io::Result<std::borrow::Cow<'m, [u8]>> {
        match self.inline_offset {
            Some(off) => self
                .inline_frame(&manifest.inline)
                .map(std::borrow::Cow::Borrowed)
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "inline state at {off}+{} lies outside the manifest's {} inline bytes",
                            self.file.size,
                            manifest.inline.len()
                        ),
                    )
                }),
            None => vfs::read(root.join(&self.file.path)).map(std::borrow::Cow::Owned),
        }
    }

    /// This inline state's frame in `inline`; `None` if it is not inline or
    /// does not lie inside.
    fn inline_frame<'i>(&self, inline: &'i [u8]) -> Option<&'i [u8]> {
        let start = usize::try_from(self.inline_offset?).ok()?;
        let end = start.checked_add(usize::try_from(self.file.size).ok()?)?;
        inline.get(start..end)
    }
}

/// The folder of checkpoint `id`.
pub fn checkpoint_dir(root: &Path, id: u64) -> PathBuf {
    root.join(format!("{CHK_PREFIX}{id:010}"))
}

pub(crate) fn task_file_name(group: usize, subtask: usize) -> String {
    format!("task-{group:03}-{subtask:03}.state")
}

/// fsyncs a folder so that renames and creations in it are durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    crate::storage::disk::sync_dir(dir)
}

/// When the folder entry of a file written by [`write_durable`] becomes
/// durable (its data is always synced before the rename).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DirSync {
    /// Now: the folder is fsynced before returning.
    Now,
    /// Later, once for all task files of a checkpoint: the coordinator
    /// fsyncs the checkpoint's folder before it writes the manifest that
    /// names them. A crash before that leaves no manifest: the checkpoint
    /// is incomplete and ignored.
    Deferred,
}

/// Creates the folder of checkpoint `id`, which must not exist (an
/// `AlreadyExists` error otherwise: a checkpoint never writes into another
/// one's folder). Its entry is not synced here: see [`prepare_checkpoint`].
pub(crate) fn create_checkpoint_dir(root: &Path, id: u64) -> std::io::Result<()> {
    vfs::create_dir(checkpoint_dir(root, id))
}

/// Makes checkpoint `id`'s folder (made by [`create_checkpoint_dir`])
/// ready for its manifest's one-sync commit: creates its `MANIFEST`, empty,
/// and syncs the folder and `root`, so that both entries are durable
/// before the manifest is written. The coordinator calls it ahead of the
/// trigger, once the previous checkpoint completed (or else at the
/// trigger, while the barriers travel), off the path to visible output.
/// An empty (or unfinished) manifest is an incomplete checkpoint, never
/// restored.
pub(crate) fn prepare_checkpoint(root: &Path, id: u64) -> std::io::Result<()> {
    let dir = checkpoint_dir(root, id);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dir.join(MANIFEST))?;
    sync_dir(&dir)?;
    sync_dir(root)
}

/// Writes `bytes` to `dir/name` durably (temporary name, fsync, rename,
/// fsync folder now or deferred); returns the file's reference relative
/// to `root`.
pub(crate) fn write_durable(
    root: &Path,
    dir: &Path,
    name: &str,
    bytes: &[u8],
    dir_sync: DirSync,
) -> std::io::Result<FileRef> {
    crate::storage::fault::hit("checkpoint.write.before")?;
    if !vfs::exists(dir) {
        vfs::create_dir_all(dir)?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
    }
    let tmp = dir.join(format!(".{name}.tmp"));
    let target = dir.join(name);
    {
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
        f.write_all(bytes)?;
        crate::storage::fault::hit("checkpoint.write.before-fsync")?;
        // Data and size; other metadata (times) does not matter here.
        f.sync_data()?;
    }
    crate::storage::fault::hit("checkpoint.write.before-rename")?;
    vfs::rename(&tmp, &target)?;
    if dir_sync == DirSync::Now {
        sync_dir(dir)?;
    }
    let rel = target
        .strip_prefix(root)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| target.to_string_lossy().into_owned());
    Ok(FileRef {
        path: rel,
        size: bytes.len() as u64,
        crc32: crc32fast::hash(bytes),
    })
}

/// What a manifest file holds.
#[derive(Debug)]
pub(crate) enum ManifestFile {
    /// A whole manifest that verifies: its checkpoint is complete.
    Complete(Manifest),
    /// Nothing, or a write that a crash stopped before its `fdatasync`
    /// returned (empty, cut short, or with sectors of zeros): its
    /// checkpoint never completed. The reason, for the log.
    Unfinished(String),
}

impl Manifest {
    /// The manifest file's bytes. Version 3 and later: the payload (the
    /// JSON line, its CRC line, the inline task states) framed in 512-byte
    /// sectors, each behind a tag that is never zero, so that a sector a
    /// crash left unwritten (zeros) is told from a damaged one. Versions 1
    /// and 2 (still written by tests of the reader): the payload alone.
    pub fn encode(&self) -> Vec<u8> {
        let payload = self.encode_payload();
        if self.version < 3 {
            return payload;
        }
        let mut out = Vec::with_capacity(framed_len(payload.len() as u64) as usize);
        let mut head = [0u8; FIRST_TAG];
        head[..4].copy_from_slice(FRAME_MAGIC);
        head[4..12].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        let crc = crc32fast::hash(&head[..12]);
        head[12..].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&head);
        let (first, rest) = payload.split_at(payload.len().min(SECTOR - FIRST_TAG));
        out.extend_from_slice(first);
        for (i, chunk) in rest.chunks(SECTOR - TAG).enumerate() {
            out.extend_from_slice(&sector_tag(i + 1));
            out.extend_from_slice(chunk);
        }
        debug_assert_eq!(out.len() as u64, framed_len(payload.len() as u64));
        out
    }

    /// The JSON line, its CRC line, the inline task states.
    fn encode_payload(&self) -> Vec<u8> {
        let json = serde_json::to_string(self).expect("manifest always serialises");
        let mut out = format!("{json}\ncrc32 {:08x}\n", crc32fast::hash(json.as_bytes())).into_bytes();
        out.extend_from_slice(&self.inline);
        out
    }

    /// Parses and verifies a manifest's bytes, inline task states included;
    /// `path` names it in errors, with the byte position of what is wrong.
    /// A file that a crash left unfinished (empty, cut short, or with a
    /// sector of zeros) is an error here.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Manifest, String> {
        match Self::decode_file(bytes, path) {
            Ok(ManifestFile::Complete(m)) => Ok(m),
            Ok(ManifestFile::Unfinished(why)) => Err(format!("{}: unfinished manifest: {why}", path.display())),
            Err((_, e)) => Err(e),
        }
    }

    /// [`Manifest::decode`], an unfinished file told apart, a failure with
    /// the byte the damage starts at.
    pub(crate) fn decode_file(bytes: &[u8], path: &Path) -> Result<ManifestFile, (u64, String)> {
        if bytes.is_empty() {
            return Ok(ManifestFile::Unfinished("empty: nothing was written".into()));
        }
        if bytes[0] == b'{' {
            // Versions 1 and 2: the payload alone, its JSON line first.
            return Self::decode_payload(bytes, path, 2, &|at| at).map(ManifestFile::Complete);
        }
        if bytes[..bytes.len().min(SECTOR)].iter().all(|&b| b == 0) {
            return Ok(ManifestFile::Unfinished(
                "its first sector is zeros: a crash stopped its write".into(),
            ));
        }
        Self::decode_framed(bytes, path)
    }

    /// A framed manifest (version 3): the sectors checked, the payload
    /// decoded, every position given in the file's bytes.
    fn decode_framed(bytes: &[u8], path: &Path) -> Result<ManifestFile, (u64, String)> {
        let p = path.display();
        let Some(head) = bytes.get(..FIRST_TAG) else {
            return Ok(ManifestFile::Unfinished(format!(
                "cut short inside its first sector's tag ({} bytes): a crash stopped its write",
                bytes.len()
            )));
        };
        if &head[..4] != FRAME_MAGIC {
            return Err((
                0,
                format!("{p}: not a manifest: its first bytes are neither a JSON line nor the magic WMF3"),
            ));
        }
        let crc = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
        if crc != crc32fast::hash(&head[..12]) {
            return Err((4, format!("{p}: the first sector's tag (bytes 0..16) does not verify")));
        }
        let payload_len = u64::from_le_bytes(head[4..12].try_into().expect("8 bytes"));
        let expected = framed_len(payload_len);
        let len = bytes.len() as u64;
        if len < expected {
            return Ok(ManifestFile::Unfinished(format!(
                "cut short: {len} of its {expected} bytes, a crash stopped its write"
            )));
        }
        if len > expected {
            return Err((
                expected,
                format!("{p}: {len} bytes, its first sector says {expected}: extended at byte {expected}"),
            ));
        }
        // Sectors of zeros first: a crash's tear, whatever else is wrong.
        for (i, sector) in bytes.chunks(SECTOR).enumerate() {
            if sector.iter().all(|&b| b == 0) {
                let at = i * SECTOR;
                return Ok(ManifestFile::Unfinished(format!(
                    "sector {i} (bytes {at}..{}) is zeros: a crash stopped its write",
                    at + sector.len()
                )));
            }
        }
        let mut payload = Vec::with_capacity(payload_len as usize);
        for (i, sector) in bytes.chunks(SECTOR).enumerate() {
            if i == 0 {
                payload.extend_from_slice(&sector[FIRST_TAG..]);
                continue;
            }
            if sector.len() <= TAG || sector[..TAG] != sector_tag(i) {
                let at = (i * SECTOR) as u64;
                return Err((at, format!("{p}: the tag of sector {i} at byte {at} does not verify")));
            }
            payload.extend_from_slice(&sector[TAG..]);
        }
        Self::decode_payload(&payload, path, MANIFEST_VERSION, &payload_to_file).map(ManifestFile::Complete)
    }

    /// Decodes a payload: its version at most `newest`; `at` maps a
    /// position in the payload to one in the file.
    fn decode_payload(
        bytes: &[u8],
        path: &Path,
        newest: u32,
        at: &dyn Fn(u64) -> u64,
    ) -> Result<Manifest, (u64, String)> {
        let p = path.display();
        let located = |(pos, e): (u64, String)| (at(pos), e);
        let (json_end, json) = Self::json_line(bytes, path).map_err(located)?;
        Self::check_crc_line(bytes, json_end, json, path).map_err(located)?;
        let mut m: Manifest =
            serde_json::from_str(json).map_err(|e| (at(0), format!("{p}: manifest does not parse: {e}")))?;
        if m.version == 0 || m.version > newest {
            let why = if m.version > MANIFEST_VERSION {
                "written by a newer weir?"
            } else {
                "not in this file's framing"
            };
            return Err((
                at(0),
                format!(
                    "{p}: manifest format version {} (this build reads 1 to {MANIFEST_VERSION}): {why}",
                    m.version
                ),
            ));
        }
        let inline_start = json_end + 16;
        m.inline = bytes[inline_start..].to_vec();
        m.check_inline_states(bytes, inline_start, path, at)?;
        Ok(m)
    }

    /// The manifest's first line, the JSON, and where it ends.
    fn json_line<'a>(bytes: &'a [u8], path: &Path) -> Result<(usize, &'a str), (u64, String)> {
        let p = path.display();
        let json_end = bytes.iter().position(|&b| b == b'\n').ok_or_else(|| {
            (
                bytes.len() as u64,
                format!("{p}: truncated ({} bytes, no line end)", bytes.len()),
            )
        })?;
        let json = std::str::from_utf8(&bytes[..json_end]).map_err(|e| {
            (
                e.valid_up_to() as u64,
                format!("{p}: not UTF-8 at byte {}", e.valid_up_to()),
            )
        })?;
        Ok((json_end, json))
    }

    /// Checks the line after the JSON line, the JSON's CRC.
    fn check_crc_line(bytes: &[u8], json_end: usize, json: &str, path: &Path) -> Result<(), (u64, String)> {
        let p = path.display();
        // "crc32 " + 8 hex digits + "\n"
        let crc_line = bytes
            .get(json_end + 1..json_end + 16)
            .filter(|l| l.starts_with(b"crc32 ") && l[14] == b'\n')
            .ok_or_else(|| {
                let at = json_end as u64 + 1;
                // The first line end is the JSON line's own only if that
                // line parses. If the real one was damaged, the first found
                // is a later one (the CRC line's), and the damage lies
                // anywhere in the JSON line: say so from byte 0, not from a
                // position past the damage.
                if serde_json::from_str::<serde::de::IgnoredAny>(json).is_ok() {
                    (at, format!("{p}: missing or malformed crc32 line at byte {at}"))
                } else {
                    (
                        0,
                        format!(
                            "{p}: no crc32 line after the first line end (byte {json_end}), and the line before it is not JSON: the manifest line or its end is damaged"
                        ),
                    )
                }
            })?;
        let crc_hex = std::str::from_utf8(&crc_line[6..14]).unwrap_or("?");
        // Lowercase only, as written: an upper-case digit is a flipped bit
        // that `from_str_radix` would let through.
        let canonical = crc_line[6..14].iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let expected = u32::from_str_radix(crc_hex, 16)
            .ok()
            .filter(|_| canonical)
            .ok_or_else(|| {
                let at = json_end as u64 + 7;
                (at, format!("{p}: bad crc32 value '{crc_hex}' at byte {at}"))
            })?;
        let actual = crc32fast::hash(json.as_bytes());
        if expected != actual {
            return Err((
                0,
                format!(
                    "{p}: CRC mismatch over bytes 0..{}: expected {expected:08x}, actual {actual:08x}",
                    json.len()
                ),
            ));
        }
        Ok(())
    }

    /// Checks the inline task states (after the CRC line, from
    /// `inline_start` in `bytes`): each one's CRC, and that they account for
    /// every byte there.
    /// `at` maps a position in `bytes` to one in the file.
    fn check_inline_states(
        &self,
        bytes: &[u8],
        inline_start: usize,
        path: &Path,
        at_file: &dyn Fn(u64) -> u64,
    ) -> Result<(), (u64, String)> {
        let p = path.display();
        let mut covered = 0u64;
        for t in &self.tasks {
            let Some(off) = t.inline_offset else { continue };
            let start = (inline_start as u64).saturating_add(off);
            let at = at_file(start);
            // The end of the range: one past its last byte's place.
            let end = match t.file.size {
                0 => at,
                n => at_file(start.saturating_add(n - 1)).saturating_add(1),
            };
            let frame = t.inline_frame(&self.inline).ok_or_else(|| {
                (
                    at,
                    format!(
                        "{p}: inline state of task {}/{} at bytes {at}..{end} lies past the end ({} bytes): truncated",
                        t.group,
                        t.subtask,
                        at_file(bytes.len() as u64)
                    ),
                )
            })?;
            let actual = crc32fast::hash(frame);
            if actual != t.file.crc32 {
                return Err((
                    at,
                    format!(
                        "{p}: CRC mismatch in the inline state of task {}/{} at bytes {at}..{end}: expected {:08x}, actual {actual:08x}",
                        t.group,
                        t.subtask,
                        t.file.crc32
                    ),
                ));
            }
            covered = covered.saturating_add(t.file.size);
        }
        if covered != self.inline.len() as u64 {
            let at = at_file(inline_start as u64);
            return Err((
                at,
                format!(
                    "{p}: {} bytes after the CRC line (from byte {at}), the inline states account for {covered}",
                    self.inline.len()
                ),
            ));
        }
        Ok(())
    }

    /// Makes the manifest durable: the checkpoint is complete afterwards.
    /// `task_files`: task files of this checkpoint were written (data synced
    /// by their writers, folder entries deferred); `shared`: state-backend
    /// files were renamed into `shared/` the same way. Those folders are
    /// fsynced first, so that every file the manifest names is durable
    /// before the manifest exists. A checkpoint of inline states only skips
    /// both: the manifest is then its only new file.
    ///
    /// `prepared`: the coordinator made the checkpoint's folder and its
    /// empty `MANIFEST` ahead and synced both entries
    /// ([`prepare_checkpoint`]): the manifest is then written into that
    /// file and made durable with one `fdatasync`, the only disk wait
    /// after the sinks' own. Otherwise it is written the way of every other
    /// file (temporary name, `fdatasync`, rename, the folder's and the
    /// root's fsync).
    ///
    /// This replaced one `syncfs(2)` for all task files: that also flushed
    /// everything else dirty on the filesystem (the memory-mapped state's
    /// working files, sinks' logs), 3-10 ms per checkpoint under load.
    pub(crate) fn commit(&self, root: &Path, task_files: bool, shared: bool, prepared: bool) -> std::io::Result<()> {
        let dir = checkpoint_dir(root, self.id);
        crate::storage::fault::hit("checkpoint.manifest.before")?;
        if task_files {
            sync_dir(&dir)?;
        }
        if shared {
            sync_dir(&root.join(SHARED))?;
        }
        let bytes = self.encode();
        if prepared {
            crate::storage::fault::hit("checkpoint.write.before")?;
            let mut f = OpenOptions::new().write(true).open(dir.join(MANIFEST))?;
            f.write_all(&bytes)?;
            crate::storage::fault::hit("checkpoint.write.before-fsync")?;
            // Data and size: the file's entry is durable already.
            f.sync_data()?;
        } else {
            write_durable(root, &dir, MANIFEST, &bytes, DirSync::Now)?;
            // The folder's own entry (`write_durable` syncs the root
            // itself only when it had to create the folder).
            sync_dir(root)?;
        }
        crate::storage::fault::hit("checkpoint.manifest.after")?;
        Ok(())
    }
}

/// The bytes of a framed manifest whose payload has `payload` bytes.
fn framed_len(payload: u64) -> u64 {
    let first = (SECTOR - FIRST_TAG) as u64;
    if payload <= first {
        return FIRST_TAG as u64 + payload;
    }
    let rest = payload - first;
    let per = (SECTOR - TAG) as u64;
    let (full, part) = (rest / per, rest % per);
    SECTOR as u64 + full * SECTOR as u64 + if part > 0 { TAG as u64 + part } else { 0 }
}

/// Where byte `pos` of a framed manifest's payload lies in its file.
fn payload_to_file(pos: u64) -> u64 {
    let first = (SECTOR - FIRST_TAG) as u64;
    if pos < first {
        return FIRST_TAG as u64 + pos;
    }
    let per = (SECTOR - TAG) as u64;
    let rest = pos - first;
    (1 + rest / per) * SECTOR as u64 + TAG as u64 + rest % per
}

/// The tag of sector `i` (not the first): never zero, and a single
/// flipped bit can never make it zero.
fn sector_tag(i: usize) -> [u8; TAG] {
    let n = (i as u16).to_le_bytes();
    [0xa5, 0x5a, n[0], n[1]]
}

/// Ids of the checkpoint folders under `root`, ascending (complete or not).
pub fn list_ids(root: &Path) -> std::io::Result<Vec<u64>> {
    let mut ids = Vec::new();
    let names = match vfs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ids),
        Err(e) => return Err(e),
    };
    for name in names {
        if let Some(id) = name.strip_prefix(CHK_PREFIX).and_then(|n| n.parse().ok()) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Reads and verifies the manifest of checkpoint `id`; `Ok(None)` if the
/// folder has no manifest (an unfinished checkpoint).
pub fn read_manifest(root: &Path, id: u64) -> Result<Option<Manifest>, String> {
    read_manifest_located(root, id).map_err(|e| e.message)
}

/// Why a manifest or a checkpoint's file could not be read or verified: the
/// message, and for damaged bytes (a failed check, not an I/O error) the
/// file and the byte they start at.
#[derive(Debug)]
pub(crate) struct CheckFailed {
    pub(crate) message: String,
    pub(crate) damaged: Option<(PathBuf, u64)>,
}

impl CheckFailed {
    /// Reports damaged bytes ([`crate::storage::corruption::report`]) that the
    /// caller goes on without, `instead` saying what it does; an I/O error
    /// is no damage and is not reported.
    pub(crate) fn report_damage(&self, instead: &str) {
        if let Some((file, at)) = &self.damaged {
            crate::storage::corruption::report(file, *at, &format!("{}; {instead}", self.message));
        }
    }
}

/// [`read_manifest`], telling damaged bytes from I/O errors.
pub(crate) fn read_manifest_located(root: &Path, id: u64) -> Result<Option<Manifest>, CheckFailed> {
    match read_manifest_file(root, id)? {
        Some(ManifestFile::Complete(m)) => Ok(Some(m)),
        Some(ManifestFile::Unfinished(why)) => {
            tracing::debug!(checkpoint = id, why = %why, "an unfinished manifest: the checkpoint is incomplete");
            Ok(None)
        }
        None => Ok(None),
    }
}

/// What checkpoint `id`'s manifest file holds; `None` if there is none.
pub(crate) fn read_manifest_file(root: &Path, id: u64) -> Result<Option<ManifestFile>, CheckFailed> {
    let path = checkpoint_dir(root, id).join(MANIFEST);
    match vfs::read(&path) {
        Ok(bytes) => Manifest::decode_file(&bytes, &path)
            .map(Some)
            .map_err(|(at, message)| CheckFailed {
                message,
                damaged: Some((path, at)),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CheckFailed {
            message: format!("{}: {e}", path.display()),
            damaged: None,
        }),
    }
}

/// Why checkpoint `id` is incomplete, if it is: `Some` for a folder with
/// no manifest or an unfinished one (see [`Manifest::decode`]), the
/// reason; `None` for a complete checkpoint, and for one whose manifest
/// is damaged or cannot be read: such a one is never taken for
/// incomplete, so that a restore stops at it instead of silently
/// skipping it.
pub fn incomplete(root: &Path, id: u64) -> Option<String> {
    match read_manifest_file(root, id) {
        Ok(None) => Some("no MANIFEST".into()),
        Ok(Some(ManifestFile::Unfinished(why))) => Some(format!("unfinished MANIFEST: {why}")),
        Ok(Some(ManifestFile::Complete(_))) => None,
        Err(e) => {
            e.report_damage(&format!(
                "read to tell whether checkpoint {id} is complete: taken for complete, so that a restore reads it again and stops if it does not verify"
            ));
            None
        }
    }
}

/// Whether checkpoint `id` has a manifest that is not unfinished (see
/// [`incomplete`]).
pub fn is_complete(root: &Path, id: u64) -> bool {
    incomplete(root, id).is_none()
}

/// Checks every file of a manifest: present, of the recorded size, with the
/// recorded CRC32. The error names the checkpoint, the file and what is
/// wrong (for a CRC mismatch, the expected and actual values).
pub fn verify_files(root: &Path, manifest: &Manifest) -> Result<(), String> {
    verify_files_located(root, manifest).map_err(|e| e.message)
}

/// [`verify_files`], telling damaged files from I/O errors. Each file is
/// read once in [`VERIFY_CHUNK`] pieces into one buffer. A restart's
/// restore waits for this: read whole into a buffer of its size (fresh
/// pages, a fault each), 1 GiB of state took 1.4 s here.
pub(crate) fn verify_files_located(root: &Path, manifest: &Manifest) -> Result<(), CheckFailed> {
    let mut buf = Vec::new();
    for f in &manifest.files {
        verify_file_located(&root.join(&f.path), manifest.id, f, &mut buf)?;
    }
    Ok(())
}

/// Bytes of a checkpoint file read and checked at a time: 1 MiB.
pub(crate) const VERIFY_CHUNK: usize = 1 << 20;

/// [`verify_files_located`] of one file, at `path`, as the manifest of
/// checkpoint `id` records it (`f`).
fn verify_file_located(path: &Path, id: u64, f: &FileRef, buf: &mut Vec<u8>) -> Result<(), CheckFailed> {
    let damaged = |path: &Path, at: u64, message: String| CheckFailed {
        message,
        damaged: Some((path.to_path_buf(), at)),
    };
    let io = |message: String| CheckFailed { message, damaged: None };
    let file = vfs::File::open(path).map_err(|e| {
        let message = format!(
            "checkpoint {}: file {} is missing or unreadable: {e}",
            id,
            path.display()
        );
        if e.kind() == std::io::ErrorKind::NotFound {
            damaged(path, 0, message)
        } else {
            io(message)
        }
    })?;
    // The size first, from the file system: a size in the manifest is
    // never trusted for an allocation, nor a file read past it.
    let len = file
        .metadata()
        .map_err(|e| io(format!("checkpoint {}: reading {}: {e}", id, path.display())))?
        .len();
    if len != f.size {
        return Err(damaged(
            path,
            len.min(f.size),
            format!(
                "checkpoint {}: file {} has {len} bytes, the manifest says {} (truncated or extended at byte {})",
                id,
                path.display(),
                f.size,
                len.min(f.size)
            ),
        ));
    }
    buf.resize(VERIFY_CHUNK.min(len as usize).max(buf.len()), 0);
    let mut crc = crc32fast::Hasher::new();
    let mut read = 0u64;
    let mut file = file.take(len);
    loop {
        let n = match file.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(format!("checkpoint {}: reading {}: {e}", id, path.display()))),
        };
        crc.update(&buf[..n]);
        read += n as u64;
    }
    if read != f.size {
        return Err(damaged(
            path,
            read,
            format!(
                "checkpoint {}: file {} has {} bytes, the manifest says {} (truncated or extended at byte {})",
                id,
                path.display(),
                read,
                f.size,
                read
            ),
        ));
    }
    let actual = crc.finalize();
    if actual != f.crc32 {
        return Err(damaged(
            path,
            0,
            format!(
                "checkpoint {}: file {} (bytes 0..{}) CRC mismatch: expected {:08x}, actual {actual:08x}",
                id,
                path.display(),
                f.size,
                f.crc32
            ),
        ));
    }
    Ok(())
}

/// What [`remove_checkpoint`] leaves for its caller to make durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a manifest's removal may still have to be synced before its shared files are deleted"]
pub enum Removal {
    /// Nothing: there was no folder or no manifest, or the manifest's
    /// removal was synced before anything else was deleted.
    Durable,
    /// A folder holding only its manifest was removed without a sync:
    /// `root` must be fsynced before any file that manifest named (in
    /// `shared/`) is deleted.
    SyncRootFirst,
}

/// Deletes checkpoint `id`'s folder (its own files only; shared files are
/// reference-counted by the coordinator).
///
/// The rule: a manifest must never name a deleted file, in any state a
/// crash can leave. Shared files are deleted by the caller, after this.
///
/// A folder holding other files than its manifest (task files) loses its
/// manifest first, durably (the folder fsynced): a crash midway then leaves
/// an incomplete checkpoint (ignored and deleted at the next start), never
/// a manifest naming deleted files.
///
/// A folder with nothing but its manifest (all task states inline) is
/// removed without a sync here, and [`Removal::SyncRootFirst`] returned:
/// its manifest names no file of the folder, but it can name files in
/// `shared/` (the state backend's handles, inline), and the caller must
/// fsync `root` before it deletes any of them. Every crash interleaving:
///
/// - before that fsync returns, no shared file the manifest names has been
///   deleted, so whatever the crash leaves (the folder gone, the folder
///   without its manifest: incomplete, deleted at the next start, or the
///   whole folder back) names no deleted file; a manifest brought back is
///   a whole, older checkpoint, and a restore prefers the newer ones;
/// - after it, the folder's entry is durably gone from `root`: the manifest
///   cannot come back, whatever is deleted next.
///
/// Deleting the shared files first and the folder after would be wrong: a
/// crash in between leaves the manifest naming deleted files. The fsync
/// is the caller's so that one covers every removal before it, and none is
/// made when nothing is deleted after (heap state: `shared/` stays empty);
/// at a checkpoint every 10 ms, a sync per removal was a third of the
/// coordinator's disk waits. The removal of a folder whose manifest went
/// first is never synced: a folder without a manifest is never restored.
pub fn remove_checkpoint(root: &Path, id: u64) -> std::io::Result<Removal> {
    let dir = checkpoint_dir(root, id);
    let names = match vfs::read_dir(&dir) {
        Ok(names) => names,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Removal::Durable),
        Err(e) => return Err(e),
    };
    let mut only_manifest = true;
    let mut has_manifest = false;
    for name in names {
        if name == MANIFEST {
            has_manifest = true;
        } else {
            only_manifest = false;
            break;
        }
    }
    let removal = if !only_manifest {
        match vfs::remove_file(dir.join(MANIFEST)) {
            Ok(()) => sync_dir(&dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Removal::Durable
    } else if has_manifest {
        Removal::SyncRootFirst
    } else {
        Removal::Durable
    };
    match vfs::remove_dir_all(&dir) {
        Ok(()) => {
            crate::storage::disk::trace::note(|| format!("remove {}", dir.display()));
            Ok(removal)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(removal),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn manifest(id: u64) -> Manifest {
        Manifest {
            version: 1,
            job: "j".into(),
            fingerprint: "f".into(),
            id,
            mode: super::super::CheckpointMode::Aligned,
            is_final: false,
            trigger_unix_ms: 1,
            duration_us: 2,
            groups: vec![],
            tasks: vec![],
            files: vec![],
            inline: vec![],
        }
    }

    fn task(subtask: usize, file: FileRef, inline_offset: Option<u64>) -> ManifestTask {
        ManifestTask {
            group: 0,
            subtask,
            file,
            inline_offset,
            state_bytes: 0,
            channel_state_bytes: 0,
            sync_us: 0,
            async_us: 0,
            alignment_us: 0,
        }
    }

    /// A manifest with two inline task states and one in a file.
    fn manifest_with_inline(id: u64) -> Manifest {
        let mut m = manifest(id);
        let (a, b) = (b"first state".to_vec(), b"second, longer state".to_vec());
        let path = format!("chk-{id:010}/MANIFEST");
        let at = |bytes: &[u8]| FileRef {
            path: path.clone(),
            size: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        };
        let own = FileRef {
            path: format!("chk-{id:010}/task-000-002.state"),
            size: 9,
            crc32: 7,
        };
        m.tasks = vec![
            task(0, at(&a), Some(0)),
            task(1, at(&b), Some(a.len() as u64)),
            task(2, own.clone(), None),
        ];
        m.files = vec![own];
        m.inline = [a, b].concat();
        m
    }

    /// Version 3 (framed) of [`manifest_with_inline`], its inline part
    /// long enough for several sectors.
    fn framed_with_inline(id: u64) -> Manifest {
        let mut m = manifest_with_inline(id);
        m.version = MANIFEST_VERSION;
        let long: Vec<u8> = (0..1500u32).map(|i| (i % 7) as u8).collect();
        m.tasks[1].file.size = long.len() as u64;
        m.tasks[1].file.crc32 = crc32fast::hash(&long);
        m.inline = [&m.inline[..11], &long[..]].concat();
        m
    }

    #[test]
    fn manifest_detects_every_flipped_byte_and_truncation() {
        let mut framed_small = manifest(3);
        framed_small.version = MANIFEST_VERSION;
        for m in [
            manifest(3),
            manifest_with_inline(4),
            framed_small,
            framed_with_inline(5),
        ] {
            let bytes = m.encode();
            let p = Path::new("M");
            assert_eq!(Manifest::decode(&bytes, p).unwrap(), m);
            // Every single-bit flip is refused, and the error's position is
            // at or before the flipped byte: the position is where the
            // damage may start, never past it (the storage simulator holds
            // every reader to this). A flip is never taken for a crash's
            // unfinished write.
            for (i, bit, b) in crate::fuzzing::bit_flips(&bytes) {
                match Manifest::decode_file(&b, p) {
                    Ok(ManifestFile::Complete(_)) => panic!("flip of bit {bit} at {i} accepted"),
                    Ok(ManifestFile::Unfinished(why)) => panic!("flip of bit {bit} at {i} taken for a tear: {why}"),
                    Err((at, e)) => assert!(at <= i as u64, "flip of bit {bit} at {i} located at {at}: {e}"),
                }
            }
            for len in 0..bytes.len() {
                assert!(Manifest::decode(&bytes[..len], p).is_err(), "truncated to {len}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(Manifest::decode(&longer, p).is_err(), "a byte appended");
        }
    }

    #[test]
    fn a_manifest_of_an_unknown_version_is_refused() {
        let mut m = manifest(3);
        m.version = MANIFEST_VERSION + 1;
        let e = Manifest::decode(&m.encode(), Path::new("M")).unwrap_err();
        assert!(e.contains("format version 4") && e.contains("newer weir"), "{e}");
    }

    /// What a crash can leave of a framed manifest's write into its empty
    /// file (each 512-byte sector written or not, the length old or new):
    /// unfinished, never damage and never a complete manifest, unless
    /// every sector was written.
    #[test]
    fn every_tear_of_a_framed_manifest_is_unfinished() {
        let m = framed_with_inline(6);
        let bytes = m.encode();
        let sectors = bytes.len().div_ceil(SECTOR);
        assert!(sectors >= 4, "{sectors} sectors");
        let p = Path::new("M");
        for mask in 0..(1u32 << sectors) {
            let mut torn = bytes.clone();
            for (i, sector) in torn.chunks_mut(SECTOR).enumerate() {
                if mask & (1 << i) == 0 {
                    sector.fill(0);
                }
            }
            match Manifest::decode_file(&torn, p) {
                Ok(ManifestFile::Complete(read)) => {
                    assert_eq!(mask, (1 << sectors) - 1, "a torn write taken for whole");
                    assert_eq!(read, m);
                }
                Ok(ManifestFile::Unfinished(_)) => assert_ne!(mask, (1 << sectors) - 1),
                Err((_, e)) => panic!("sectors {mask:b} written: taken for damage: {e}"),
            }
        }
        // The length old (empty) or cut short anywhere.
        for len in 0..bytes.len() {
            assert!(
                matches!(Manifest::decode_file(&bytes[..len], p), Ok(ManifestFile::Unfinished(_))),
                "cut at {len}"
            );
        }
        assert!(Manifest::decode(&[], p).unwrap_err().contains("unfinished"));
    }

    #[test]
    fn framing_positions_map_to_the_file() {
        for payload in [0u64, 1, 495, 496, 497, 1003, 1004, 1005, 5000] {
            let len = framed_len(payload);
            if payload > 0 {
                assert_eq!(payload_to_file(payload - 1) + 1, len, "payload {payload}");
            }
        }
        assert_eq!(payload_to_file(0), 16);
        assert_eq!(payload_to_file(496), 516);
        assert_eq!(payload_to_file(1004), 1028);
    }

    #[test]
    fn inline_states_read_back_and_corruption_names_the_task_and_position() {
        let m = manifest_with_inline(4);
        let bytes = m.encode();
        let read = Manifest::decode(&bytes, Path::new("M")).unwrap();
        let root = Path::new("/nonexistent");
        assert_eq!(&*read.tasks[0].state_bytes_in(root, &read).unwrap(), b"first state");
        assert_eq!(
            &*read.tasks[1].state_bytes_in(root, &read).unwrap(),
            b"second, longer state"
        );
        assert!(
            read.tasks[2].state_bytes_in(root, &read).is_err(),
            "a file task reads its file"
        );
        let mut b = bytes.clone();
        let last = b.len() - 1;
        b[last] ^= 0xff;
        let e = Manifest::decode(&b, Path::new("M")).unwrap_err();
        let start = bytes.len() - 20;
        assert!(
            e.contains("inline state of task 0/1") && e.contains(&format!("bytes {start}..{}", bytes.len())),
            "{e}"
        );
    }

    #[test]
    fn durable_write_and_verify() {
        let root = tempfile::tempdir().unwrap();
        let dir = checkpoint_dir(root.path(), 5);
        let f = write_durable(root.path(), &dir, "a.state", b"hello", DirSync::Deferred).unwrap();
        assert_eq!(f.path, "chk-0000000005/a.state");
        let mut m = manifest(5);
        m.files.push(f.clone());
        m.commit(root.path(), true, false, false).unwrap();
        assert_eq!(list_ids(root.path()).unwrap(), vec![5]);
        let read = read_manifest(root.path(), 5).unwrap().unwrap();
        verify_files(root.path(), &read).unwrap();
        fs::write(dir.join("a.state"), b"hellO").unwrap();
        let e = verify_files(root.path(), &read).unwrap_err();
        assert!(
            e.contains("checkpoint 5") && e.contains("a.state") && e.contains("CRC mismatch"),
            "{e}"
        );
        fs::write(dir.join("a.state"), b"hell").unwrap();
        let e = verify_files(root.path(), &read).unwrap_err();
        assert!(e.contains("has 4 bytes"), "{e}");
        assert_eq!(
            remove_checkpoint(root.path(), 5).unwrap(),
            Removal::Durable,
            "task file: manifest removal synced"
        );
        assert!(list_ids(root.path()).unwrap().is_empty());
    }
}
