//! The decoders of weir-core, as the fuzz targets (`fuzz/`) and the
//! mutation test (`tests/fuzz_decoders.rs`) drive them: each takes bytes
//! as they would be read back from disk and runs the same code a restore
//! runs on them. **Not a stable API**: it exists for those two and may
//! change with any release.
//!
//! Every [`Decoder`] must return an error for bad input, never panic,
//! never hang, and never allocate more than its stated bound
//! ([`Decoder::max_alloc`]) however its length fields lie. Each one also
//! has a checksum fixer: checksums stop almost every random mutation at
//! the first check, so the fuzzers also decode each input with its
//! checksums recomputed, to reach the code behind them (which must not
//! trust the bytes either: a checksum catches corruption, not a bug that
//! wrote the wrong bytes).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::checkpoint::snapshot::TaskState;
use crate::checkpoint::storage::Manifest;
use crate::state::{ListStore, MapStore, StateHandle, StoreOptions, ValueStore};

/// One decoder under test.
#[derive(Clone, Copy)]
pub struct Decoder {
    /// The fuzz target's name, also its seed corpus folder
    /// (`fuzz/corpus/<name>/`).
    pub name: &'static str,
    /// Decodes (and verifies) `bytes`; an error for anything not valid.
    pub decode: fn(&[u8]) -> Result<(), String>,
    /// Recomputes the checksums of `bytes` in place (or re-encodes it),
    /// where its structure can still be made out; leaves the rest alone.
    pub fix_checksums: fn(&mut Vec<u8>),
    /// The most bytes one [`Decoder::decode`] of an input of this length
    /// may have allocated at once (heap, all threads).
    pub max_alloc: fn(usize) -> usize,
}

impl Decoder {
    /// What a fuzz target runs: `decode` of the input as it is, then of the
    /// input with its checksums fixed. Panics only if a decoder does.
    pub fn fuzz(&self, bytes: &[u8]) {
        let _ = (self.decode)(bytes);
        let mut fixed = bytes.to_vec();
        (self.fix_checksums)(&mut fixed);
        if fixed != bytes {
            let _ = (self.decode)(&fixed);
        }
    }
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// `bytes` with one bit flipped, for each of the 8 bits of every byte in
/// turn: `(byte, bit, the flipped bytes)`. For the unit tests (weir-core's
/// and weir-io's) that hold a decoder to the rule of [`crate::storage::corruption`]:
/// a flipped bit is refused with a position at or before the flipped byte
/// (where the damage may start, never past it), or provably not used.
pub fn bit_flips(bytes: &[u8]) -> impl Iterator<Item = (usize, u32, Vec<u8>)> + '_ {
    (0..bytes.len()).flat_map(move |i| {
        (0..8).map(move |bit| {
            let mut b = bytes.to_vec();
            b[i] ^= 1 << bit;
            (i, bit, b)
        })
    })
}

/// 1 MiB: serde's cautious preallocation of one sequence whose length
/// field is large (postcard sequences; serde caps it at this).
const SEQ_PREALLOC: usize = 1 << 20;

/// The decoders of weir-core.
pub const DECODERS: &[Decoder] = &[MANIFEST, TASK_STATE, STATE_FILE, STATE_IMAGE];

/// A checkpoint manifest (`chk-*/MANIFEST`): [`Manifest::decode`] (JSON
/// line, CRC line, inline task states against their CRCs), then each
/// inline task state as [`TASK_STATE`], as a restore loads them. Bound:
/// 64 KiB + 24 x the input (JSON values, inline frames and what
/// [`TASK_STATE`] allocates for them) + 4 x 1 MiB (serde's cautious
/// preallocation, as in [`TASK_STATE`]).
pub const MANIFEST: Decoder = Decoder {
    name: "manifest",
    decode: manifest,
    fix_checksums: fix_manifest,
    max_alloc: |len| (64 << 10) + 24 * len + 4 * SEQ_PREALLOC,
};

/// A task state frame (a task state file, or an inline state in a
/// manifest): magic, length, postcard payload, CRC ([`TaskState`]); then
/// each operator state that decodes as state-backend handles, and each
/// inline snapshot image in them restored as [`STATE_IMAGE`] would. Bound:
/// 256 KiB + 24 x the input (the payload, the handles, the restored
/// stores' indexes) + 4 x 1 MiB (serde's cautious preallocation for the
/// sequences of the payload, whatever their length fields say).
pub const TASK_STATE: Decoder = Decoder {
    name: "task_state",
    decode: task_state,
    fix_checksums: fix_task_state,
    max_alloc: |len| (256 << 10) + 24 * len + 4 * SEQ_PREALLOC,
};

/// State-backend files: one file, or a base and its deltas back to back
/// (split where each file's `WEIRSTAT` magic starts), listed in a handle
/// in that order and restored into a value, map or list store (the kind
/// the first file's header names) as [`ValueStore::restore`] and its
/// siblings do: size and whole-file CRC, header, every record's CRC,
/// trailer, then every page applied (packed pages unpacked, delta slots
/// bounded) and every key and value decoded. Restored twice: into all
/// key groups and into half of them (rescaling). Bound: 256 KiB + 8 x the
/// input (in-memory indexes of what the pages hold; pages themselves are
/// mapped, not allocated).
pub const STATE_FILE: Decoder = Decoder {
    name: "state_file",
    decode: state_files,
    fix_checksums: |b| fix_state_files(b),
    max_alloc: |len| (256 << 10) + 8 * len,
};

/// The inline snapshot image a state handle carries (the state file
/// format, pages usually packed), restored as [`STATE_FILE`]. Bound as
/// [`STATE_FILE`] plus a copy of the image and, per packed page, its
/// unpacked 4 KiB (a packed page may be a few bytes).
pub const STATE_IMAGE: Decoder = Decoder {
    name: "state_image",
    decode: state_image,
    fix_checksums: |b| fix_state_image(b),
    max_alloc: |len| (256 << 10) + 8 * len + len / 21 * 4096,
};

/// Page size of the stores the state decoders restore into (and the seeds
/// are written with): the smallest, so seeds stay small.
const PAGE_SIZE: usize = crate::state::MIN_PAGE_SIZE;
/// Key groups of those stores.
const KEY_GROUPS: usize = 4;
/// Checkpoint id the state decoders restore: files of checkpoints up to it
/// are accepted.
const CHECKPOINT: u64 = 1_000;

type Values = ValueStore<u64, u64>;
type Maps = MapStore<u64, u64, String>;
type Lists = ListStore<u64, String>;

/// A folder of this process, removed when dropped: where decoders that
/// read files put them. In `/dev/shm` where there is one (memory: the
/// fuzzers make thousands a second), else in the temporary folder.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new, empty folder.
    pub fn new() -> Result<Scratch, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("weir-fuzz-{}-{n}", std::process::id());
        let shm = Path::new("/dev/shm").join(&name);
        if std::fs::create_dir(&shm).is_ok() {
            return Ok(Scratch(shm));
        }
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Scratch {
    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn opts(dir: &Path, key_groups: std::ops::Range<usize>) -> StoreOptions {
    StoreOptions::new(dir.join("work"))
        .with_max_parallelism(KEY_GROUPS)
        .with_key_groups(key_groups)
        .with_page_size(PAGE_SIZE)
}

/// Restores `handles` into a store of the kind of `image`'s header (a
/// value store if it names none), into all key groups and then into the
/// first half, and reads every entry back.
fn restore(kind_of: &[u8], root: &Path, handles: &[StateHandle]) -> Result<(), String> {
    let kind = kind_of.get(13).copied().unwrap_or(0);
    for (i, kgs) in [0..KEY_GROUPS, 0..KEY_GROUPS / 2].into_iter().enumerate() {
        let o = opts(&root.join(format!("restore-{i}")), kgs);
        let e = |e: crate::Error| e.to_string();
        match kind {
            1 => {
                let store = Maps::restore(o, root, handles).map_err(e)?;
                store.for_each(|_, _, v| drop(v));
            }
            2 => {
                let store = Lists::restore(o, root, handles).map_err(e)?;
                store.for_each(|_, v| drop(v));
            }
            _ => {
                let store = Values::restore(o, root, handles).map_err(e)?;
                store.for_each(|_, _| {});
            }
        }
    }
    Ok(())
}

/// A handle over `files` or an inline image, with the layout the restoring
/// store of `kind_of`'s kind expects.
fn handle(kind_of: &[u8], files: Vec<crate::state::StateFile>, inline: Option<Vec<u8>>) -> Result<StateHandle, String> {
    let o = opts(Path::new("."), 0..KEY_GROUPS);
    let layout = match kind_of.get(13).copied().unwrap_or(0) {
        1 => Maps::layout(&o),
        2 => Lists::layout(&o),
        _ => Values::layout(PAGE_SIZE),
    }
    .map_err(|e| e.to_string())?;
    Ok(StateHandle {
        checkpoint_id: CHECKPOINT,
        max_parallelism: KEY_GROUPS,
        key_groups: 0..KEY_GROUPS,
        layout,
        full: files.len() <= 1,
        files,
        inline,
        state_bytes: 0,
        written_bytes: 0,
        sync_micros: 0,
        async_micros: 0,
    })
}

/// Where each file of a chain of state files back to back starts: at 0
/// and at each later `WEIRSTAT` magic.
fn file_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = vec![0];
    starts.extend(
        bytes
            .windows(8)
            .enumerate()
            .skip(1)
            .filter(|(_, w)| w == b"WEIRSTAT")
            .map(|(i, _)| i),
    );
    starts
}

fn pieces(bytes: &[u8]) -> Vec<&[u8]> {
    let starts = file_starts(bytes);
    starts
        .iter()
        .enumerate()
        .map(|(i, &s)| &bytes[s..starts.get(i + 1).copied().unwrap_or(bytes.len())])
        .collect()
}

fn state_files(bytes: &[u8]) -> Result<(), String> {
    let scratch = Scratch::new()?;
    let shared = scratch.0.join("shared");
    std::fs::create_dir_all(&shared).map_err(|e| e.to_string())?;
    let mut files = Vec::new();
    for (i, piece) in pieces(bytes).into_iter().enumerate() {
        let path = format!("shared/f{i}.pages");
        std::fs::write(scratch.0.join(&path), piece).map_err(|e| e.to_string())?;
        files.push(crate::state::StateFile {
            path,
            size: piece.len() as u64,
            crc32: crc32fast::hash(piece),
        });
    }
    let h = handle(bytes, files, None)?;
    restore(bytes, &scratch.0, &[h])
}

fn state_image(bytes: &[u8]) -> Result<(), String> {
    let scratch = Scratch::new()?;
    let h = handle(bytes, Vec::new(), Some(bytes.to_vec()))?;
    restore(bytes, &scratch.0, &[h])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn put_crc(b: &mut [u8], at: usize, crc: u32) {
    b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Fixes the header CRC, each record's CRC (as far as the records can be
/// walked) and the trailer's CRCs of one state file.
fn fix_state_file(b: &mut [u8]) {
    use crate::state::format::{HEADER_LEN, RECORD_HEADER_LEN, TRAILER_LEN};
    if b.len() < HEADER_LEN {
        return;
    }
    let c = crc32fast::hash(&b[..44]);
    put_crc(b, 44, c);
    let (page, slot) = (u32_at(b, 16) as usize, u32_at(b, 20) as usize);
    let body_end = b.len().saturating_sub(TRAILER_LEN).max(HEADER_LEN);
    let mut at = HEADER_LEN;
    while at + RECORD_HEADER_LEN <= body_end {
        let (kind, count) = (u32_at(b, at + 8) as usize, u32_at(b, at + 12) as usize);
        let len = match kind {
            0 => page,
            1 => count.saturating_mul(slot.saturating_add(4)),
            _ => count,
        };
        let end = at.saturating_add(RECORD_HEADER_LEN).saturating_add(len);
        if end > body_end {
            break;
        }
        let mut h = crc32fast::Hasher::new();
        h.update(&b[at..at + 16]);
        h.update(&b[at + RECORD_HEADER_LEN..end]);
        put_crc(b, at + 16, h.finalize());
        at = end;
    }
    if b.len() >= HEADER_LEN + TRAILER_LEN {
        let t = b.len() - TRAILER_LEN;
        let body = crc32fast::hash(&b[..t]);
        put_crc(b, t + 16, body);
        let c = crc32fast::hash(&b[t..t + 20]);
        put_crc(b, t + 20, c);
    }
}

fn fix_state_files(b: &mut [u8]) {
    let starts = file_starts(b);
    for (i, &s) in starts.iter().enumerate() {
        let e = starts.get(i + 1).copied().unwrap_or(b.len());
        fix_state_file(&mut b[s..e]);
    }
}

fn fix_state_image(b: &mut [u8]) {
    fix_state_file(b);
}

/// The task state frame with its payload decoded, as a restore does, and
/// each operator state that is a list of state-backend handles restored.
fn task_state(bytes: &[u8]) -> Result<(), String> {
    let state = TaskState::decode(bytes, "task state")?;
    for (_, op) in &state.operators {
        restore_handles(op)?;
    }
    Ok(())
}

/// Decodes `op` as state handles if it is some (other operator states are
/// opaque here) and restores those with an inline image.
fn restore_handles(op: &[u8]) -> Result<(), String> {
    let Ok(handles) = crate::operators::stores::decode_handles(op) else {
        return Ok(());
    };
    for h in handles.iter().take(4) {
        if let (Some(image), true) = (&h.inline, h.files.is_empty()) {
            let scratch = Scratch::new()?;
            restore(image, &scratch.0, std::slice::from_ref(h))?;
        }
    }
    Ok(())
}

fn fix_task_state(b: &mut Vec<u8>) {
    if b.len() < 20 {
        return;
    }
    let len = b.len() - 20;
    b[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    if let Ok(mut st) = postcard::from_bytes::<TaskState>(&b[16..16 + len]) {
        for (_, op) in &mut st.operators {
            if let Ok(mut handles) = crate::operators::stores::decode_handles(op) {
                for h in &mut handles {
                    if let Some(image) = &mut h.inline {
                        fix_state_image(image);
                    }
                }
                *op = crate::operators::stores::encode_handles(&handles);
            }
        }
        *b = st.encode();
        return;
    }
    let c = crc32fast::hash(&b[16..16 + len]);
    put_crc(b, 16 + len, c);
}

fn manifest(bytes: &[u8]) -> Result<(), String> {
    let m = Manifest::decode(bytes, Path::new("MANIFEST"))?;
    for t in &m.tasks {
        if t.inline_offset.is_some() {
            let frame = t
                .state_bytes_in(Path::new("/nonexistent"), &m)
                .map_err(|e| e.to_string())?;
            task_state(&frame)?;
        }
    }
    Ok(())
}

/// Re-encodes a manifest whose JSON still parses (inline task states with
/// their frames fixed, their offsets, sizes and CRCs recomputed); else
/// recomputes the CRC line only.
fn fix_manifest(b: &mut Vec<u8>) {
    let Some(json_end) = b.iter().position(|&c| c == b'\n') else {
        return;
    };
    if let Ok(mut m) = serde_json::from_slice::<Manifest>(&b[..json_end]) {
        let inline = b.get(json_end + 16..).unwrap_or_default();
        let mut rebuilt = Vec::new();
        for t in &mut m.tasks {
            let Some(off) = t.inline_offset else { continue };
            let start = usize::try_from(off).unwrap_or(usize::MAX).min(inline.len());
            let end = start
                .saturating_add(usize::try_from(t.file.size).unwrap_or(usize::MAX))
                .min(inline.len());
            let mut frame = inline[start..end].to_vec();
            fix_task_state(&mut frame);
            t.inline_offset = Some(rebuilt.len() as u64);
            t.file.size = frame.len() as u64;
            t.file.crc32 = crc32fast::hash(&frame);
            rebuilt.extend_from_slice(&frame);
        }
        m.inline = rebuilt;
        *b = m.encode();
        return;
    }
    let line = format!("crc32 {:08x}\n", crc32fast::hash(&b[..json_end]));
    let end = (json_end + 16).min(b.len());
    b.splice(json_end + 1..end, line.into_bytes());
}

/// A seed: the decoder's name, the seed's file name, its bytes.
pub type Seed = (&'static str, String, Vec<u8>);

/// Seeds for the decoders of this crate, `(decoder, name, bytes)`, made by
/// weir's own encoders and stores: full, delta and inline snapshots of a
/// value, a map and a list store, task state frames holding them, and
/// manifests with inline task states. Writes scratch files under `dir`.
pub fn seeds(dir: &Path) -> Result<Vec<Seed>, String> {
    let e = |e: crate::Error| e.to_string();
    let mut out = Vec::new();
    let root = dir.join("checkpoints");
    let read = |f: &crate::state::StateFile| std::fs::read(root.join(&f.path)).map_err(|e| e.to_string());
    let mut inline_handles = Vec::new();

    // Value state: a full file, a delta on it, and an inline image.
    let mut values = Values::create(opts(dir, 0..KEY_GROUPS)).map_err(e)?;
    for k in 0..40u64 {
        *values.get_or_default(&k) = k * 3;
    }
    let full = values.snapshot(1).write(&root).map_err(e)?;
    values.snapshot_done(1, true);
    for k in 30..50u64 {
        *values.get_or_default(&k) += 1;
    }
    values.remove(&3);
    let delta = values.snapshot(2).write(&root).map_err(e)?;
    values.snapshot_done(2, true);
    let base = read(&full.files[0])?;
    let inc = read(delta.files.last().expect("a delta"))?;
    out.push(("state_file", "value-full".to_string(), base.clone()));
    out.push(("state_file", "value-full-then-delta".to_string(), [base, inc].concat()));
    let image = values.snapshot_inline(3);
    inline_handles.push(image.clone());
    out.push((
        "state_image",
        "value".to_string(),
        image.inline.clone().unwrap_or_default(),
    ));

    // Map and list state: a full file and an inline image each.
    let mut maps = Maps::create(opts(&dir.join("m"), 0..KEY_GROUPS)).map_err(e)?;
    let mut lists = Lists::create(opts(&dir.join("l"), 0..KEY_GROUPS)).map_err(e)?;
    for k in 0..12u64 {
        for uk in 0..3u64 {
            maps.put(&k, &uk, &format!("v{k}.{uk}")).map_err(e)?;
            lists.append(&k, &format!("e{k}.{uk}")).map_err(e)?;
        }
    }
    let m = maps.snapshot(1).write(&root).map_err(e)?;
    out.push(("state_file", "map-full".to_string(), read(&m.files[0])?));
    let l = lists.snapshot(1).write(&root).map_err(e)?;
    out.push(("state_file", "list-full".to_string(), read(&l.files[0])?));
    maps.snapshot_done(1, true);
    lists.snapshot_done(1, true);
    let mi = maps.snapshot_inline(2);
    let li = lists.snapshot_inline(2);
    out.push(("state_image", "map".to_string(), mi.inline.clone().unwrap_or_default()));
    out.push(("state_image", "list".to_string(), li.inline.clone().unwrap_or_default()));
    inline_handles.push(mi);

    // Task states: a source's offset, a keyed operator's handles, channel state.
    let source = TaskState {
        checkpoint: 3,
        group: 0,
        subtask: 0,
        parallelism: 1,
        source_offset: Some(7u64.to_le_bytes().to_vec()),
        ..TaskState::default()
    };
    let keyed = TaskState {
        checkpoint: 3,
        group: 1,
        subtask: 0,
        parallelism: 1,
        operators: vec![(0, crate::operators::stores::encode_handles(&inline_handles[..1]))],
        input_channels: vec![(0, vec![1, 2, 3])],
        output_channels: vec![(1, vec![4])],
        channel_records: 2,
        ..TaskState::default()
    };
    let mapped = TaskState {
        operators: vec![(1, crate::operators::stores::encode_handles(&inline_handles[1..]))],
        ..keyed.clone()
    };
    for (name, st) in [("source", &source), ("keyed-value", &keyed), ("keyed-map", &mapped)] {
        out.push(("task_state", name.to_string(), st.encode()));
    }

    // Manifests: one with inline task states and a task file, one without.
    let frames = [source.encode(), keyed.encode()];
    let path = "chk-0000000003/MANIFEST".to_string();
    let mut m = Manifest {
        version: crate::checkpoint::storage::MANIFEST_VERSION,
        job: "fuzz-seed".into(),
        fingerprint: "0123456789abcdef".into(),
        id: 3,
        mode: crate::CheckpointMode::Aligned,
        is_final: false,
        trigger_unix_ms: 1_700_000_000_000,
        duration_us: 1234,
        groups: vec![
            crate::checkpoint::storage::ManifestGroup {
                operators: vec!["0.0:numbers".into()],
                parallelism: 1,
            },
            crate::checkpoint::storage::ManifestGroup {
                operators: vec!["1.0:count".into(), "1.1:sink".into()],
                parallelism: 2,
            },
        ],
        tasks: Vec::new(),
        files: Vec::new(),
        inline: Vec::new(),
    };
    let task = |group, subtask, file, inline_offset| crate::checkpoint::storage::ManifestTask {
        group,
        subtask,
        file,
        inline_offset,
        state_bytes: 8,
        channel_state_bytes: 0,
        sync_us: 10,
        async_us: 20,
        alignment_us: 0,
    };
    for (i, frame) in frames.iter().enumerate() {
        let file = crate::checkpoint::storage::FileRef {
            path: path.clone(),
            size: frame.len() as u64,
            crc32: crc32fast::hash(frame),
        };
        m.tasks.push(task(i, 0, file, Some(m.inline.len() as u64)));
        m.inline.extend_from_slice(frame);
    }
    let own = crate::checkpoint::storage::FileRef {
        path: "chk-0000000003/task-001-001.state".into(),
        size: 120,
        crc32: 0xdead_beef,
    };
    m.tasks.push(task(1, 1, own.clone(), None));
    m.files.push(own);
    out.push(("manifest", "inline-and-file-tasks".to_string(), m.encode()));
    m.tasks.truncate(0);
    m.files.clear();
    m.inline.clear();
    m.version = 1;
    out.push(("manifest", "version-1-empty".to_string(), m.encode()));
    Ok(out)
}
