//! Restore: rebuilding an arena from the handles of a completed checkpoint,
//! possibly written at another parallelism.
//!
//! Every file a handle lists is read and verified completely (see
//! [`super::format::read_verified`]) before any byte of it is used. Pages
//! are owned by one key group each, so rescaling is a page-level filter:
//! pages of key groups this store owns are copied into new pages of its
//! arena (a map from the old store's page numbers to new ones per handle),
//! the others skipped. Files are applied in chain order, full base first,
//! each delta overwriting the slots it carries; pages of one file are
//! distinct, so each file is applied in parallel.

use std::path::Path;

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use super::arena::{Arena, PAGE_HEADER, PAGE_MAGIC};
use super::format::{self, RecordKind};
use super::handle::{SlotLayout, StateHandle};
use super::options::StoreOptions;
use crate::error::{Error, Result};

fn refuse(message: String) -> Error {
    Error::State {
        context: "restoring keyed state".into(),
        message,
    }
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

        for h in handles
            .iter()
            .filter(|h| h.key_groups.start < want.end && want.start < h.key_groups.end)
        {
            let mut page_map: FxHashMap<u32, usize> = FxHashMap::default();
            for file in &h.files {
                let t = std::time::Instant::now();
                let (bytes, records) = format::read_verified(root, h.checkpoint_id, file, &layout)?;
                if std::env::var_os("WEIR_STATE_TRACE").is_some() {
                    eprintln!("TRACE read+verify {:?} {}", t.elapsed(), bytes.len());
                }
                let mut targets = Vec::with_capacity(records.len());
                for r in &records {
                    let kg = r.kg as usize;
                    if !h.key_groups.contains(&kg) {
                        return Err(refuse(format!(
                            "file {} holds a page of key group {kg}, outside its handle's {:?}",
                            file.path, h.key_groups
                        )));
                    }
                    let target = if want.contains(&kg) {
                        Some(match page_map.get(&r.page) {
                            Some(&p) => p,
                            None => {
                                let p = arena.new_page(kg, false)?;
                                page_map.insert(r.page, p);
                                p
                            }
                        })
                    } else {
                        None
                    };
                    targets.push(target);
                }
                let writer = arena.page_writer();
                let spp = layout.slots_per_page();
                let slot = layout.slot_size as usize;
                records.par_iter().zip(targets.par_iter()).try_for_each(|(r, target)| {
                    let Some(target) = *target else { return Ok(()) };
                    let payload = r.payload(&bytes, &layout);
                    // SAFETY: `target` was allocated above for this record
                    // alone (a file holds each page once), so no other
                    // thread writes it; it spans page_size mapped bytes.
                    let dst = unsafe { writer.page_ptr(target) };
                    match r.kind {
                        RecordKind::Full => {
                            let head_kg = u32::from_le_bytes(payload[0..4].try_into().expect("4 bytes"));
                            let magic = u32::from_le_bytes(payload[4..8].try_into().expect("4 bytes"));
                            if head_kg != r.kg || magic != PAGE_MAGIC {
                                return Err(refuse(format!(
                                    "file {}: page {} image has key group {head_kg}, record says {}",
                                    file.path, r.page, r.kg
                                )));
                            }
                            // SAFETY: dst spans a whole page, payload is one page.
                            unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, payload.len()) };
                        }
                        RecordKind::Delta(_) => {
                            for entry in payload.chunks_exact(4 + slot) {
                                let i = u32::from_le_bytes(entry[0..4].try_into().expect("4 bytes")) as usize;
                                if i >= spp {
                                    return Err(refuse(format!(
                                        "file {}: page {} has slot {i} of {spp}",
                                        file.path, r.page
                                    )));
                                }
                                // SAFETY: slot i < slots_per_page lies inside the page.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        entry[4..].as_ptr(),
                                        dst.add(PAGE_HEADER + i * slot),
                                        slot,
                                    )
                                };
                            }
                        }
                    }
                    Ok(())
                })?;
            }
        }
        if std::env::var_os("WEIR_STATE_TRACE").is_some() {
            eprintln!("TRACE applied");
        }
        Ok(arena)
    }
}
