//! Restore: rebuilding an arena from the handles of a completed checkpoint,
//! possibly written at another parallelism.
//!
//! Every file a handle lists (or its inline image) is read and verified
//! completely (see [`super::format::read_verified`]) before any byte of it
//! is used. Pages are owned by one key group each, so rescaling is a page-level filter:
//! pages of key groups this store owns are copied into new pages of its
//! arena (a map from the old store's page numbers to new ones per handle),
//! the others skipped. Files are applied in chain order, full base first,
//! each delta overwriting the slots it carries; pages of one file are
//! distinct, so each file is applied in parallel.

use std::path::Path;

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use super::arena::{Arena, PageWriter, MAX_FILE_EPOCH, PAGE_MAGIC, PAGE_TRAILER};
use super::format::{self, RecordKind};
use super::handle::{SlotLayout, StateHandle};
use super::options::StoreOptions;
use super::pack::unpack;
use crate::error::{Error, Result};

/// Full pages per positioned write when restoring: 256 pages of 4 KiB make
/// 1 MiB writes, large enough to amortise the system call and small enough
/// to spread over rayon's threads.
const RUN_PAGES: usize = 256;

/// Checks that a page image's trailer is one and names the record's key
/// group.
fn check_trailer(file: &str, r: &format::Record, trailer: &[u8]) -> Result<()> {
    let head_kg = u32::from_le_bytes(trailer[0..4].try_into().expect("4 bytes"));
    let magic = u32::from_le_bytes(trailer[4..8].try_into().expect("4 bytes"));
    if head_kg != r.kg || magic != PAGE_MAGIC {
        return Err(refuse(format!(
            "file {file}: page {} image has key group {head_kg}, record says {}",
            r.page, r.kg
        )));
    }
    Ok(())
}

fn refuse(message: String) -> Error {
    Error::State {
        context: "restoring keyed state".into(),
        message,
    }
}

/// A verified state file's epoch, refused past the largest a store
/// reaches (the restored arena counts on above it). Files are checksummed,
/// so only a damaged or forged one gets here.
fn file_epoch(epoch: u32, file: &str) -> Result<u32> {
    if epoch > MAX_FILE_EPOCH {
        return Err(refuse(format!(
            "{file}: written at epoch {epoch}, past the largest a store reaches ({MAX_FILE_EPOCH}): \
             the file is damaged; restore an older checkpoint"
        )));
    }
    Ok(epoch)
}

impl Arena {
    /// An arena holding the key groups of `opts` from `handles`.
    pub(crate) fn restore(
        opts: StoreOptions,
        layout: SlotLayout,
        root: &Path,
        handles: &[StateHandle],
    ) -> Result<Arena> {
        let mut arena = Arena::create(opts, layout)?;
        let want = arena.opts.key_groups.clone();
        for h in handles {
            if h.layout != layout {
                return Err(refuse(format!(
                    "checkpoint {} has slot layout {:?}, this store {layout:?} (another key or value type?)",
                    h.checkpoint_id, h.layout
                )));
            }
            if h.max_parallelism != arena.opts.max_parallelism {
                return Err(refuse(format!(
                    "checkpoint {} has max parallelism {}, this store {}: key groups differ",
                    h.checkpoint_id, h.max_parallelism, arena.opts.max_parallelism
                )));
            }
        }
        let mut sorted: Vec<&StateHandle> = handles.iter().collect();
        sorted.sort_by_key(|h| h.key_groups.start);
        for pair in sorted.windows(2) {
            if pair[0].key_groups.end > pair[1].key_groups.start {
                return Err(refuse(format!(
                    "handles overlap: key groups {:?} and {:?}",
                    pair[0].key_groups, pair[1].key_groups
                )));
            }
        }
        if let Some(kg) = want
            .clone()
            .find(|kg| !handles.iter().any(|h| h.key_groups.contains(kg)))
        {
            return Err(refuse(format!("no handle covers key group {kg} of {want:?}")));
        }

        let mut max_epoch = 0;
        for h in handles
            .iter()
            .filter(|h| h.key_groups.start < want.end && want.start < h.key_groups.end)
        {
            let mut page_map: FxHashMap<u32, usize> = FxHashMap::default();
            if let Some(image) = &h.inline {
                if !h.files.is_empty() {
                    return Err(refuse(format!(
                        "checkpoint {}: a handle lists files and an inline image",
                        h.checkpoint_id
                    )));
                }
                let verified = format::verify_inline(image.clone(), h.checkpoint_id, &layout)?;
                let name = format::inline_name(h.checkpoint_id);
                max_epoch = max_epoch.max(file_epoch(verified.epoch, &name)?);
                arena.apply_file(h, &name, &verified, &mut page_map)?;
            }
            for file in &h.files {
                let verified = format::read_verified(root, h.checkpoint_id, file, &layout)?;
                max_epoch = max_epoch.max(file_epoch(verified.epoch, &file.path)?);
                arena.apply_file(h, &file.path, &verified, &mut page_map)?;
            }
        }
        arena.continue_epochs(max_epoch);
        Ok(arena)
    }

    /// Applies the verified records of one file of handle `h`; `page_map`
    /// maps the old store's page numbers to this arena's.
    fn apply_file(
        &mut self,
        h: &StateHandle,
        file: &str,
        verified: &format::Verified,
        page_map: &mut FxHashMap<u32, usize>,
    ) -> Result<()> {
        let (runs, deltas) = self.place_records(h, file, verified, page_map)?;
        let writer = self.page_writer();
        write_runs(&writer, &self.layout, file, verified, &runs)?;
        apply_deltas(&writer, &self.layout, file, verified, &deltas)
    }

    /// Finds each record's page in this arena (a new one for a page not
    /// seen before), skipping key groups this store does not own; returns
    /// the full and packed pages in runs, and the deltas.
    fn place_records(
        &mut self,
        h: &StateHandle,
        file: &str,
        verified: &format::Verified,
        page_map: &mut FxHashMap<u32, usize>,
    ) -> Result<(Runs, Deltas)> {
        let want = self.opts.key_groups.clone();
        // Targets, and runs of full pages bound for consecutive new pages
        // of one segment (written with one positioned write each).
        let mut runs: Runs = Vec::new();
        let mut deltas: Deltas = Vec::new();
        for (i, r) in verified.records.iter().enumerate() {
            let kg = r.kg as usize;
            if !h.key_groups.contains(&kg) {
                return Err(refuse(format!(
                    "file {} holds a page of key group {kg}, outside its handle's {:?}",
                    file, h.key_groups
                )));
            }
            if !want.contains(&kg) {
                continue;
            }
            let (target, fresh) = match page_map.get(&r.page) {
                Some(&p) => (p, false),
                None => {
                    let p = self.append_page(0)?;
                    page_map.insert(r.page, p);
                    (p, true)
                }
            };
            match r.kind {
                RecordKind::Full | RecordKind::Packed(_) => {
                    let writer = self.page_writer();
                    match runs.last_mut() {
                        Some((first, recs))
                            if *first + recs.len() == target
                                && recs.len() < RUN_PAGES
                                && writer.same_segment(*first, target) =>
                        {
                            recs.push(i)
                        }
                        _ => runs.push((target, vec![i])),
                    }
                }
                RecordKind::Delta(_) => deltas.push((i, target, fresh)),
            }
        }
        Ok((runs, deltas))
    }
}

/// Runs of full (or packed) page records bound for consecutive new pages of
/// one segment: the first target page, and the records.
type Runs = Vec<(usize, Vec<usize>)>;

/// Delta records: the record, its target page, and whether that page is
/// new here.
type Deltas = Vec<(usize, usize, bool)>;

/// Writes the full and packed pages of `runs`, each run with one positioned
/// write, runs in parallel.
fn write_runs(
    writer: &PageWriter<'_>,
    layout: &SlotLayout,
    file: &str,
    verified: &format::Verified,
    runs: &Runs,
) -> Result<()> {
    let bytes = &verified.bytes[..];
    let ps = layout.page_size as usize;
    runs.par_iter().try_for_each(|(first, recs)| {
        let mut buf = Vec::with_capacity(recs.len() * ps);
        for &i in recs {
            let r = &verified.records[i];
            let payload = r.payload(bytes, layout);
            let image = if let RecordKind::Packed(_) = r.kind {
                let at = buf.len();
                buf.resize(at + ps, 0);
                unpack(payload, &mut buf[at..]).map_err(|e| {
                    refuse(format!(
                        "file {file}: packed page {} of key group {}: {e}",
                        r.page, r.kg
                    ))
                })?;
                at
            } else {
                buf.extend_from_slice(payload);
                buf.len() - ps
            };
            check_trailer(file, r, &buf[image + ps - PAGE_TRAILER..image + ps])?;
        }
        writer.write_pages(*first, &buf)
    })
}

/// Applies the delta records: each changed slot copied into its page, in
/// parallel (a file holds each page once).
fn apply_deltas(
    writer: &PageWriter<'_>,
    layout: &SlotLayout,
    file: &str,
    verified: &format::Verified,
    deltas: &Deltas,
) -> Result<()> {
    let bytes = &verified.bytes[..];
    let ps = layout.page_size as usize;
    let spp = layout.slots_per_page();
    let slot = layout.slot_size as usize;
    deltas.par_iter().try_for_each(|&(i, target, fresh)| {
        let r = &verified.records[i];
        // SAFETY: `target` was allocated for this record alone (a file
        // holds each page once), so no other thread writes it; it spans
        // page_size mapped bytes.
        let dst = unsafe { writer.page_ptr(target) };
        if fresh {
            // A page first seen in an increment: give it its trailer.
            // SAFETY: the trailer's first 8 bytes lie inside the page.
            unsafe {
                let t = dst.add(ps - PAGE_TRAILER);
                t.cast::<u32>().write(r.kg);
                t.add(4).cast::<u32>().write(PAGE_MAGIC);
            }
        }
        for entry in r.payload(bytes, layout).chunks_exact(4 + slot) {
            let i = u32::from_le_bytes(entry[0..4].try_into().expect("4 bytes")) as usize;
            if i >= spp {
                return Err(refuse(format!("file {}: page {} has slot {i} of {spp}", file, r.page)));
            }
            // SAFETY: slot i < slots_per_page lies inside the page.
            unsafe { std::ptr::copy_nonoverlapping(entry[4..].as_ptr(), dst.add(i * slot), slot) };
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::MAX_FILE_EPOCH;
    use crate::state::{StateHandle, StoreOptions, ValueStore, MIN_PAGE_SIZE};

    type Values = ValueStore<u64, u64>;

    /// A snapshot file of `dir`'s store rewritten to claim `epoch`, with
    /// every checksum fixed (a damaged or forged file that verifies).
    fn file_claiming(dir: &std::path::Path, epoch: u32) -> StateHandle {
        let opts = StoreOptions::new(dir.join("work"))
            .with_max_parallelism(4)
            .with_key_groups(0..4)
            .with_page_size(MIN_PAGE_SIZE);
        let mut store = Values::create(opts).unwrap();
        for k in 0..10u64 {
            *store.get_or_default(&k) = k;
        }
        let mut handle = store.snapshot(1).write(&dir.join("chk")).unwrap();
        let path = dir.join("chk").join(&handle.files[0].path);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[32..36].copy_from_slice(&epoch.to_le_bytes());
        (crate::fuzzing::STATE_FILE.fix_checksums)(&mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        handle.files[0].crc32 = crc32fast::hash(&bytes);
        handle
    }

    fn restore(dir: &std::path::Path, handle: StateHandle) -> crate::Result<Values> {
        let opts = StoreOptions::new(dir.join("restored"))
            .with_max_parallelism(4)
            .with_key_groups(0..4)
            .with_page_size(MIN_PAGE_SIZE);
        Values::restore(opts, &dir.join("chk"), &[handle])
    }

    /// Regression (tests/fuzz_decoders.rs `state_image` found it): a file
    /// whose epoch is past `MAX_FILE_EPOCH` made the restored store panic
    /// on epoch overflow; restore refuses it, naming the file. The largest
    /// epoch allowed still restores.
    #[test]
    fn a_state_file_past_the_largest_epoch_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let handle = file_claiming(dir.path(), MAX_FILE_EPOCH + 1);
        let name = handle.files[0].path.clone();
        let e = restore(dir.path(), handle).expect_err("refused").to_string();
        assert!(e.contains(&name), "{e}");
        assert!(
            e.contains(&format!("past the largest a store reaches ({MAX_FILE_EPOCH})")),
            "{e}"
        );

        let dir = tempfile::tempdir().unwrap();
        let store = restore(dir.path(), file_claiming(dir.path(), MAX_FILE_EPOCH)).unwrap();
        assert_eq!(store.get(&7), Some(&7));
    }
}
