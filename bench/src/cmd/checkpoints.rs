//! `weir checkpoints list|inspect|verify DIR`: look into a checkpoint
//! directory without running a job.
//!
//! The command only reads. It understands the two formats a checkpoint is
//! made of (see `docs/checkpointing.md`):
//!
//! - the manifest (`chk-NNNNNNNNNN/MANIFEST`): one line of JSON, then a line
//!   `crc32 <8 hex digits>`, then the inline task states; parsed and checked
//!   (every inline state's CRC32 included) by [`storage::read_manifest`];
//! - a task state frame, in a task state file (`task-GGG-SSS.state`) or
//!   inline in the manifest: `WEIRTSK2` magic (`WEIRTSK1` for format 1, still read; bytes
//!   0..8), payload length `L` as u64 LE (bytes 8..16), the payload (bytes
//!   `16..16+L`), then the CRC32 of the payload as u32 LE (bytes
//!   `16+L..20+L`); decoded here, because the core decodes it only on
//!   restore.
//!
//! `verify` reports every problem it finds, not only the first: a missing
//! or unreadable file, a wrong size, a whole-file CRC32 that differs from
//! the manifest's ([`storage::verify_files`], called once per file), and a
//! task file whose header or payload CRC is wrong, each with the file, the
//! byte range and the expected and actual values.

use std::fs;
use std::path::{Path, PathBuf};

use weir_core::checkpoint::storage::{self, FileRef, Manifest};

use crate::cli::CliError;

/// Arguments of `weir checkpoints`.
#[derive(Debug, clap::Args)]
pub struct CheckpointsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: CheckpointsCommand,
}

/// The `weir checkpoints` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum CheckpointsCommand {
    /// One line per checkpoint folder: id, complete or not, final or not,
    /// mode, trigger time (UTC), duration, tasks, state and channel bytes.
    List {
        /// The checkpoint directory (`CheckpointConfig::dir` of the job).
        dir: PathBuf,
    },
    /// Everything a checkpoint's manifest says, per chain and per task,
    /// with the header of every task state file.
    Inspect {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Checkpoint id [default: the latest complete one].
        id: Option<u64>,
    },
    /// Checks every checksum; prints OK per checkpoint or what is wrong,
    /// and exits with status 1 if anything is.
    Verify {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Checkpoint id [default: every complete checkpoint].
        id: Option<u64>,
    },
}

/// Runs `weir checkpoints`.
pub fn run(args: &CheckpointsArgs) -> Result<(), CliError> {
    match &args.command {
        CheckpointsCommand::List { dir } => list(dir),
        CheckpointsCommand::Inspect { dir, id } => inspect(dir, *id),
        CheckpointsCommand::Verify { dir, id } => verify(dir, *id),
    }
}

/// Magic at the start of every task state file written (format 2).
const TASK_MAGIC: &[u8; 8] = b"WEIRTSK2";
/// Magic of task state format 1, before channel state had watermarks:
/// still read by the runtime, so fine here too.
const TASK_MAGIC_V1: &[u8; 8] = b"WEIRTSK1";
/// Bytes of a task state file around its payload: magic, length, CRC.
const TASK_FRAME: u64 = 8 + 8 + 4;

/// What a checkpoint folder holds.
enum Folder {
    /// A manifest that verifies: the checkpoint is complete.
    Complete(Manifest),
    /// No manifest: an unfinished or aborted checkpoint, never restored.
    Incomplete,
    /// A manifest that does not verify (the message says why and where).
    BadManifest(String),
}

fn read_folder(root: &Path, id: u64) -> Folder {
    match storage::read_manifest(root, id) {
        Ok(Some(m)) => Folder::Complete(m),
        Ok(None) => Folder::Incomplete,
        Err(e) => Folder::BadManifest(e),
    }
}

/// The checkpoint ids under `dir`, ascending; a missing or unreadable
/// `dir` is a usage error (the argument is wrong).
fn checkpoint_ids(dir: &Path) -> Result<Vec<u64>, CliError> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(CliError::Usage(format!(
                "{} is not a directory: give the checkpoint directory of a job",
                dir.display()
            )))
        }
        Err(e) => return Err(CliError::Usage(format!("checkpoint directory {}: {e}", dir.display()))),
    }
    storage::list_ids(dir).map_err(|e| CliError::Usage(format!("cannot list {}: {e}", dir.display())))
}

/// The folder name of checkpoint `id`, as on disk.
fn folder_name(id: u64) -> String {
    storage::checkpoint_dir(Path::new(""), id).display().to_string()
}

// ---------------------------------------------------------------- list

fn list(dir: &Path) -> Result<(), CliError> {
    let ids = checkpoint_ids(dir)?;
    if ids.is_empty() {
        println!("no checkpoint folders in {}", dir.display());
        return Ok(());
    }
    println!(
        "{:>10}  {:<10}  {:<5}  {:<13}  {:<24}  {:>12}  {:>5}  {:>12}  {:>12}",
        "id", "status", "final", "mode", "trigger (UTC)", "duration", "tasks", "state B", "channel B"
    );
    for id in ids {
        let line = match read_folder(dir, id) {
            Folder::Complete(m) => format!(
                "{:>10}  {:<10}  {:<5}  {:<13}  {:<24}  {:>12}  {:>5}  {:>12}  {:>12}",
                id,
                "complete",
                if m.is_final { "final" } else { "-" },
                m.mode.name(),
                utc(m.trigger_unix_ms),
                duration(m.duration_us),
                m.tasks.len(),
                m.tasks.iter().map(|t| t.state_bytes).sum::<u64>(),
                m.tasks.iter().map(|t| t.channel_state_bytes).sum::<u64>(),
            ),
            Folder::Incomplete => format!("{id:>10}  {:<10}  (no MANIFEST: never restored)", "incomplete"),
            Folder::BadManifest(e) => format!("{id:>10}  {:<10}  {e}", "corrupt"),
        };
        println!("{line}");
    }
    Ok(())
}

// ---------------------------------------------------------------- inspect

fn inspect(dir: &Path, id: Option<u64>) -> Result<(), CliError> {
    let ids = checkpoint_ids(dir)?;
    let id = match id {
        Some(id) if ids.contains(&id) => id,
        Some(id) => {
            return Err(CliError::Usage(format!(
                "there is no checkpoint {id} ({}) in {}",
                folder_name(id),
                dir.display()
            )))
        }
        None => latest_complete(dir, &ids)?,
    };
    let manifest = match read_folder(dir, id) {
        Folder::Complete(m) => m,
        Folder::Incomplete => {
            inspect_incomplete(dir, id);
            return Ok(());
        }
        Folder::BadManifest(e) => return Err(CliError::Wrong(format!("checkpoint {id}: {e}"))),
    };
    print_manifest(dir, &manifest);
    Ok(())
}

/// The newest checkpoint that has a manifest file (whether or not it
/// verifies: a corrupt latest checkpoint is shown as such, never skipped).
fn latest_complete(dir: &Path, ids: &[u64]) -> Result<u64, CliError> {
    ids.iter()
        .rev()
        .copied()
        .find(|&id| storage::checkpoint_dir(dir, id).join(storage::MANIFEST).exists())
        .ok_or_else(|| {
            CliError::Usage(format!(
                "{} holds no complete checkpoint ({} incomplete folders)",
                dir.display(),
                ids.len()
            ))
        })
}

fn print_manifest(dir: &Path, m: &Manifest) {
    let total_state: u64 = m.tasks.iter().map(|t| t.state_bytes).sum();
    let total_channel: u64 = m.tasks.iter().map(|t| t.channel_state_bytes).sum();
    println!("checkpoint {} ({})", m.id, storage::checkpoint_dir(dir, m.id).display());
    println!("  version         {}", m.version);
    println!("  job             {}", m.job);
    println!("  fingerprint     {}", m.fingerprint);
    println!("  mode            {}", m.mode.name());
    println!("  final           {}", if m.is_final { "yes" } else { "no" });
    println!(
        "  trigger         {} (unix ms {})",
        utc(m.trigger_unix_ms),
        m.trigger_unix_ms
    );
    println!("  duration        {} ({} µs)", duration(m.duration_us), m.duration_us);
    println!("  tasks           {}", m.tasks.len());
    println!("  state bytes     {total_state}");
    println!("  channel bytes   {total_channel}");
    println!("  files           {}", m.files.len());
    println!("chains");
    for (g, group) in m.groups.iter().enumerate() {
        println!(
            "  {g:>3}  parallelism {:<4}  {}",
            group.parallelism,
            group.operators.join(" -> ")
        );
    }
    println!("tasks");
    println!(
        "  {:>5} {:>7}  {:<32} {:>10}  {:<8}  {:>10} {:>10} {:>9} {:>9} {:>9}  header",
        "chain", "subtask", "file", "size", "crc32", "state B", "channel B", "sync µs", "async µs", "align µs"
    );
    for t in &m.tasks {
        let header = match t.state_bytes_in(dir, m) {
            Ok(bytes) => TaskHeader::parse(&bytes).summary(),
            Err(e) => format!("unreadable: {e}"),
        };
        let file = match t.inline_offset {
            Some(off) => format!("inline @{off}"),
            None => t.file.path.clone(),
        };
        println!(
            "  {:>5} {:>7}  {:<32} {:>10}  {:08x}  {:>10} {:>10} {:>9} {:>9} {:>9}  {header}",
            t.group,
            t.subtask,
            file,
            t.file.size,
            t.file.crc32,
            t.state_bytes,
            t.channel_state_bytes,
            t.sync_us,
            t.async_us,
            t.alignment_us
        );
    }
    let task_files: Vec<&FileRef> = m.tasks.iter().map(|t| &t.file).collect();
    let others: Vec<&FileRef> = m.files.iter().filter(|f| !task_files.contains(f)).collect();
    if !others.is_empty() {
        println!("other files");
        for f in others {
            println!("  {:<48} {:>10}  {:08x}", f.path, f.size, f.crc32);
        }
    }
}

/// An incomplete folder has no manifest to follow: show the files it has.
fn inspect_incomplete(dir: &Path, id: u64) {
    let folder = storage::checkpoint_dir(dir, id);
    println!(
        "checkpoint {id} ({}): incomplete, no MANIFEST; never restored",
        folder.display()
    );
    let mut entries: Vec<(String, Result<Vec<u8>, String>)> = match fs::read_dir(&folder) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (name, fs::read(e.path()).map_err(|err| err.to_string()))
            })
            .collect(),
        Err(e) => {
            println!("  cannot read the folder: {e}");
            return;
        }
    };
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, bytes) in entries {
        match bytes {
            Ok(b) if name.ends_with(".state") => {
                println!("  {name:<32} {:>10}  {}", b.len(), TaskHeader::parse(&b).summary())
            }
            Ok(b) => println!("  {name:<32} {:>10}", b.len()),
            Err(e) => println!("  {name:<32} unreadable: {e}"),
        }
    }
}

// ---------------------------------------------------------------- verify

fn verify(dir: &Path, id: Option<u64>) -> Result<(), CliError> {
    let ids = checkpoint_ids(dir)?;
    let explicit = id.is_some();
    let targets: Vec<u64> = match id {
        Some(id) if ids.contains(&id) => vec![id],
        Some(id) => {
            return Err(CliError::Usage(format!(
                "there is no checkpoint {id} ({}) in {}",
                folder_name(id),
                dir.display()
            )))
        }
        None => ids,
    };
    let mut checked = 0;
    let mut bad = Vec::new();
    for id in targets {
        let name = folder_name(id);
        let manifest = match read_folder(dir, id) {
            Folder::Complete(m) => m,
            Folder::Incomplete if explicit => {
                println!("{name}  FAILED");
                println!("  no MANIFEST: the checkpoint is incomplete and would never be restored");
                checked += 1;
                bad.push(id);
                continue;
            }
            Folder::Incomplete => {
                println!("{name}  incomplete (no MANIFEST): skipped, never restored");
                continue;
            }
            Folder::BadManifest(e) => {
                checked += 1;
                println!("{name}  FAILED");
                println!("  manifest: {e}");
                bad.push(id);
                continue;
            }
        };
        checked += 1;
        let problems = check_checkpoint(dir, id, &manifest);
        if problems.is_empty() {
            let bytes: u64 = manifest.files.iter().map(|f| f.size).sum();
            println!(
                "{name}  OK  ({} files, {bytes} bytes, manifest and {} task payload CRCs match)",
                manifest.files.len(),
                manifest.tasks.len()
            );
        } else {
            println!("{name}  FAILED");
            for p in &problems {
                println!("  {p}");
            }
            bad.push(id);
        }
    }
    if checked == 0 {
        return Err(CliError::Usage(format!(
            "{} holds no complete checkpoint: nothing to verify",
            dir.display()
        )));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        let ids: Vec<String> = bad.iter().map(u64::to_string).collect();
        Err(CliError::Wrong(format!(
            "{} of {checked} checkpoints failed verification: {}",
            bad.len(),
            ids.join(", ")
        )))
    }
}

/// Every problem of a complete checkpoint; empty if it verifies.
fn check_checkpoint(dir: &Path, id: u64, m: &Manifest) -> Vec<String> {
    let mut problems = Vec::new();
    if m.id != id {
        problems.push(format!(
            "manifest of folder {} says checkpoint {}: it was moved or copied",
            folder_name(id),
            m.id
        ));
    }
    // The core stops at the first bad file; ask it once per file so that
    // every bad file is reported.
    let mut one = Manifest {
        files: Vec::with_capacity(1),
        ..m.clone()
    };
    for f in &m.files {
        one.files.clear();
        one.files.push(f.clone());
        if let Err(e) = storage::verify_files(dir, &one) {
            problems.push(e);
        }
    }
    for t in &m.tasks {
        if t.inline_offset.is_none() && !m.files.contains(&t.file) {
            problems.push(format!(
                "task {}/{}: file {} is not among the manifest's files",
                t.group, t.subtask, t.file.path
            ));
        }
        let what = match t.inline_offset {
            Some(off) => format!(
                "inline state of task {}/{} at {off} in the manifest",
                t.group, t.subtask
            ),
            None => format!("task file {}", dir.join(&t.file.path).display()),
        };
        // A missing or unreadable file was reported above; inline states
        // were verified when the manifest was read.
        if let Ok(bytes) = t.state_bytes_in(dir, m) {
            problems.extend(
                TaskHeader::parse(&bytes)
                    .problems()
                    .into_iter()
                    .map(|p| format!("checkpoint {id}: {what}: {p}")),
            );
        }
    }
    for (g, group) in m.groups.iter().enumerate() {
        let mut subtasks: Vec<usize> = m.tasks.iter().filter(|t| t.group == g).map(|t| t.subtask).collect();
        subtasks.sort_unstable();
        if subtasks != (0..group.parallelism).collect::<Vec<_>>() {
            problems.push(format!(
                "chain {g} has parallelism {} but the manifest lists subtasks {subtasks:?}",
                group.parallelism
            ));
        }
    }
    problems
}

// ---------------------------------------------------------------- task files

/// The frame of a task state file, as far as it could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TaskHeader {
    /// File size in bytes.
    size: u64,
    /// Bytes 0..8, if the file has them.
    magic: Option<[u8; 8]>,
    /// The length field (bytes 8..16), if the file has it.
    payload_len: Option<u64>,
    /// `(stored, actual)` payload CRC32, if the length field fits the file.
    crc: Option<(u32, u32)>,
}

impl TaskHeader {
    fn parse(bytes: &[u8]) -> TaskHeader {
        let size = bytes.len() as u64;
        let magic = bytes.get(..8).map(|m| m.try_into().expect("8 bytes"));
        let payload_len = bytes
            .get(8..16)
            .map(|l| u64::from_le_bytes(l.try_into().expect("8 bytes")));
        let crc = payload_len
            .filter(|&len| len.checked_add(TASK_FRAME) == Some(size))
            .map(|len| {
                let end = 16 + len as usize;
                let stored = u32::from_le_bytes(bytes[end..].try_into().expect("4 bytes"));
                (stored, crc32(&bytes[16..end]))
            });
        TaskHeader {
            size,
            magic,
            payload_len,
            crc,
        }
    }

    /// What is wrong with the frame, with byte positions.
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        match self.magic {
            Some(m) if &m == TASK_MAGIC || &m == TASK_MAGIC_V1 => {}
            Some(m) => p.push(format!(
                "bad magic at bytes 0..8: expected \"WEIRTSK2\" (or \"WEIRTSK1\"), found \"{}\"",
                m.escape_ascii()
            )),
            None => {}
        }
        let Some(len) = self.payload_len else {
            p.push(format!(
                "only {} bytes: shorter than the 16-byte header (truncated)",
                self.size
            ));
            return p;
        };
        match self.crc {
            None => p.push(format!(
                "length field at bytes 8..16 says {len} payload bytes, so the file should have {} bytes, \
                 but it has {} (truncated or extended at byte {})",
                u128::from(len) + u128::from(TASK_FRAME),
                self.size,
                self.size.min(len.saturating_add(TASK_FRAME))
            )),
            Some((stored, actual)) if stored != actual => p.push(format!(
                "payload CRC mismatch over bytes 16..{}: expected {stored:08x} (stored at bytes {}..{}), \
                 actual {actual:08x}",
                16 + len,
                16 + len,
                20 + len
            )),
            Some(_) => {}
        }
        p
    }

    /// One line for `inspect`.
    fn summary(&self) -> String {
        let magic = match self.magic {
            Some(m) => format!("\"{}\"", m.escape_ascii()),
            None => "-".to_string(),
        };
        let len = self.payload_len.map_or("-".to_string(), |l| l.to_string());
        let crc = match self.crc {
            Some((s, a)) if s == a => format!("crc {s:08x} ok"),
            Some((s, a)) => format!("crc MISMATCH stored {s:08x} actual {a:08x}"),
            None => "crc not checked (size does not match the length field)".to_string(),
        };
        let ok = if self.problems().is_empty() { "" } else { " [BAD]" };
        format!("magic {magic} payload {len} B {crc}{ok}")
    }
}

/// CRC-32 (IEEE 802.3, reflected, the one `crc32fast` computes), one byte
/// per step: fast enough for a command that reads each file once.
fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut c = !0u32;
    for &b in bytes {
        c = TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

// ---------------------------------------------------------------- formatting

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc(unix_ms: u64) -> String {
    let days = (unix_ms / 86_400_000) as i64;
    let ms_of_day = unix_ms % 86_400_000;
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, ms) = (
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000,
    );
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{ms:03}Z")
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day)
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Microseconds as milliseconds with three decimals.
fn duration(us: u64) -> String {
    format!("{}.{:03} ms", us / 1000, us % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_ieee_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(utc(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
    }

    fn task_file(payload: &[u8]) -> Vec<u8> {
        let mut b = TASK_MAGIC.to_vec();
        b.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        b.extend_from_slice(payload);
        b.extend_from_slice(&crc32(payload).to_le_bytes());
        b
    }

    #[test]
    fn task_header_finds_every_flip_and_truncation() {
        let good = task_file(b"some payload bytes");
        assert!(TaskHeader::parse(&good).problems().is_empty());
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x10;
            assert!(!TaskHeader::parse(&b).problems().is_empty(), "flip at {i}");
        }
        for len in 0..good.len() {
            assert!(!TaskHeader::parse(&good[..len]).problems().is_empty(), "cut at {len}");
        }
        let mut b = good.clone();
        b[20] ^= 1;
        let p = TaskHeader::parse(&b).problems().join("\n");
        assert!(p.contains("payload CRC mismatch over bytes 16..34"), "{p}");
    }
}
