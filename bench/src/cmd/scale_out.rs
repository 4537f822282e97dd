//! `weir run --instances N --instance I`: one job over Kafka shared by N
//! processes, and rescaled from one N to another, exactly-once.
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
//! job, under `<checkpoint-dir>/shard-NNNN`.
//!
//! Rescaling moves whole shards: nothing is split or merged, so state,
//! offsets and the sink's log stay the consistent cut their checkpoint
//! made, and a sink slot never loses its owner (the shard takes its log,
//! marker and transactional id along). A process that now owns a shard
//! it lacks copies the shard's folder from an old process's folder
//! (`--rescale-from`). Each copy of a shard carries a generation: an
//! adoption writes the source's generation plus one, so among all copies
//! the live one has the highest generation, and copies left behind by
//! earlier owners are never chosen. See docs/scaling.md.
//!
//! The small files here (`scale-out` per process folder, `generation` per
//! shard) are written durably (temporary file, fsync, rename, fsync of
//! the folder) and end with a checksum line that is verified on read.

use std::path::{Path, PathBuf};

use crate::cli::CliError;

/// The job's description in each process's checkpoint folder.
pub const DESCRIPTION: &str = "scale-out";
/// A shard folder's generation file.
const GENERATION: &str = "generation";

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

/// The shards this process runs, each with its folder.
#[derive(Debug)]
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

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> CliError + '_ {
    move |source| CliError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn corrupt(path: &Path, reason: String) -> CliError {
    CliError::Io {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
    }
}

/// FNV-1a, 64 bits: the checksum of the small text files.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Writes `name=value` lines and a checksum line to `path`, durably.
fn write_fields(path: &Path, fields: &[(&str, String)]) -> Result<(), CliError> {
    let mut text = String::new();
    for (k, v) in fields {
        text.push_str(&format!("{k}={v}\n"));
    }
    text.push_str(&format!("checksum={:016x}\n", checksum(text.as_bytes())));
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        weir_core::checkpoint::storage::sync_dir(path.parent().unwrap_or(Path::new(".")))
    };
    write().map_err(io_err(path))
}

/// Reads a file of [`write_fields`], verifying its checksum; `None` if
/// it does not exist.
fn read_fields(path: &Path) -> Result<Option<Vec<(String, String)>>, CliError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    let body_len = text.trim_end_matches('\n').rfind('\n').map_or(0, |i| i + 1);
    let (body, last) = text.split_at(body_len);
    let expected = last
        .trim_end()
        .strip_prefix("checksum=")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or_else(|| corrupt(path, format!("no checksum line at byte {body_len}")))?;
    let actual = checksum(body.as_bytes());
    if expected != actual {
        return Err(corrupt(
            path,
            format!("checksum mismatch over bytes 0..{body_len}: expected {expected:016x}, actual {actual:016x}"),
        ));
    }
    let mut fields = Vec::new();
    for (n, line) in body.lines().enumerate() {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| corrupt(path, format!("line {}: expected name=value", n + 1)))?;
        fields.push((k.to_string(), v.to_string()));
    }
    Ok(Some(fields))
}

fn field<'a>(fields: &'a [(String, String)], name: &str, path: &Path) -> Result<&'a str, CliError> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .ok_or_else(|| corrupt(path, format!("no field {name}")))
}

fn number(fields: &[(String, String)], name: &str, path: &Path) -> Result<usize, CliError> {
    let v = field(fields, name, path)?;
    v.parse()
        .map_err(|_| corrupt(path, format!("field {name}: {v:?} is not a number")))
}

fn read_description(root: &Path) -> Result<Option<Description>, CliError> {
    let path = root.join(DESCRIPTION);
    let Some(f) = read_fields(&path)? else { return Ok(None) };
    Ok(Some(Description {
        shape: JobShape {
            shards: number(&f, "shards", &path)?,
            parallelism: number(&f, "parallelism", &path)?,
            inputs: field(&f, "inputs", &path)?.to_string(),
            output: field(&f, "output", &path)?.to_string(),
        },
        instances: number(&f, "instances", &path)?,
        instance: number(&f, "instance", &path)?,
    }))
}

fn write_description(root: &Path, d: &Description) -> Result<(), CliError> {
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

fn read_generation(shard: &Path) -> Result<u64, CliError> {
    let path = shard.join(GENERATION);
    let f = read_fields(&path)?.ok_or_else(|| {
        corrupt(
            &path,
            "missing: a shard folder always has one (it is written before the folder gets its name)".into(),
        )
    })?;
    Ok(number(&f, "generation", &path)? as u64)
}

/// Copies the tree `from` to `to` (which must not exist), every file and
/// folder synced.
fn copy_tree(from: &Path, to: &Path) -> Result<(), CliError> {
    std::fs::create_dir(to).map_err(io_err(to))?;
    for entry in std::fs::read_dir(from).map_err(io_err(from))? {
        let entry = entry.map_err(io_err(from))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(io_err(&src))?;
        if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else if kind.is_file() {
            std::fs::copy(&src, &dst).map_err(io_err(&src))?;
            std::fs::File::open(&dst)
                .and_then(|f| f.sync_all())
                .map_err(io_err(&dst))?;
        } else {
            return Err(corrupt(
                &src,
                "neither a file nor a folder: cannot copy it with its shard".into(),
            ));
        }
    }
    weir_core::checkpoint::storage::sync_dir(to).map_err(io_err(to))
}

/// Puts a shard folder in place at `shard_dir(root, s)`: a copy of `from`
/// (or an empty one when `None`) with generation `generation`, built
/// under a temporary name and renamed, replacing an older copy.
fn install_shard(root: &Path, s: usize, from: Option<&Path>, generation: u64) -> Result<(), CliError> {
    let dst = shard_dir(root, s);
    let tmp = root.join(format!("shard-{s:04}.incoming"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    match from {
        Some(src) => copy_tree(src, &tmp)?,
        None => std::fs::create_dir(&tmp).map_err(io_err(&tmp))?,
    }
    write_fields(&tmp.join(GENERATION), &[("generation", generation.to_string())])?;
    if dst.exists() {
        std::fs::remove_dir_all(&dst).map_err(io_err(&dst))?;
    }
    std::fs::rename(&tmp, &dst).map_err(io_err(&dst))?;
    weir_core::checkpoint::storage::sync_dir(root).map_err(io_err(root))
}

/// Settles which shards process `instance` of `instances` runs and puts
/// their folders under `root`: its own, or copies adopted from the
/// `rescale_from` folders (the old processes' folders). `shape` is the
/// job as this start sees it, with `shards` 0 when not known yet;
/// `count_shards` gives the number for a job's first start.
pub fn prepare(
    root: &Path,
    rescale_from: &[PathBuf],
    instances: usize,
    instance: usize,
    mut shape: JobShape,
    count_shards: impl FnOnce() -> Result<usize, CliError>,
) -> Result<Plan, CliError> {
    std::fs::create_dir_all(root).map_err(io_err(root))?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    };
    let others: Vec<&PathBuf> = rescale_from.iter().filter(|f| !same(f, root)).collect();
    let local = read_description(root)?;
    let mut known: Vec<(PathBuf, Description)> = Vec::new();
    if let Some(d) = &local {
        known.push((root.to_path_buf(), d.clone()));
    }
    for f in &others {
        let d = read_description(f)?.ok_or_else(|| {
            CliError::Usage(format!(
                "--rescale-from {}: not a folder of a `weir run --instances` process (it has no file {DESCRIPTION})",
                f.display()
            ))
        })?;
        known.push(((*f).clone(), d));
    }
    if let Some((first, d)) = known.first() {
        shape.shards = d.shape.shards;
        for (f, d) in &known {
            if d.shape != shape {
                return Err(CliError::Usage(format!(
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
                )));
            }
        }
    } else {
        shape.shards = count_shards()?;
    }
    let shards = shape.shards;
    if instances > shards {
        return Err(CliError::Usage(format!(
            "--instances {instances}: the job has {shards} shards (one per partition of its first input topic at \
             its first start), so at most {shards} processes can share it"
        )));
    }
    if let Some(d) = &local {
        if (d.instances, d.instance) != (instances, instance) && others.is_empty() {
            return Err(CliError::Usage(format!(
                "{} was process {} of {}, and this is process {instance} of {instances}: to rescale, pass every \
                 old process's checkpoint folder with --rescale-from (each process copies the shards it now \
                 owns from them)",
                root.display(),
                d.instance,
                d.instances
            )));
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
            if d.is_dir() {
                copies.push((read_generation(&d)?, f.clone()));
            }
        }
        copies.sort_by_key(|c| std::cmp::Reverse(c.0));
        match copies.as_slice() {
            [] if fresh_job => install_shard(root, s, None, 0)?,
            [] => {
                return Err(CliError::Usage(format!(
                    "shard {s} is in none of the folders {} and {}: pass the checkpoint folder of the process that \
                     ran it with --rescale-from",
                    root.display(),
                    others
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
            [(g, a), (h, b), ..] if g == h => {
                return Err(CliError::Usage(format!(
                    "shard {s} has generation {g} in both {} and {}: two processes ran it as its owner at once \
                     (the same --instance twice?); keep the folder of the one whose output counts",
                    a.display(),
                    b.display()
                )))
            }
            [(g, f), ..] if !same(f, root) => {
                install_shard(root, s, Some(&shard_dir(f, s)), g + 1)?;
                adopted.push((s, f.clone(), g + 1));
            }
            [_, ..] => {}
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

    fn shape() -> JobShape {
        JobShape {
            shards: 0,
            parallelism: 1,
            inputs: "in".into(),
            output: "out".into(),
        }
    }

    fn plan(root: &Path, from: &[PathBuf], n: usize, i: usize) -> Result<Plan, CliError> {
        prepare(root, from, n, i, shape(), || Ok(6))
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
        let e = plan(&f[0], &[], 3, 0).unwrap_err().to_string();
        assert!(e.contains("--rescale-from"), "{e}");
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
        let e = prepare(&f[0], &f, 2, 0, other, || Ok(6)).unwrap_err().to_string();
        assert!(e.contains("keeps its inputs"), "{e}");
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

    #[test]
    fn the_small_files_are_checksummed() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("f");
        write_fields(&path, &[("a", "1".into())]).unwrap();
        assert_eq!(read_fields(&path).unwrap().unwrap(), vec![("a".into(), "1".into())]);
        std::fs::write(&path, std::fs::read_to_string(&path).unwrap().replace("a=1", "a=2")).unwrap();
        let e = read_fields(&path).unwrap_err().to_string();
        assert!(e.contains("checksum mismatch"), "{e}");
        assert!(read_fields(&t.path().join("none")).unwrap().is_none());
    }
}
