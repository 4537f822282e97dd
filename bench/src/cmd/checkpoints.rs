//! `weir checkpoints list|inspect|verify DIR`: look into a checkpoint
//! directory without running a job.
//!
//! The command only reads, and decodes nothing itself: the two formats a
//! checkpoint is made of (see `docs/design/checkpoints.md`) are read by the
//! code a restore runs, in weir-core:
//!
//! - the manifest (`chk-NNNNNNNNNN/MANIFEST`): framed in 512-byte sectors,
//!   one line of JSON, then a line `crc32 <8 hex digits>`, then the inline
//!   task states; parsed and checked (every inline state's CRC32 included,
//!   and a write a crash left unfinished told from damage) by
//!   [`storage::read_manifest`];
//! - a task state frame, in a task state file (`task-GGG-SSS.state`) or
//!   inline in the manifest: magic, payload length, payload, payload
//!   CRC32; decoded and checked by [`task_frame::decode_task_frame`].
//!
//! `verify` reports every problem it finds, not only the first: a missing
//! or unreadable file, a wrong size, a whole-file CRC32 that differs from
//! the manifest's ([`storage::verify_files`], called once per file), a task
//! state frame that does not decode, and one that belongs to another
//! checkpoint or task than the manifest says, each with the file, the byte
//! range and the expected and actual values.

use std::fs;
use std::path::{Path, PathBuf};

use weir_core::checkpoint::storage::{self, FileRef, Manifest, ManifestTask};
use weir_core::checkpoint::task_frame::{self, TaskFrame};

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

/// What a checkpoint folder holds.
enum Folder {
    /// A manifest that verifies: the checkpoint is complete.
    Complete(Manifest),
    /// No manifest, or one a crash left unfinished: an unfinished or
    /// aborted checkpoint, never restored. Why.
    Incomplete(String),
    /// A manifest that does not verify (the message says why and where).
    BadManifest(String),
}

fn read_folder(root: &Path, id: u64) -> Folder {
    match storage::read_manifest(root, id) {
        Ok(Some(m)) => Folder::Complete(m),
        Ok(None) => Folder::Incomplete(storage::incomplete(root, id).unwrap_or_else(|| "no MANIFEST".into())),
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
            Folder::Incomplete(why) => format!("{id:>10}  {:<10}  ({why}; never restored)", "incomplete"),
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
        Folder::Incomplete(why) => {
            inspect_incomplete(dir, id, &why);
            return Ok(());
        }
        Folder::BadManifest(e) => return Err(CliError::Wrong(format!("checkpoint {id}: {e}"))),
    };
    print_manifest(dir, &manifest);
    Ok(())
}

/// The newest checkpoint that has a manifest a crash did not leave
/// unfinished (whether or not it verifies: a corrupt latest checkpoint is
/// shown as such, never skipped).
fn latest_complete(dir: &Path, ids: &[u64]) -> Result<u64, CliError> {
    ids.iter()
        .rev()
        .copied()
        .find(|&id| storage::is_complete(dir, id))
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
            Ok(bytes) => summary(&task_frame::decode_task_frame(&bytes, &frame_name(dir, t))),
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
fn inspect_incomplete(dir: &Path, id: u64, why: &str) {
    let folder = storage::checkpoint_dir(dir, id);
    println!(
        "checkpoint {id} ({}): incomplete, {why}; never restored",
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
                let what = folder.join(&name).display().to_string();
                println!(
                    "  {name:<32} {:>10}  {}",
                    b.len(),
                    summary(&task_frame::decode_task_frame(&b, &what))
                )
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
            Folder::Incomplete(why) if explicit => {
                println!("{name}  FAILED");
                println!("  {why}: the checkpoint is incomplete and would never be restored");
                checked += 1;
                bad.push(id);
                continue;
            }
            Folder::Incomplete(why) => {
                println!("{name}  incomplete ({why}): skipped, never restored");
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
        // A missing or unreadable file was reported above.
        if let Ok(bytes) = t.state_bytes_in(dir, m) {
            match task_frame::decode_task_frame(&bytes, &frame_name(dir, t)) {
                // Against the manifest's id: a moved folder is reported above.
                Ok(frame) => problems.extend(mismatch(&frame, m.id, t).map(|p| format!("checkpoint {id}: {p}"))),
                Err(e) => problems.push(format!("checkpoint {id}: {e}")),
            }
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

// ---------------------------------------------------------------- task frames

/// How errors name task `t`'s state frame: its file, or the manifest and
/// the inline state's offset in its inline part.
fn frame_name(dir: &Path, t: &ManifestTask) -> String {
    match t.inline_offset {
        Some(off) => format!(
            "inline state of task {}/{} at {off} in the inline part of {}",
            t.group,
            t.subtask,
            dir.join(&t.file.path).display()
        ),
        None => format!("task file {}", dir.join(&t.file.path).display()),
    }
}

/// What a decoded frame says that its manifest entry contradicts: another
/// checkpoint, chain or subtask (a file copied or moved between folders).
fn mismatch(f: &TaskFrame, id: u64, t: &ManifestTask) -> Option<String> {
    let says = (f.checkpoint, f.group as usize, f.subtask as usize);
    (says != (id, t.group, t.subtask)).then(|| {
        format!(
            "the manifest lists {} as the state of task {}/{}, but it holds task {}/{} of checkpoint {}: \
             copied or moved from elsewhere",
            t.file.path, t.group, t.subtask, f.group, f.subtask, f.checkpoint
        )
    })
}

/// One line for `inspect`: the frame's header and contents, or why it
/// does not decode.
fn summary(frame: &Result<TaskFrame, String>) -> String {
    match frame {
        Ok(f) => format!(
            "magic \"{}\" payload {} B crc {:08x} ok; checkpoint {}, task {}/{} of {}, {} operator states{}",
            f.magic.escape_ascii(),
            f.payload_bytes,
            f.payload_crc32,
            f.checkpoint,
            f.group,
            f.subtask,
            f.parallelism,
            f.operators.len(),
            if f.source_offset_bytes.is_some() {
                ", source offset"
            } else {
                ""
            }
        ),
        Err(e) => format!("[BAD] {e}"),
    }
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

    /// A frame that belongs to another checkpoint or task than its
    /// manifest entry says is a problem; its own is not.
    #[test]
    fn a_frame_of_another_task_or_checkpoint_is_named() {
        let task = ManifestTask {
            group: 1,
            subtask: 0,
            file: FileRef {
                path: "chk-0000000007/task-001-000.state".into(),
                size: 40,
                crc32: 0,
            },
            inline_offset: None,
            state_bytes: 0,
            channel_state_bytes: 0,
            sync_us: 0,
            async_us: 0,
            alignment_us: 0,
        };
        let frame = TaskFrame {
            format: 2,
            magic: *b"WEIRTSK2",
            payload_bytes: 20,
            payload_crc32: 0,
            checkpoint: 7,
            group: 1,
            subtask: 0,
            parallelism: 2,
            source_offset_bytes: None,
            operators: vec![(0, 12)],
            input_channels: Vec::new(),
            output_channels: Vec::new(),
            channel_records: 0,
            has_input_event_time: true,
        };
        assert_eq!(mismatch(&frame, 7, &task), None);
        assert!(summary(&Ok(frame.clone())).starts_with("magic \"WEIRTSK2\" payload 20 B crc 00000000 ok;"));
        for other in [
            TaskFrame {
                subtask: 1,
                ..frame.clone()
            },
            TaskFrame {
                checkpoint: 6,
                ..frame.clone()
            },
            TaskFrame { group: 0, ..frame },
        ] {
            let p = mismatch(&other, 7, &task).expect("a mismatch");
            assert!(
                p.contains("task-001-000.state") && p.contains(&format!("of checkpoint {}", other.checkpoint)),
                "{p}"
            );
        }
        assert_eq!(summary(&Err("F: bad".into())), "[BAD] F: bad");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(utc(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
    }
}
