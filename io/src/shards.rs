//! Shards: one job over Kafka shared by N processes, and rescaled from
//! one N to another, exactly-once. The folders and small files behind
//! `weir run --instances N --instance I [--rescale-from DIR...]`.
//!
//! Why it exists: a weir process is single-node, and the broker is how a
//! job grows past one machine. The job is cut into **shards**, fixed when
//! the job first starts: one per partition of its (first) Kafka input
//! topic. Shard `s` reads the partitions `p mod S == s` of every input
//! topic, keeps the keyed state of the keys in them, and owns the sink
//! slots `s * parallelism + subtask`. A shard is a whole weir job with a
//! checkpoint folder of its own (state, source offsets, in-flight records
//! of unaligned checkpoints, the exactly-once sink's write-ahead log).
//! Process `I` of `N` runs the shards `s mod N == I`, each as its own
//! job, under `<process folder>/shard-NNNN`; [`prepare`] settles which
//! and puts their folders in place.
//!
//! Rescaling moves whole shards: nothing is split or merged, so state,
//! offsets and the sink's log stay the consistent cut their checkpoint
//! made, and a sink slot never loses its owner (the shard takes its log,
//! marker and transactional id along). A process that now owns a shard
//! it lacks copies the shard's folder from an old process's folder. Each
//! copy of a shard carries a generation: an adoption writes the source's
//! generation plus one, so among all copies the live one has the highest
//! generation, and copies left behind by earlier owners are never chosen.
//! See `docs/design/scaling.md`.
//!
//! # On disk
//!
//! ```text
//! <process folder>/
//!   scale-out                 the job's shape; which process of how many last ran here
//!   shard-0003/               shard 3: a whole job's checkpoint folder
//!     generation              which copy of the shard this is
//!     chk-*/ shared/ ...      the shard job's checkpoints and sink log
//!   shard-0003.incoming/      an adoption under way (a crash left it; the next start redoes it)
//! ```
//!
//! `scale-out` and `generation` are text: `name=value` lines (a name is
//! not empty and has no `=`; neither has a line break), then the line
//! `crc32=` and 8 lowercase hex digits, the CRC32 of every byte before
//! that line; the file ends with that line's line break. A generation file:
//!
//! ```text
//! generation=1
//! crc32=c601ea89
//! ```
//!
//! Fields of `scale-out`: `shards`, `parallelism`, `inputs`, `output`
//! (the job's shape, [`JobShape`]), `instances`, `instance`. Of
//! `generation`: `generation`. Other names are ignored on read.
//!
//! Every byte of these files is verified when read back: a file that does
//! not end with its CRC line, a CRC mismatch, a line that is not
//! `name=value`, a missing or non-numeric field is refused as
//! [`Error::Corrupt`], naming the file and the byte the bad bytes start at.
//! The files inside a shard's folder are copied byte for byte on adoption;
//! their own checks (the manifest's and the task files' CRC32s on restore,
//! the log's record CRCs) verify them when the shard's job reads them.
//!
//! # Durability
//!
//! Every step goes through weir-core's vfs layer (so the storage
//! simulation runs it) and passes a named fault point first:
//!
//! - a small file is written to `.<name>.tmp` ([`FAULT_FILE_WRITE`]),
//!   fsynced ([`FAULT_FILE_FSYNC`]), renamed over the old one
//!   ([`FAULT_FILE_RENAME`]) and its folder fsynced ([`FAULT_DIRSYNC`]): a
//!   crash at any instant leaves the old file or the new one, never a
//!   torn one;
//! - an adoption copies the shard's folder into `shard-NNNN.incoming`
//!   (each file [`FAULT_COPY`], then fsynced; each folder fsynced after
//!   its entries), writes the new generation there, removes the stale copy
//!   it replaces (if any), renames the incoming folder to `shard-NNNN`
//!   ([`FAULT_INSTALL`]) and fsyncs the process folder. A crash before the
//!   rename leaves an `.incoming` folder that the next start removes and
//!   builds again: the source folder is only read, so an adoption can
//!   always be redone;
//! - the process folder and its parents are created durably, and
//!   `scale-out` is rewritten last, once every owned shard is in place.

use std::path::{Path, PathBuf};

use weir_core::vfs::{self, OpenOptions};

use crate::error::IoContext;
use crate::fsutil::{create_dir_durable, fault, sync_dir};
use crate::{Error, Result};

/// The job's description in each process's folder.
pub const DESCRIPTION: &str = "scale-out";
/// A shard folder's generation file.
pub const GENERATION: &str = "generation";

/// Fault point before a small file's temporary copy is created and written.
pub const FAULT_FILE_WRITE: &str = "shards.file.write";
/// Fault point before a small file's temporary copy is fsynced.
pub const FAULT_FILE_FSYNC: &str = "shards.file.fsync";
/// Fault point before a small file's temporary copy is renamed into place.
pub const FAULT_FILE_RENAME: &str = "shards.file.rename";
/// Fault point before a folder is fsynced (after a rename in it, or after
/// a shard's files were copied into it).
pub const FAULT_DIRSYNC: &str = "shards.dirsync";
/// Fault point before each file of an adopted shard is copied.
pub const FAULT_COPY: &str = "shards.copy";
/// Fault point before an adopted shard's folder is renamed into place.
pub const FAULT_INSTALL: &str = "shards.install";

/// Every fault point of this module, in the order a start passes them.
pub const SHARD_FAULT_POINTS: &[&str] = &[
    FAULT_COPY,
    FAULT_FILE_WRITE,
    FAULT_FILE_FSYNC,
    FAULT_FILE_RENAME,
    FAULT_DIRSYNC,
    FAULT_INSTALL,
];

/// What `Error::Corrupt` calls these files.
const WHAT: &str = "shard file";

/// What every process of one job must agree on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobShape {
    /// Number of shards, fixed at the job's first start.
    pub shards: usize,
    /// Parallelism of each shard's source, keyed operator and sink.
    pub parallelism: usize,
    /// The Kafka input topics, as given.
    pub inputs: String,
    /// The output, as given.
    pub output: String,
}

/// A process folder's description: the job, and which process of how
/// many last ran in it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Description {
    shape: JobShape,
    instances: usize,
    instance: usize,
}

/// The shards a process runs, each with its folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The job's number of shards.
    pub shards: usize,
    /// `(shard, folder)`, in shard order.
    pub owned: Vec<(usize, PathBuf)>,
    /// Shards copied in from another process's folder by this start:
    /// `(shard, from, generation)`.
    pub adopted: Vec<(usize, PathBuf, u64)>,
}

/// The folder of shard `s` under a process folder.
pub fn shard_dir(root: &Path, s: usize) -> PathBuf {
    root.join(format!("shard-{s:04}"))
}

/// Where an adoption of shard `s` builds its copy.
fn incoming_dir(root: &Path, s: usize) -> PathBuf {
    root.join(format!("shard-{s:04}.incoming"))
}

/// A layout error ([`Error::Shards`]).
fn layout(reason: String) -> Error {
    Error::Shards { reason }
}

// ---------------------------------------------------------------- small files

/// The bytes of a small file: `name=value` lines and the CRC line.
fn encode_fields(fields: &[(&str, String)]) -> Result<Vec<u8>> {
    let mut text = String::new();
    for (k, v) in fields {
        if k.is_empty() || k.contains(['=', '\n', '\r']) || v.contains(['\n', '\r']) {
            return Err(Error::InvalidConfig {
                setting: "shard file field",
                value: format!("{k:?}={v:?}"),
                reason: "a name is not empty and has no `=`; neither name nor value has a line break",
            });
        }
        text.push_str(&format!("{k}={v}\n"));
    }
    text.push_str(&format!("crc32={:08x}\n", crc32fast::hash(text.as_bytes())));
    Ok(text.into_bytes())
}

/// One field read back: name, value, and the byte its line starts at.
type Field = (String, String, u64);

/// Decodes and verifies a small file's bytes; an error is `(byte the bad
/// bytes start at, what is wrong)`.
fn decode_fields(bytes: &[u8]) -> std::result::Result<Vec<Field>, (u64, String)> {
    let len = bytes.len();
    let Some(body) = bytes.strip_suffix(b"\n") else {
        let at = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        return Err((
            at as u64,
            format!("no line break at its end (byte {len}): cut short, or damaged from byte {at}"),
        ));
    };
    let crc_at = body.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let line = &body[crc_at..];
    let stored = line
        .strip_prefix(b"crc32=")
        .filter(|h| h.len() == 8 && h.iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)))
        .and_then(|h| u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok())
        .ok_or_else(|| {
            (
                crc_at as u64,
                format!(
                    "its last line (bytes {crc_at}..{len}) is not `crc32=` and 8 lowercase hex digits: {:?}",
                    String::from_utf8_lossy(&line[..line.len().min(40)])
                ),
            )
        })?;
    let covered = &bytes[..crc_at];
    let actual = crc32fast::hash(covered);
    if stored != actual {
        return Err((
            0,
            format!(
                "CRC32 mismatch over bytes 0..{crc_at}: stored {stored:08x} (bytes {}..{}), computed {actual:08x}",
                crc_at + 6,
                crc_at + 14
            ),
        ));
    }
    // Checked bytes that do not parse were written so (another program,
    // another version): refused all the same, with the line.
    let mut fields = Vec::new();
    let mut at = 0;
    for line in covered.split_inclusive(|&b| b == b'\n') {
        let text =
            std::str::from_utf8(&line[..line.len() - 1]).map_err(|_| (at as u64, "a line is not UTF-8".to_string()))?;
        match text.split_once('=') {
            Some((k, v)) if !k.is_empty() => fields.push((k.to_string(), v.to_string(), at as u64)),
            _ => return Err((at as u64, format!("line at byte {at} is not name=value: {text:?}"))),
        }
        at += line.len();
    }
    Ok(fields)
}

/// Writes `name=value` lines and the CRC line to `path`, durably.
fn write_fields(path: &Path, fields: &[(&str, String)]) -> Result<()> {
    let bytes = encode_fields(fields)?;
    crate::durable::write_file_at(
        path,
        &bytes,
        [FAULT_FILE_WRITE, FAULT_FILE_FSYNC, FAULT_FILE_RENAME, FAULT_DIRSYNC],
    )
}

/// The fields of a small file, verified; `None` if it does not exist.
struct Fields {
    path: PathBuf,
    fields: Vec<Field>,
}

impl Fields {
    /// Reads and verifies `path`; `None` if it does not exist.
    fn read(path: &Path) -> Result<Option<Fields>> {
        let bytes = match vfs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("read", path, e)),
        };
        let fields = decode_fields(&bytes).map_err(|(at, reason)| Error::corrupt(WHAT, path, at, reason))?;
        Ok(Some(Fields {
            path: path.to_path_buf(),
            fields,
        }))
    }

    fn text(&self, name: &str) -> Result<&str> {
        self.fields
            .iter()
            .find(|(k, _, _)| k == name)
            .map(|(_, v, _)| v.as_str())
            .ok_or_else(|| Error::corrupt(WHAT, &self.path, 0, format!("no field {name}")))
    }

    fn number(&self, name: &str) -> Result<u64> {
        let (_, v, at) = self
            .fields
            .iter()
            .find(|(k, _, _)| k == name)
            .ok_or_else(|| Error::corrupt(WHAT, &self.path, 0, format!("no field {name}")))?;
        v.parse()
            .map_err(|_| Error::corrupt(WHAT, &self.path, *at, format!("field {name}: {v:?} is not a number")))
    }

    fn size(&self, name: &str) -> Result<usize> {
        let n = self.number(name)?;
        usize::try_from(n).map_err(|_| Error::corrupt(WHAT, &self.path, 0, format!("field {name}: {n} is too large")))
    }
}

fn read_description(root: &Path) -> Result<Option<Description>> {
    let Some(f) = Fields::read(&root.join(DESCRIPTION))? else {
        return Ok(None);
    };
    Ok(Some(Description {
        shape: JobShape {
            shards: f.size("shards")?,
            parallelism: f.size("parallelism")?,
            inputs: f.text("inputs")?.to_string(),
            output: f.text("output")?.to_string(),
        },
        instances: f.size("instances")?,
        instance: f.size("instance")?,
    }))
}

fn write_description(root: &Path, d: &Description) -> Result<()> {
    write_fields(
        &root.join(DESCRIPTION),
        &[
            ("shards", d.shape.shards.to_string()),
            ("parallelism", d.shape.parallelism.to_string()),
            ("inputs", d.shape.inputs.clone()),
            ("output", d.shape.output.clone()),
            ("instances", d.instances.to_string()),
            ("instance", d.instance.to_string()),
        ],
    )
}

/// The generation of the shard folder `shard`, verified.
pub fn read_generation(shard: &Path) -> Result<u64> {
    let path = shard.join(GENERATION);
    let f = Fields::read(&path)?.ok_or_else(|| {
        Error::corrupt(
            WHAT,
            &path,
            0,
            "missing: a shard folder always has one (it is written before the folder gets its name)",
        )
    })?;
    f.number("generation")
}

// ---------------------------------------------------------------- shard folders

/// Copies the tree `from` to `to` (which must not exist), every file and
/// folder synced.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    vfs::create_dir(to).ctx("create folder", to)?;
    for name in vfs::read_dir(from).ctx("list folder", from)? {
        let (src, dst) = (from.join(&name), to.join(&name));
        if vfs::metadata(&src).ctx("stat", &src)?.is_dir() {
            copy_tree(&src, &dst)?;
            continue;
        }
        fault(FAULT_COPY, "copy", &dst)?;
        let mut input = vfs::File::open(&src).ctx("open", &src)?;
        let mut output = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&dst)
            .ctx("create", &dst)?;
        let copied = match (input.as_std(), output.as_std()) {
            // Both on the real disk: the kernel copies (copy_file_range).
            (Some(mut i), Some(mut o)) => std::io::copy(&mut i, &mut o),
            _ => std::io::copy(&mut input, &mut output),
        };
        copied.ctx(&format!("copy {} to", src.display()), &dst)?;
        output.sync_data().ctx("fsync", &dst)?;
    }
    sync_dir(to, FAULT_DIRSYNC)
}

/// Puts a shard folder in place at `shard_dir(root, s)`: a copy of `from`
/// (or an empty one when `None`) with generation `generation`, built
/// under a temporary name and renamed, replacing an older copy.
fn install_shard(root: &Path, s: usize, from: Option<&Path>, generation: u64) -> Result<()> {
    let dst = shard_dir(root, s);
    let tmp = incoming_dir(root, s);
    if vfs::exists(&tmp) {
        vfs::remove_dir_all(&tmp).ctx("remove", &tmp)?;
    }
    match from {
        Some(src) => copy_tree(src, &tmp)?,
        None => vfs::create_dir(&tmp).ctx("create folder", &tmp)?,
    }
    // Durable before the folder is renamed: its folder is fsynced.
    write_fields(&tmp.join(GENERATION), &[("generation", generation.to_string())])?;
    if vfs::exists(&dst) {
        // A stale copy (the live one is `from`): removed first, as a
        // folder cannot be renamed over a folder that has entries.
        vfs::remove_dir_all(&dst).ctx("remove", &dst)?;
    }
    fault(FAULT_INSTALL, "rename", &tmp)?;
    vfs::rename(&tmp, &dst).ctx(&format!("rename {} to", tmp.display()), &dst)?;
    sync_dir(root, FAULT_DIRSYNC)
}

/// Whether two folders are one (compared as given where they cannot be
/// resolved, as on a simulated disk).
fn same(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Settles which shards process `instance` of `instances` runs and puts
/// their folders under `root` (created if need be): its own, or copies
/// adopted from the `rescale_from` folders (the old processes' folders),
/// the newest copy of each. `shape` is the job as this start sees it, with
/// `shards` 0 when not known yet; `count_shards` gives the number for a
/// job's first start (it is called only then).
///
/// Refused with [`Error::Shards`]: a folder of another job (shape), more
/// processes than shards, a rescale without the old folders, a shard in
/// none of the folders, a shard at the same generation in two (two
/// processes ran it at once). A damaged small file is [`Error::Corrupt`].
pub fn prepare<E: From<Error>>(
    root: &Path,
    rescale_from: &[PathBuf],
    instances: usize,
    instance: usize,
    mut shape: JobShape,
    count_shards: impl FnOnce() -> std::result::Result<usize, E>,
) -> std::result::Result<Plan, E> {
    if instances == 0 || instance >= instances {
        return Err(layout(format!(
            "process {instance} of {instances}: a job runs as processes 0 to N-1 of N, N at least 1"
        ))
        .into());
    }
    create_dir_durable(root)?;
    let others: Vec<&PathBuf> = rescale_from.iter().filter(|f| !same(f, root)).collect();
    let local = read_description(root)?;
    let mut known: Vec<(PathBuf, Description)> = Vec::new();
    if let Some(d) = &local {
        known.push((root.to_path_buf(), d.clone()));
    }
    for f in &others {
        let d = read_description(f)?.ok_or_else(|| {
            layout(format!(
                "{} is not the folder of a process of a job of several processes (it has no file {DESCRIPTION}); \
                 give the old processes' checkpoint folders (--rescale-from)",
                f.display()
            ))
        })?;
        known.push(((*f).clone(), d));
    }
    if let Some((first, d)) = known.first() {
        shape.shards = d.shape.shards;
        for (f, d) in &known {
            if d.shape != shape {
                return Err(layout(format!(
                    "{} holds a job of {} shards, parallelism {}, inputs {}, output {}; this one is parallelism \
                     {}, inputs {}, output {} ({} says {} shards): a job keeps its inputs, output and parallelism \
                     across rescaling",
                    f.display(),
                    d.shape.shards,
                    d.shape.parallelism,
                    d.shape.inputs,
                    d.shape.output,
                    shape.parallelism,
                    shape.inputs,
                    shape.output,
                    first.display(),
                    shape.shards
                ))
                .into());
            }
        }
    } else {
        shape.shards = count_shards()?;
    }
    let shards = shape.shards;
    if instances > shards {
        return Err(layout(format!(
            "{instances} processes: the job has {shards} shards (one per partition of its first input topic at \
             its first start), so at most {shards} processes can share it"
        ))
        .into());
    }
    if let Some(d) = &local {
        if (d.instances, d.instance) != (instances, instance) && others.is_empty() {
            return Err(layout(format!(
                "{} was process {} of {}, and this is process {instance} of {instances}: to rescale, give every \
                 old process's checkpoint folder (--rescale-from); each process copies the shards it now owns \
                 from them",
                root.display(),
                d.instance,
                d.instances
            ))
            .into());
        }
    }
    let fresh_job = known.is_empty();
    let mut owned = Vec::new();
    let mut adopted = Vec::new();
    for s in (0..shards).filter(|s| s % instances == instance) {
        // Every copy of the shard: (generation, folder).
        let mut copies: Vec<(u64, PathBuf)> = Vec::new();
        for f in std::iter::once(&root.to_path_buf()).chain(others.iter().copied()) {
            let d = shard_dir(f, s);
            if vfs::is_dir(&d) {
                copies.push((read_generation(&d)?, f.clone()));
            }
        }
        copies.sort_by_key(|c| std::cmp::Reverse(c.0));
        match copies.as_slice() {
            [] if fresh_job => install_shard(root, s, None, 0)?,
            [] => {
                return Err(layout(format!(
                    "shard {s} is in none of the folders {}{}: give the checkpoint folder of the process that ran \
                     it (--rescale-from)",
                    root.display(),
                    others.iter().map(|f| format!(", {}", f.display())).collect::<String>()
                ))
                .into())
            }
            [(g, a), (h, b), ..] if g == h => {
                return Err(layout(format!(
                    "shard {s} has generation {g} in both {} and {}: two processes ran it as its owner at once \
                     (the same process number twice?); keep the folder of the one whose output counts",
                    a.display(),
                    b.display()
                ))
                .into())
            }
            [(g, f), ..] if !same(f, root) => {
                install_shard(root, s, Some(&shard_dir(f, s)), g + 1)?;
                adopted.push((s, f.clone(), g + 1));
            }
            [_, ..] => {
                // The newest copy is this folder's own. An adoption a crash
                // interrupted may have left its incoming folder.
                let tmp = incoming_dir(root, s);
                if vfs::exists(&tmp) {
                    vfs::remove_dir_all(&tmp).ctx("remove", &tmp)?;
                }
            }
        }
        owned.push((s, shard_dir(root, s)));
    }
    write_description(
        root,
        &Description {
            shape,
            instances,
            instance,
        },
    )?;
    Ok(Plan { shards, owned, adopted })
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::fsutil::sim::Mounted;

    fn shape() -> JobShape {
        JobShape {
            shards: 0,
            parallelism: 1,
            inputs: "in".into(),
            output: "out".into(),
        }
    }

    fn plan(root: &Path, from: &[PathBuf], n: usize, i: usize) -> Result<Plan> {
        prepare(root, from, n, i, shape(), || Ok::<_, Error>(6))
    }

    fn mark(dir: &Path, text: &str) {
        std::fs::write(dir.join("state"), text).unwrap();
    }

    fn state(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("state")).unwrap()
    }

    #[test]
    fn shards_follow_the_newest_copy_through_2_3_2() {
        let t = tempfile::tempdir().unwrap();
        let f: Vec<PathBuf> = (0..3).map(|i| t.path().join(format!("p{i}"))).collect();
        // Two processes: 0, 2, 4 and 1, 3, 5.
        for (i, folder) in f.iter().enumerate().take(2) {
            let p = plan(folder, &[], 2, i).unwrap();
            assert_eq!(p.owned.iter().map(|o| o.0).collect::<Vec<_>>(), vec![i, i + 2, i + 4]);
            for (s, d) in &p.owned {
                mark(d, &format!("{s}@a"));
            }
        }
        // Restarting the same process needs nothing else.
        assert!(plan(&f[0], &[], 2, 0).unwrap().adopted.is_empty());
        // Without the old folders, a rescale is refused.
        let e = plan(&f[0], &[], 3, 0).unwrap_err();
        assert!(
            matches!(e, Error::Shards { .. }) && e.to_string().contains("--rescale-from"),
            "{e}"
        );
        // Three: 0, 3 | 1, 4 | 2, 5.
        for i in 0..3 {
            let p = plan(&f[i], &f[..2], 3, i).unwrap();
            for (s, d) in &p.owned {
                assert_eq!(state(d), format!("{s}@a"));
                mark(d, &format!("{s}@b"));
            }
        }
        assert_eq!(read_generation(&shard_dir(&f[0], 3)).unwrap(), 1);
        // Back to two: p0 has stale copies of 2 and 4 (generation 0); the
        // live ones (generation 1) are in p2 and p1.
        for i in 0..2 {
            let p = plan(&f[i], &f, 2, i).unwrap();
            for (s, d) in &p.owned {
                assert_eq!(state(d), format!("{s}@b"), "shard {s}");
            }
        }
        assert_eq!(read_generation(&shard_dir(&f[0], 2)).unwrap(), 2);
        // More processes than shards, another job's folder.
        assert!(plan(&f[0], &f, 7, 0).unwrap_err().to_string().contains("at most 6"));
        let other = JobShape {
            output: "elsewhere".into(),
            ..shape()
        };
        let e = prepare(&f[0], &f, 2, 0, other, || Ok::<_, Error>(6))
            .unwrap_err()
            .to_string();
        assert!(e.contains("keeps its inputs"), "{e}");
        assert!(plan(&f[0], &f, 2, 2).unwrap_err().to_string().contains("0 to N-1"));
    }

    #[test]
    fn a_shard_in_no_folder_or_in_two_at_once_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        plan(&a, &[], 2, 0).unwrap();
        // Process 1 never ran: its shards are nowhere.
        let e = plan(&b, std::slice::from_ref(&a), 2, 1).unwrap_err().to_string();
        assert!(e.contains("shard 1 is in none"), "{e}");
        // Two processes, both as instance 0 of 2, adopt the same shards.
        let (c, d) = (t.path().join("c"), t.path().join("d"));
        plan(&c, std::slice::from_ref(&a), 2, 0).unwrap();
        plan(&d, std::slice::from_ref(&a), 2, 0).unwrap();
        let e = plan(&a, &[c, d], 2, 0).unwrap_err().to_string();
        assert!(e.contains("generation 1 in both"), "{e}");
    }

    /// The caller's own error type.
    #[derive(Debug, PartialEq)]
    struct Caller(String);

    impl From<Error> for Caller {
        fn from(e: Error) -> Caller {
            Caller(e.to_string())
        }
    }

    #[test]
    fn count_shards_is_asked_only_at_a_jobs_first_start_and_its_error_is_the_callers() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("p");
        let e = prepare(&root, &[], 1, 0, shape(), || Err(Caller("no broker".into())));
        assert_eq!(e.unwrap_err(), Caller("no broker".into()));
        plan(&root, &[], 1, 0).unwrap();
        let p = prepare(&root, &[], 1, 0, shape(), || -> std::result::Result<usize, Caller> {
            panic!("asked again")
        })
        .unwrap();
        assert_eq!(p.shards, 6);
        // A layout error reaches the caller in its type.
        let e = prepare(&root, &[], 2, 0, shape(), || Ok::<_, Caller>(6)).unwrap_err();
        assert!(e.0.contains("--rescale-from"), "{e:?}");
    }

    #[test]
    fn the_small_files_round_trip_and_refuse_bad_fields() {
        let bytes = encode_fields(&[("a", "1".into()), ("b", "x=y".into()), ("c", String::new())]).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert_eq!(
            text,
            format!("a=1\nb=x=y\nc=\ncrc32={:08x}\n", crc32fast::hash(b"a=1\nb=x=y\nc=\n"))
        );
        let fields = decode_fields(&bytes).unwrap();
        assert_eq!(
            fields,
            vec![
                ("a".into(), "1".into(), 0),
                ("b".into(), "x=y".into(), 4),
                ("c".into(), String::new(), 10)
            ]
        );
        assert!(decode_fields(&encode_fields(&[]).unwrap()).unwrap().is_empty());
        for bad in [("", "1"), ("a=b", "1"), ("a", "1\n2"), ("a\n", "1")] {
            assert!(encode_fields(&[(bad.0, bad.1.into())]).is_err(), "{bad:?}");
        }
    }

    /// Every flipped bit and every cut is refused, at or before the
    /// damaged byte.
    #[test]
    fn every_flip_and_cut_is_refused_at_or_before_the_damage() {
        let bytes = encode_fields(&[
            ("shards", "6".into()),
            ("inputs", "kafka:127.0.0.1:9092/in".into()),
            ("generation", "12".into()),
        ])
        .unwrap();
        for (i, bit, b) in weir_core::fuzzing::bit_flips(&bytes) {
            let (at, e) = decode_fields(&b).unwrap_err();
            assert!(at <= i as u64, "flip of bit {bit} at {i}: refused at {at}: {e}");
        }
        for len in 0..bytes.len() {
            let (at, e) = decode_fields(&bytes[..len]).unwrap_err();
            assert!(at <= len as u64, "cut at {len}: refused at {at}: {e}");
        }
        let (at, e) = decode_fields(&[&bytes[..], b"x\n"].concat()).unwrap_err();
        assert_eq!(at, bytes.len() as u64, "a line appended: {e}");
    }

    #[test]
    fn a_damaged_file_is_refused_naming_the_file_and_the_byte() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("f");
        write_fields(&path, &[("a", "1".into()), ("generation", "3".into())]).unwrap();
        assert!(!t.path().join(".f.tmp").exists());
        let f = Fields::read(&path).unwrap().unwrap();
        assert_eq!((f.text("a").unwrap(), f.number("generation").unwrap()), ("1", 3));
        let e = f.number("a").map(|_| ()).and(f.text("b").map(|_| ())).unwrap_err();
        assert!(e.to_string().contains("no field b"), "{e}");
        std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replace("a=1", "a=2")).unwrap();
        match Fields::read(&path).err().unwrap() {
            Error::Corrupt {
                file, offset, reason, ..
            } => {
                assert_eq!((file, offset), (path.clone(), 0));
                assert!(reason.contains("CRC32 mismatch over bytes 0..17"), "{reason}");
            }
            e => panic!("{e}"),
        }
        assert!(Fields::read(&t.path().join("none")).unwrap().is_none());
        // A shard folder without its generation file.
        let e = read_generation(t.path()).unwrap_err().to_string();
        assert!(e.contains("generation") && e.contains("missing"), "{e}");
    }

    /// A crash at every step of rewriting a small file leaves the old
    /// file or the new one, whole: never a torn one, never none. Each
    /// crash point is tried with several seeds (each deciding differently
    /// what of the unsynced data and folder entries survives).
    #[test]
    fn a_crash_at_every_step_of_a_write_leaves_the_old_file_or_the_new() {
        let old = [("generation", "1".to_string())];
        // Longer than a sector: a torn write could mix the two.
        let new = [("generation", "2".to_string()), ("pad", "x".repeat(1500))];
        let steps = {
            let m = Mounted::new(PathBuf::from("/weir-sim-unit/shard-file-count"), 0);
            let path = m.0.join(GENERATION);
            write_fields(&path, &old).unwrap();
            let before = m.1.ops();
            write_fields(&path, &new).unwrap();
            m.1.ops() - before
        };
        assert!(steps >= 4, "create, write, fsync, rename, folder fsync: {steps}");
        let (mut olds, mut news) = (0, 0);
        for k in 1..=steps + 1 {
            for seed in 0..8 {
                let m = Mounted::new(PathBuf::from(format!("/weir-sim-unit/shard-file-{k}-{seed}")), seed);
                let path = m.0.join(GENERATION);
                write_fields(&path, &old).unwrap();
                m.1.crash_after(Some(k));
                let wrote = write_fields(&path, &new);
                assert_eq!(wrote.is_ok(), k > steps, "crash point {k}: {wrote:?}");
                m.1.crash();
                let f = Fields::read(&path)
                    .unwrap_or_else(|e| panic!("crash point {k}, seed {seed}: {e}"))
                    .unwrap_or_else(|| panic!("crash point {k}, seed {seed}: the file is gone"));
                match f.number("generation").unwrap() {
                    1 => olds += 1,
                    2 => {
                        assert_eq!(f.text("pad").unwrap().len(), 1500);
                        news += 1
                    }
                    g => panic!("crash point {k}, seed {seed}: generation {g}"),
                }
                // And the next write goes through.
                write_fields(&path, &new).unwrap();
                assert_eq!(read_generation(&m.0).unwrap(), 2);
            }
        }
        assert!(olds > 0 && news > 0, "old {olds}, new {news}");
    }
}
