//! The asynchronous part of a snapshot: capturing the pages a checkpoint
//! needs while the task keeps writing, and writing them to one immutable
//! file with checksums.
//!
//! # The claim protocol
//!
//! A job owns one claim word per page that existed at its barrier:
//!
//! | value      | meaning                                                  |
//! |------------|----------------------------------------------------------|
//! | `PENDING`  | not captured; the mapped page still holds the barrier state |
//! | `READING`  | the job is copying the mapped page right now              |
//! | `DONE`     | captured; the job no longer looks at the page             |
//! | a pointer  | the task wrote a private copy of the page before changing it |
//!
//! The job moves `PENDING -> READING -> DONE` (reading the mapped page in
//! between) or takes a copy `pointer -> DONE`. The task, on its first write
//! to a page the job needs, moves `PENDING -> pointer` after copying; if it
//! finds `READING` it spins (bounded by one page `memcpy`, yielding the
//! core after a few spins in case the job's thread is descheduled) until
//! `DONE`. So the task never changes a page the job is reading, and the job
//! reads every page exactly as it was at the barrier.

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rayon::prelude::*;

use super::arena::{EpochChanges, Segment, PAGE_TRAILER, SEGMENT_BYTES};
use super::format::{self, Chunk, RecordKind};
use super::handle::{SlotLayout, StateFile, StateHandle};
use crate::error::Result;

const PENDING: usize = 0;
const READING: usize = 1;
const DONE: usize = 2;

/// Pages per unit of parallel capture work: 64 pages of 4 KiB make 256 KiB
/// output buffers, large enough for efficient writes and small enough to
/// balance across rayon's threads.
const CHUNK_PAGES: usize = 64;

/// Capture units (of CHUNK_PAGES pages) captured in parallel before being
/// written: 64 units of 64 pages of 4 KiB bound a job's buffers to 16 MiB,
/// reused wave after wave, so a full snapshot of state larger than memory
/// needs no more.
const WAVE_UNITS: usize = 64;

/// A unit of capture work.
enum Unit<'a> {
    /// Pages `a..b` (full snapshot).
    Range(usize, usize),
    /// Pages with their changed slots: `(page, start, end)` into the
    /// sorted slot offsets.
    Slots(&'a [(usize, usize, usize)]),
    /// Dirty pages whose slot stamps are scanned.
    Pages(&'a [u32]),
}

/// Spins on a page being read before yielding the core.
const SPINS_BEFORE_YIELD: u32 = 64;

/// What the task and a job share.
pub(crate) struct JobShared {
    epoch: u32,
    base_epoch: u32,
    full: bool,
    page_size: usize,
    claims: Claims,
    finished: AtomicBool,
    /// Page copies the task published and the job took: when equal, no
    /// copy is left to free and dropping skips scanning the claims.
    copies_made: AtomicUsize,
    copies_taken: AtomicUsize,
    /// The file the job wrote, once it has.
    pub(crate) output: Arc<Mutex<Option<StateFile>>>,
}

/// One claim word per page, all `PENDING`, in an anonymous mapping: the
/// kernel hands out zeroed pages lazily, so creating the claims of a
/// 1 GiB state (2 MiB of words) costs one system call, not a 2 MiB memset
/// (`calloc` may serve a large block from the heap and zero it).
struct Claims {
    map: memmap2::MmapMut,
    len: usize,
}

impl Claims {
    fn new(len: usize) -> Claims {
        let bytes = len.max(1) * std::mem::size_of::<AtomicUsize>();
        let map = memmap2::MmapMut::map_anon(bytes).expect("cannot map a snapshot's page claims (out of memory)");
        Claims { map, len }
    }

    fn as_slice(&self) -> &[AtomicUsize] {
        // SAFETY: the mapping is page-aligned (so aligned for AtomicUsize),
        // at least `len` words long and zero-filled by the kernel; zero is a
        // valid AtomicUsize. Atomics allow shared mutation through `&`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicUsize>(), self.len) }
    }
}

/// Frees a page copy made by [`JobShared::protect`].
///
/// # Safety
///
/// `ptr` must come from `Box::<[u8]>::into_raw` of a `page_size` slice and
/// be freed once.
unsafe fn free_copy(ptr: usize, page_size: usize) {
    // SAFETY: per the contract.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr as *mut u8, page_size)) });
}

impl JobShared {
    pub(crate) fn new(epoch: u32, base_epoch: u32, full: bool, n_pages: usize, page_size: usize) -> JobShared {
        JobShared {
            epoch,
            base_epoch,
            full,
            page_size,
            claims: Claims::new(n_pages),
            finished: AtomicBool::new(false),
            copies_made: AtomicUsize::new(0),
            copies_taken: AtomicUsize::new(0),
            output: Arc::new(Mutex::new(None)),
        }
    }

    /// Whether the job captured everything (or gave up): it needs no page.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Called by the task before its first write in an epoch to `page`,
    /// last written in epoch `last`, whose mapped bytes start at `src`: if
    /// this job still needs the page as it is, gives it a private copy.
    pub(crate) fn protect(&self, page: usize, last: u32, src: *const u8) {
        let needed = page < self.claims.len && last <= self.epoch && (self.full || last > self.base_epoch);
        if !needed {
            return;
        }
        let claim = &self.claims.as_slice()[page];
        let mut spins = 0u32;
        loop {
            match claim.load(Ordering::Acquire) {
                PENDING => {
                    // SAFETY: `src` is the start of an allocated page of
                    // `page_size` bytes in a live mapping; the task (this
                    // thread) is its only writer, and is not writing now.
                    let copy: Box<[u8]> = unsafe { std::slice::from_raw_parts(src, self.page_size) }.into();
                    let ptr = Box::into_raw(copy) as *mut u8 as usize;
                    match claim.compare_exchange(PENDING, ptr, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => {
                            self.copies_made.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        // SAFETY: `ptr` was just made from a page-size box and was not published.
                        Err(_) => unsafe { free_copy(ptr, self.page_size) },
                    }
                }
                READING => {
                    spins += 1;
                    if spins < SPINS_BEFORE_YIELD {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                _ => return, // captured, or already copied
            }
        }
    }
}

impl Drop for JobShared {
    fn drop(&mut self) {
        if self.copies_made.get_mut() == self.copies_taken.get_mut() {
            return;
        }
        for claim in self.claims.as_slice() {
            let v = claim.load(Ordering::Relaxed);
            if v > DONE {
                // SAFETY: values above DONE are copies published by
                // `protect` and not taken by the job (taking sets DONE).
                unsafe { free_copy(v, self.page_size) };
            }
        }
    }
}

/// Where a write stops early, to test that a crash at that point leaves
/// earlier checkpoints intact and no half file referenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum FailPoint {
    /// After this many bytes of page records (a torn temp file remains).
    AfterBytes(u64),
    /// After the temp file is complete and synced, before the rename.
    BeforeRename,
    /// After the rename, before the directory is synced.
    BeforeDirSync,
}

/// The asynchronous part of a snapshot, handed off by
/// [`ValueStore::snapshot`](crate::state::ValueStore::snapshot) (and the map
/// and list stores): run [`SnapshotJob::write`] on any thread while the task
/// goes on.
///
/// Dropping a job without writing it releases its claims on the store's
/// pages; the checkpoint then simply has no state file.
pub struct SnapshotJob {
    pub(crate) shared: Arc<JobShared>,
    pub(crate) segments: Vec<Arc<Segment>>,
    /// Changes of the epochs in `(base, epoch]`; empty for a full job.
    pub(crate) lists: Vec<Arc<EpochChanges>>,
    pub(crate) name: String,
    pub(crate) checkpoint_id: u64,
    pub(crate) layout: SlotLayout,
    pub(crate) max_parallelism: usize,
    pub(crate) key_groups: Range<usize>,
    pub(crate) base_files: Vec<StateFile>,
    pub(crate) n_pages: usize,
    pub(crate) sync_micros: u64,
}

impl std::fmt::Debug for SnapshotJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotJob")
            .field("checkpoint_id", &self.checkpoint_id)
            .field("full", &self.shared.full)
            .field("pages", &self.n_pages)
            .field("file", &self.name)
            .finish()
    }
}

impl Drop for SnapshotJob {
    fn drop(&mut self) {
        self.shared.finished.store(true, Ordering::Release);
    }
}

impl SnapshotJob {
    /// The checkpoint this job snapshots.
    pub fn checkpoint_id(&self) -> u64 {
        self.checkpoint_id
    }

    /// Whether this job writes a full snapshot (no base).
    pub fn is_full(&self) -> bool {
        self.shared.full
    }

    /// Captures the pages this checkpoint needs, checksums them in parallel
    /// (rayon) and writes them durably to one new file under
    /// `<checkpoint_root>/shared/`: temp name, fsync, rename, fsync of the
    /// directory. Returns the handle listing every file a restore needs.
    ///
    /// On error nothing is referenced: a temp file may remain (named
    /// `*.tmp`, see [`remove_temp_files`](crate::state::remove_temp_files)),
    /// and every earlier checkpoint's files are untouched.
    pub fn write(self, checkpoint_root: &Path) -> Result<StateHandle> {
        self.write_with(checkpoint_root, None, true)
    }

    /// [`SnapshotJob::write`] without the final fsync of `shared/`: the
    /// file's data is durable and it is renamed into place, but the rename
    /// is durable only once the caller fsyncs `<checkpoint_root>/shared`
    /// (the checkpoint coordinator does, once for all of a checkpoint's
    /// files, before its manifest). One disk wait less per store and
    /// checkpoint, on a thread that competes with the workers for a core.
    pub(crate) fn write_deferring_dir_sync(self, checkpoint_root: &Path) -> Result<StateHandle> {
        self.write_with(checkpoint_root, None, false)
    }

    pub(crate) fn write_with(
        self,
        checkpoint_root: &Path,
        fail: Option<FailPoint>,
        dir_sync: bool,
    ) -> Result<StateHandle> {
        let start = Instant::now();
        let header = format::FileHeader {
            full: self.shared.full,
            layout: self.layout,
            checkpoint: self.checkpoint_id,
            epoch: self.shared.epoch,
            base_epoch: self.shared.base_epoch,
        };
        let mut writer = format::FileWriter::create(checkpoint_root, &self.name, &header, fail)?;
        if !dir_sync {
            writer.defer_dir_sync();
        }
        // What to capture, in file order, in units of about CHUNK_PAGES pages.
        let by_slots = !self.shared.full && self.lists.iter().all(|c| c.slots.is_some());
        let (offsets, groups) = if by_slots {
            self.changed_slots()
        } else {
            (Vec::new(), Vec::new())
        };
        let units = self.units(by_slots, &groups);
        // Capture a wave of units in parallel, write it, reuse its buffers:
        // memory stays bounded by the wave, whatever the state's size.
        let mut pool: Vec<Chunk> = (0..WAVE_UNITS.min(units.len())).map(|_| Chunk::default()).collect();
        for wave in units.chunks(WAVE_UNITS) {
            let chunks = &mut pool[..wave.len()];
            chunks.par_iter_mut().zip(wave.par_iter()).for_each(|(chunk, unit)| {
                chunk.reset();
                match *unit {
                    Unit::Range(a, b) => self.capture_pages((a..b).map(|p| (p, None)), chunk),
                    Unit::Slots(gs) => self.capture_pages(gs.iter().map(|&(p, a, b)| (p, Some(&offsets[a..b]))), chunk),
                    Unit::Pages(ps) => self.capture_pages(ps.iter().map(|&p| (p as usize, None)), chunk),
                }
                chunk.finish();
            });
            for c in chunks.iter() {
                writer.append(c)?;
            }
        }
        self.shared.finished.store(true, Ordering::Release);
        drop(pool);
        let file = writer.finish()?;
        *self.shared.output.lock().unwrap_or_else(|e| e.into_inner()) = Some(file.clone());
        let mut files = self.base_files.clone();
        files.push(file.clone());
        Ok(StateHandle {
            checkpoint_id: self.checkpoint_id,
            max_parallelism: self.max_parallelism,
            key_groups: self.key_groups.clone(),
            layout: self.layout,
            files,
            state_bytes: self.n_pages as u64 * u64::from(self.layout.page_size),
            written_bytes: file.size,
            sync_micros: self.sync_micros,
            async_micros: start.elapsed().as_micros() as u64,
            full: self.shared.full,
            inline: None,
        })
    }

    /// The offsets of the changed slots, sorted once each, and their pages
    /// in order: `(page, start, end)` into the offsets.
    fn changed_slots(&self) -> (Vec<u64>, Vec<(usize, usize, usize)>) {
        let mut offsets: Vec<u64> = self
            .lists
            .iter()
            .flat_map(|c| c.slots.as_deref().unwrap_or_default())
            .copied()
            .collect();
        offsets.par_sort_unstable();
        offsets.dedup();
        let mut groups: Vec<(usize, usize, usize)> = Vec::new();
        let shift = self.shared.page_size.trailing_zeros();
        for (i, &off) in offsets.iter().enumerate() {
            let page = (off >> shift) as usize;
            match groups.last_mut() {
                Some(g) if g.0 == page => g.2 = i + 1,
                _ => groups.push((page, i, i + 1)),
            }
        }
        (offsets, groups)
    }

    /// The units of capture work, in file order: ranges of pages for a full
    /// snapshot, else the changed slots' `groups` (`by_slots`) or the dirty
    /// pages.
    fn units<'a>(&'a self, by_slots: bool, groups: &'a [(usize, usize, usize)]) -> Vec<Unit<'a>> {
        if self.shared.full {
            (0..self.n_pages)
                .step_by(CHUNK_PAGES)
                .map(|s| Unit::Range(s, (s + CHUNK_PAGES).min(self.n_pages)))
                .collect()
        } else if by_slots {
            groups.chunks(CHUNK_PAGES).map(Unit::Slots).collect()
        } else {
            self.lists
                .iter()
                .flat_map(|c| c.pages.chunks(CHUNK_PAGES))
                .map(Unit::Pages)
                .collect()
        }
    }

    /// Captures `(page, changed slot offsets if known)` pairs into `chunk`.
    fn capture_pages<'a>(&self, pages: impl Iterator<Item = (usize, Option<&'a [u64]>)>, chunk: &mut Chunk) {
        let ps = self.shared.page_size;
        let mut changed = Vec::new();
        for (page, slots) in pages {
            let claim = &self.shared.claims.as_slice()[page];
            let start = match claim.compare_exchange(PENDING, READING, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => {
                    let src = self.page_ptr(page);
                    // SAFETY: the page existed at the barrier, so it lies in
                    // a mapping kept alive by `self.segments`; our READING
                    // claim keeps the task from writing it until DONE.
                    let bytes = unsafe { std::slice::from_raw_parts(src, ps) };
                    let start = self.encode(page, bytes, slots, chunk, &mut changed);
                    claim.store(DONE, Ordering::Release);
                    start
                }
                Err(READING | DONE) => None, // listed twice; captured once
                Err(copy) => {
                    if claim
                        .compare_exchange(copy, DONE, Ordering::AcqRel, Ordering::Acquire)
                        .is_err()
                    {
                        continue;
                    }
                    self.shared.copies_taken.fetch_add(1, Ordering::Relaxed);
                    // SAFETY: `copy` is a page-size box published by the
                    // task; our successful exchange took it, exactly once.
                    let copy = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(copy as *mut u8, ps)) };
                    self.encode(page, &copy, slots, chunk, &mut changed)
                }
            };
            if let Some(start) = start {
                chunk.seal_record(start);
            }
        }
    }

    fn page_ptr(&self, page: usize) -> *const u8 {
        let off = page * self.shared.page_size;
        let seg = &self.segments[off / SEGMENT_BYTES];
        // SAFETY: the offset within the segment is below its mapped length.
        unsafe { seg.base().add(off % SEGMENT_BYTES) }
    }

    /// Appends the record of one page as of the barrier (its CRC still to
    /// be sealed): the whole page for a full snapshot, else the slots in
    /// `slots` (offsets) or, if unknown, those stamped after the base; a
    /// whole page when that is smaller. Returns the record's start, or
    /// `None` if nothing of the page changed since the base.
    fn encode(
        &self,
        page: usize,
        src: &[u8],
        slots: Option<&[u64]>,
        chunk: &mut Chunk,
        changed: &mut Vec<u32>,
    ) -> Option<usize> {
        let ps = src.len();
        let kg = u32::from_le_bytes(
            src[ps - PAGE_TRAILER..ps - PAGE_TRAILER + 4]
                .try_into()
                .expect("4 bytes"),
        );
        if self.shared.full {
            return Some(chunk.push_record(page as u32, kg, RecordKind::Full, &[src]));
        }
        let slot = self.layout.slot_size as usize;
        changed.clear();
        match slots {
            Some(offsets) => changed.extend(offsets.iter().map(|&o| ((o as usize & (ps - 1)) / slot) as u32)),
            None => {
                for i in 0..self.layout.slots_per_page() {
                    let stamp = u32::from_le_bytes(src[i * slot..i * slot + 4].try_into().expect("4 bytes"));
                    if stamp > self.shared.base_epoch {
                        changed.push(i as u32);
                    }
                }
            }
        }
        if changed.is_empty() {
            return None;
        }
        // Every slot changed means the page was (re)initialised in the
        // window, trailer included: only a full image carries the trailer.
        if changed.len() == self.layout.slots_per_page() || changed.len() * (4 + slot) >= ps {
            return Some(chunk.push_record(page as u32, kg, RecordKind::Full, &[src]));
        }
        let start = chunk.push_record(page as u32, kg, RecordKind::Delta(changed.len() as u32), &[]);
        for &i in changed.iter() {
            let at = i as usize * slot;
            let stamp = u32::from_le_bytes(src[at..at + 4].try_into().expect("4 bytes"));
            debug_assert!(
                stamp > self.shared.base_epoch && stamp <= self.shared.epoch,
                "slot {i} of page {page} stamped {stamp}, outside ({}, {}]",
                self.shared.base_epoch,
                self.shared.epoch
            );
            chunk.bytes.extend_from_slice(&i.to_le_bytes());
            chunk.bytes.extend_from_slice(&src[at..at + slot]);
        }
        Some(start)
    }
}
