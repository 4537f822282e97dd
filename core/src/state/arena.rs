//! The page arena under every store: memory-mapped segments cut into pages,
//! pages cut into fixed-size slots, and the bookkeeping that makes a
//! snapshot cheap at the barrier.
//!
//! It exists so that value, map and list state share one implementation of
//! the hard parts: file-backed memory, key-group ownership of pages,
//! change tracking, and copy-on-write against a snapshot job that reads the
//! same pages from another thread.
//!
//! # Addresses
//!
//! A slot is named by its byte offset in the arena (`u64`): page
//! `off >> page_shift`, segment `off >> SEGMENT_SHIFT`. Segments are mapped
//! once and never moved or unmapped while the store or any snapshot job
//! lives, so a pointer computed from an offset stays valid.
//!
//! # Change tracking (epochs)
//!
//! The arena counts epochs: epoch `e` is the time between the barriers of
//! the `e-1`-th and `e`-th snapshot. The first write to a slot in an epoch
//! stamps it with the epoch (its first four bytes) and logs its offset in
//! the epoch's slot log (bounded, see `LOG_FRACTION`); the first write to a
//! page in an epoch records the page in that epoch's dirty list. A snapshot
//! at the end of epoch `j` on a base completed at epoch `b` needs exactly
//! the slots logged in the epochs `(b, j]` (equivalently, those stamped in
//! `(b, j]` in the pages of those epochs' dirty lists). The barrier only
//! closes the lists and bumps the epoch: O(1).
//!
//! # Copy-on-write
//!
//! A job captures pages after the barrier while the task keeps writing. The
//! first write to page `p` in an epoch (and only that one: later writes in
//! the same epoch see `page_epoch[p] == epoch` and take the fast path) asks
//! every unfinished job whether it still needs `p` as it is now; a job needs
//! `p` if the page's last change `m` satisfies `b < m <= j` (or the job is
//! full and `p` existed at its barrier) and the job has not captured `p`
//! yet. Such a job gets a private copy of the page before the task writes.
//! The per-page claim protocol that makes this race-free is in
//! [`super::snapshot`].
//!
//! A small store's inline snapshot uses the same hook on the task's own
//! thread: a paced copy ([`Arena::begin_paced_copy`]) copies nothing at the
//! barrier, then copies pages in steps between the task's batches and, in
//! `first_write`, a page not copied yet before its first change. No other
//! thread reads the mapped pages, so no claim is needed.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use memmap2::MmapMut;

use super::format::{self, Chunk, RecordKind};
use super::handle::{SlotLayout, StateFile, StateHandle, StateKind};
use super::options::StoreOptions;
use super::pack;
use super::snapshot::{JobShared, SnapshotJob};
use crate::error::{Error, Result};

/// The largest arena: 32 GiB, so that slot offsets fit comfortably in
/// every index and page numbers in 32 bits.
pub(crate) const MAX_ARENA_BYTES: u64 = 32 << 30;

/// Bytes per mapped segment file: 16 MiB, a power of two so that the
/// segment of an offset is a shift. Small enough that a store of a few keys
/// maps little; large enough that 1 GiB is 64 mappings.
pub(crate) const SEGMENT_BYTES: usize = 16 << 20;
const SEGMENT_SHIFT: u32 = SEGMENT_BYTES.trailing_zeros();

/// Bytes at the end of every page: the key group, the page magic, the
/// table generation and the page's position in its key group's table (all
/// u32 LE; generation and position are 0 for pages not in a table). At the
/// end rather than the start so that slots start at the page's first byte:
/// a 32-byte slot then never straddles two cache lines.
pub(crate) const PAGE_TRAILER: usize = 16;
/// Marks an initialised page: b"WPG1" little-endian.
pub(crate) const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"WPG1");
/// Bytes at the start of every slot: the epoch of its last write (u32 LE)
/// and its meta word (u32 LE: 0 = free, otherwise occupied; `1 + len` of the
/// encoded value for codec values).
pub(crate) const SLOT_HEADER: usize = 8;

/// Closed dirty lists kept for incremental snapshots before the arena gives
/// up on its base and takes a full snapshot: bounds memory when checkpoints
/// keep failing (64 lists of at most one `u32` per page each).
const MAX_HISTORY: usize = 64;
/// Snapshots awaiting `snapshot_done`; older ones are forgotten (a
/// coordinator never has this many in flight).
const MAX_PENDING: usize = 64;
/// Finished jobs kept for freeing outside the barrier; a coordinator that
/// never reports outcomes must not make them pile up.
const MAX_RETIRED: usize = 16;
/// The change log of an epoch holds at most 1/LOG_FRACTION of all slots;
/// past that the epoch is marked unlogged and an incremental snapshot scans
/// its dirty pages' slot stamps instead. Bounds the log's memory (8 bytes
/// per logged slot) where most state changes every epoch, where logging
/// saves little.
const LOG_FRACTION: usize = 8;

/// The largest epoch a restored state file may carry: the arena goes on
/// counting above it, and must not wrap.
pub(crate) const MAX_FILE_EPOCH: u32 = u32::MAX - 3;

/// What changed in one closed epoch.
pub(crate) struct EpochChanges {
    pub(crate) epoch: u32,
    /// Pages first written in the epoch.
    pub(crate) pages: Vec<u32>,
    /// Offsets of the slots first written in the epoch; `None` if more than
    /// the log bound were.
    pub(crate) slots: Option<Vec<u64>>,
}

impl SlotLayout {
    /// The layout of slots with `key_bytes` of key and `value_bytes` of
    /// value aligned to `value_align`, in pages of `page_size`.
    pub(crate) fn compute(
        kind: StateKind,
        page_size: usize,
        key_bytes: usize,
        value_bytes: usize,
        value_align: usize,
    ) -> Result<SlotLayout> {
        if value_align > 16 {
            return Err(Error::config(
                "value alignment",
                value_align,
                "state values must be aligned to at most 16",
            ));
        }
        let align = value_align.max(8);
        let value_offset = (SLOT_HEADER + key_bytes).next_multiple_of(value_align.max(1));
        let slot_size = (value_offset + value_bytes).next_multiple_of(align);
        if PAGE_TRAILER + slot_size > page_size {
            return Err(Error::config(
                "page_size",
                page_size,
                "too small to hold one slot of this state",
            ));
        }
        Ok(SlotLayout {
            kind,
            page_size: page_size as u32,
            slot_size: slot_size as u32,
            key_bytes: key_bytes as u32,
            value_offset: value_offset as u32,
            value_bytes: value_bytes as u32,
        })
    }

    pub(crate) fn slots_per_page(&self) -> usize {
        (self.page_size as usize - PAGE_TRAILER) / self.slot_size as usize
    }
}

/// The base address of a mapped segment.
#[derive(Clone, Copy)]
pub(crate) struct SegPtr(pub(crate) *mut u8);

// SAFETY: a SegPtr is only an address; every access through it follows the
// ownership rules of the module docs (the task writes, jobs read pages they
// have claimed), and the mapping outlives every holder via `Arc<Segment>`.
unsafe impl Send for SegPtr {}
// SAFETY: as above; shared access is read-only or claim-protected.
unsafe impl Sync for SegPtr {}

/// One mapped file of the arena. Dropping it unmaps and deletes the file.
pub(crate) struct Segment {
    base: SegPtr,
    map: MmapMut,
    /// The mapped file, kept open for restore's positioned writes.
    file: File,
    path: PathBuf,
}

impl Segment {
    fn create(path: PathBuf) -> Result<Segment> {
        let io = |e: std::io::Error| Error::State {
            context: format!("mapping state segment {}", path.display()),
            message: e.to_string(),
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io)?;
        // Sparse: pages take disk and memory only once touched (in 2 MiB
        // units where huge pages apply, see below).
        file.set_len(SEGMENT_BYTES as u64).map_err(io)?;
        // SAFETY: the file was created here (create_new) under a name unique
        // to this store in the subtask's private working directory; nothing
        // else opens, truncates or writes it while it is mapped.
        let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(io)?;
        // Transparent huge pages where the kernel and filesystem offer
        // them for file mappings (Linux 6.x, ext4/xfs large folios): a
        // random update then misses in the TLB far less often, and a
        // restore writes and maps 2 MiB at a time: on 1 GiB of state both
        // batched updates and restores measured markedly faster
        // (docs/notebook/docs-2026-12.md, "Keyed state: the state backend
        // benchmark"). Only a hint: where it is not offered the mapping
        // keeps 4 KiB pages and works the same.
        let _ = map.advise(memmap2::Advice::HugePage);
        let base = SegPtr(map.as_mut_ptr());
        Ok(Segment { base, map, file, path })
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base.0
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        debug_assert_eq!(self.map.len(), SEGMENT_BYTES);
        // Scratch data: the durable copy is in the checkpoint.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Slot allocation within one key group.
#[derive(Default)]
struct GroupAlloc {
    /// Freed slots, reused before new ones.
    free: Vec<u64>,
    /// Next never-used slot in the group's newest page; `next < end` while
    /// that page has room.
    next: u64,
    end: u64,
}

/// The last completed snapshot, on which incremental ones build.
struct Base {
    epoch: u32,
    files: Vec<StateFile>,
}

/// A snapshot taken but not yet reported completed or aborted.
struct Pending {
    checkpoint: u64,
    epoch: u32,
    base_files: Vec<StateFile>,
    /// Where the job puts the file it wrote; `None` for an inline snapshot.
    output: Option<Arc<Mutex<Option<StateFile>>>>,
}

/// A unique name for a store instance: files of two stores never collide,
/// even across processes sharing a checkpoint directory.
fn unique_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:x}-{:x}-{n:x}", std::process::id(), nanos)
}

/// The memory-mapped pages of one store; see the module docs.
pub(crate) struct Arena {
    pub(crate) opts: StoreOptions,
    pub(crate) layout: SlotLayout,
    uid: String,
    page_shift: u32,
    slot_size: usize,
    slots_per_page: usize,
    segments: Vec<Arc<Segment>>,
    /// `segments[i].base()`, kept flat for the hot path.
    bases: Vec<SegPtr>,
    /// Per page: the epoch of its last write (0 = restored, unwritten since).
    page_epoch: Vec<u32>,
    /// Per owned key group (index `kg - key_groups.start`).
    groups: Vec<GroupAlloc>,
    /// Pages given back by [`Self::release_page`], reused before new ones.
    free_pages: Vec<u32>,
    /// The current epoch, >= 1.
    epoch: u32,
    /// Pages first written in the current epoch.
    dirty: Vec<u32>,
    /// Slots first written in the current epoch, unless `log_full`.
    log: Vec<u64>,
    /// More slots changed in the current epoch than the log holds.
    log_full: bool,
    /// Changes of closed epochs after the base's epoch, oldest first.
    history: VecDeque<Arc<EpochChanges>>,
    /// Jobs that may still capture pages.
    in_flight: Vec<Arc<JobShared>>,
    /// Finished jobs, dropped outside the barrier (freeing their claims
    /// costs time proportional to the state's page count).
    retired: Vec<Arc<JobShared>>,
    base: Option<Base>,
    pending: Vec<Pending>,
    /// Completions of snapshots older than this epoch are ignored (their
    /// dirty lists were dropped).
    horizon: u32,
    /// Snapshots taken, for unique file names.
    snapshots: u64,
    /// Page-copy buffers of inline snapshots, back from their encoding for
    /// reuse (a fresh buffer costs a page fault per 4 KiB at the barrier).
    inline_spare: Arc<Mutex<Vec<Vec<u8>>>>,
    /// The inline copy being taken in steps, if any (`begin_paced_copy`).
    paced: Option<PacedCopy>,
}

/// Page-copy buffers an arena keeps for its inline snapshots: one being
/// encoded while the next barrier copies into another.
const INLINE_SPARE_BUFFERS: usize = 2;

/// Alignment of the start of an inline snapshot's page copies: a page.
const COPY_ALIGN: usize = 4096;

/// Pages a paced inline copy takes per step ([`Arena::advance_paced_copy`]
/// from the task's turn, with input or without): 2 pages of 4 KiB, 8 KiB,
/// a microsecond or two of `memcpy`; the whole keyed job's store (64 pages
/// per subtask) in 32 steps.
///
/// A step is a stall of every record that arrives while it runs, so steps
/// are small: larger steps (8 pages, or every page left in a turn without
/// input) take tens of µs and put the records that arrive just after a
/// barrier into the tail of processing latency
/// (docs/design/state.md#working-files; the figures:
/// docs/notebook/benchmarks-2026-12.md, "The paced copy in steps of two
/// pages").
pub(crate) const PACED_COPY_PAGES: usize = 2;

/// Decodes a page's trailer (its last [`PAGE_TRAILER`] bytes, in the
/// mapping or in a copy): key group, table generation, table position.
#[inline]
fn decode_trailer(t: &[u8]) -> (usize, u32, u32) {
    let w = |i: usize| u32::from_ne_bytes(t[4 * i..4 * i + 4].try_into().expect("a trailer word is 4 bytes"));
    (w(0) as usize, w(2), w(3))
}

/// An inline copy being taken in steps; see [`Arena::begin_paced_copy`].
struct PacedCopy {
    copy: InlineCopy,
    /// Bit per page at the barrier: copied already.
    copied: Vec<u64>,
    /// Pages not copied yet.
    left: usize,
    /// Where the next step starts looking.
    next: usize,
    slot: Arc<CopySlot>,
}

impl PacedCopy {
    /// Pages at the barrier.
    fn pages(&self) -> usize {
        self.copy.n_pages
    }

    fn is_copied(&self, page: usize) -> bool {
        self.copied[page / 64] & (1 << (page % 64)) != 0
    }

    /// Copies `page` from `src`, its mapped address, which still holds the
    /// page as it was at the barrier.
    fn copy_page(&mut self, page: usize, src: *const u8) {
        debug_assert!(page < self.pages() && !self.is_copied(page));
        let ps = self.copy.page_size;
        let at = self.copy.offset + page * ps;
        // SAFETY: `page` was allocated at the barrier and pages are never
        // unmapped while the arena lives, so its `ps` bytes at `src` lie in
        // a live mapping; the task thread (the caller) is the store's only
        // writer and is not writing now (this runs at the barrier, before
        // its first write to the page after it, or between its batches);
        // snapshot jobs only read.
        let bytes = unsafe { std::slice::from_raw_parts(src, ps) };
        self.copy.pages[at..at + ps].copy_from_slice(bytes);
        self.copied[page / 64] |= 1 << (page % 64);
        self.left -= 1;
    }
}

/// Where a paced inline copy goes once complete, for the snapshot job that
/// waits for it on the pool. The task's side never makes a system call:
/// the waiter polls (sleeping between looks) rather than sleep on a
/// condition variable, whose notification would be a `futex` wake-up on
/// the task's thread (several µs on a virtual machine) at every
/// checkpoint.
pub(crate) struct CopySlot {
    tx: Mutex<Option<std::sync::mpsc::Sender<InlineCopy>>>,
    rx: Mutex<std::sync::mpsc::Receiver<InlineCopy>>,
}

impl Default for CopySlot {
    fn default() -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        CopySlot {
            tx: Mutex::new(Some(tx)),
            rx: Mutex::new(rx),
        }
    }
}

/// The paced copy's waiter looks again after this long at first, then
/// after twice as long each time, up to [`COPY_POLL_MAX`].
const COPY_POLL_FIRST: std::time::Duration = std::time::Duration::from_micros(20);
const COPY_POLL_MAX: std::time::Duration = std::time::Duration::from_millis(1);

impl CopySlot {
    /// The task's side: the copy is complete. A send on a channel whose
    /// receiver never blocks: a lock-free push, no wake-up.
    fn fill(&self, copy: InlineCopy) {
        if let Some(tx) = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // The waiter may be gone (its checkpoint failed): then the
            // copy is dropped with the channel.
            let _ = tx.send(copy);
        }
    }

    /// Waits until the copy is complete, at most `limit`, looking every
    /// 20 µs at first and at least every millisecond.
    pub(crate) fn wait(&self, limit: std::time::Duration) -> Option<InlineCopy> {
        let deadline = Instant::now() + limit;
        let rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let mut pause = COPY_POLL_FIRST;
        loop {
            match rx.try_recv() {
                Ok(c) => return Some(c),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(COPY_POLL_MAX);
        }
    }
}

/// An inline snapshot's pages, copied at the barrier on the task thread
/// ([`Arena::snapshot_inline_copy`]); [`InlineCopy::encode`] packs them
/// into the snapshot image anywhere else, so the barrier costs the task one
/// `memcpy` of its pages instead of packing and checksumming them.
pub(crate) struct InlineCopy {
    /// The pages, back to back from `offset` (a 4 KiB boundary).
    pages: Vec<u8>,
    offset: usize,
    /// Pages at the barrier. Each page's key group is read from its
    /// trailer in the copy, by [`InlineCopy::encode`] on the pool: reading
    /// the trailers from the mapping at the barrier touches every page on
    /// the task, tens of µs at the tail, a stall of every record behind the
    /// barrier (docs/notebook/benchmarks-2026-12.md, "The paced copy in
    /// steps of two pages").
    n_pages: usize,
    page_size: usize,
    header: format::FileHeader,
    max_parallelism: usize,
    key_group_range: std::ops::Range<usize>,
    layout: SlotLayout,
    checkpoint_id: u64,
    sync_micros: u64,
    spare: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl InlineCopy {
    /// Packs the copied pages into one snapshot-file image carried by the
    /// handle (pages packed when that is smaller), as
    /// [`Arena::snapshot_inline`] describes.
    pub(crate) fn encode(self) -> StateHandle {
        let start = Instant::now();
        let ps = self.page_size;
        let n_pages = self.n_pages;
        let mut chunk = Chunk::default();
        chunk.bytes.reserve(n_pages * (ps / 2 + format::RECORD_HEADER_LEN));
        let copies = &self.pages[self.offset..self.offset + n_pages * ps];
        for (page, src) in copies.chunks_exact(ps).enumerate() {
            let (kg, _, _) = decode_trailer(&src[ps - PAGE_TRAILER..]);
            let kg = kg as u32;
            // Packed when smaller (free slots and small numbers are zeros).
            let at = chunk.push_record(page as u32, kg, RecordKind::Packed(0), &[]);
            pack::pack(src, &mut chunk.bytes);
            let packed = chunk.bytes.len() - at - format::RECORD_HEADER_LEN;
            if packed < ps {
                chunk.set_record_count(at, packed as u32);
            } else {
                chunk.bytes.truncate(at);
                chunk.push_record(page as u32, kg, RecordKind::Full, &[src]);
            }
            chunk.seal_record(at);
        }
        chunk.finish();
        let image = format::image(&self.header, &chunk);
        // Kept at its length: a paced copy overwrites every page of a
        // buffer this long without zeroing it first (see `begin_paced_copy`).
        let pages = self.pages;
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() < INLINE_SPARE_BUFFERS {
            spare.push(pages);
        }
        StateHandle {
            checkpoint_id: self.checkpoint_id,
            max_parallelism: self.max_parallelism,
            key_groups: self.key_group_range,
            layout: self.layout,
            files: Vec::new(),
            state_bytes: (n_pages * ps) as u64,
            written_bytes: image.len() as u64,
            sync_micros: self.sync_micros,
            async_micros: start.elapsed().as_micros() as u64,
            full: true,
            inline: Some(image),
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // The pages are still mapped: a paced copy in progress completes,
        // so the snapshot job waiting for it is not left waiting.
        self.complete_paced_copy();
    }
}

impl Arena {
    /// An empty arena; no file is created until the first slot.
    pub(crate) fn create(opts: StoreOptions, layout: SlotLayout) -> Result<Arena> {
        opts.validate()?;
        debug_assert_eq!(layout.page_size as usize, opts.page_size);
        std::fs::create_dir_all(&opts.working_dir).map_err(|e| Error::State {
            context: format!("creating state working directory {}", opts.working_dir.display()),
            message: e.to_string(),
        })?;
        let groups = opts.key_groups.clone().map(|_| GroupAlloc::default()).collect();
        Ok(Arena {
            page_shift: opts.page_size.trailing_zeros(),
            slot_size: layout.slot_size as usize,
            slots_per_page: layout.slots_per_page(),
            opts,
            layout,
            uid: unique_id(),
            segments: Vec::new(),
            bases: Vec::new(),
            page_epoch: Vec::new(),
            groups,
            free_pages: Vec::new(),
            epoch: 1,
            dirty: Vec::new(),
            log: Vec::new(),
            log_full: false,
            history: VecDeque::new(),
            in_flight: Vec::new(),
            retired: Vec::new(),
            base: None,
            pending: Vec::new(),
            horizon: 0,
            snapshots: 0,
            inline_spare: Arc::default(),
            paced: None,
        })
    }

    /// Number of allocated pages.
    pub(crate) fn pages(&self) -> usize {
        self.page_epoch.len()
    }

    /// Offset of slot `index` of `page`.
    #[inline]
    pub(crate) fn slot_offset(&self, page: usize, index: usize) -> u64 {
        ((page as u64) << self.page_shift) + (index * self.slot_size) as u64
    }

    /// The address of the byte at arena offset `off`.
    #[inline(always)]
    pub(crate) fn ptr(&self, off: u64) -> *mut u8 {
        let seg = self.bases[(off >> SEGMENT_SHIFT) as usize].0;
        // SAFETY: the offset within the segment is below SEGMENT_BYTES, the
        // length of the mapping `seg` points to.
        unsafe { seg.add(off as usize & (SEGMENT_BYTES - 1)) }
    }

    /// The bytes of the slot at `off`, for reading.
    #[inline]
    pub(crate) fn slot(&self, off: u64) -> &[u8] {
        debug_assert!(((off >> self.page_shift) as usize) < self.pages());
        // SAFETY: `off` names a slot of an allocated page, which lies in a
        // live mapping; only the task (holding `&mut self`) writes mapped
        // bytes, and jobs only read, so no write aliases this shared borrow.
        unsafe { std::slice::from_raw_parts(self.ptr(off), self.slot_size) }
    }

    /// The page holding the slot at `off`.
    #[inline(always)]
    pub(crate) fn page_of(&self, off: u64) -> usize {
        (off >> self.page_shift) as usize
    }

    /// The index within its page of the slot at `off`.
    #[inline]
    pub(crate) fn slot_index(&self, off: u64) -> usize {
        (off as usize & (self.opts.page_size - 1)) / self.slot_size
    }

    /// The key area of the slot at `off`, for comparing keys.
    #[inline(always)]
    pub(crate) fn key_area(&self, off: u64) -> &[u8] {
        // SAFETY: as in `slot`; the key area lies inside the slot.
        unsafe { std::slice::from_raw_parts(self.ptr(off).add(SLOT_HEADER), self.layout.key_bytes as usize) }
    }

    /// Prepares the slot at `off` for writing and returns its address: the
    /// one entry point for every mutation of mapped bytes. The first write
    /// to a page in an epoch records it as dirty and resolves copy-on-write
    /// with in-flight jobs; the first write to a slot in an epoch stamps it
    /// with the epoch and logs it.
    #[inline(always)]
    pub(crate) fn write_slot(&mut self, off: u64) -> *mut u8 {
        let p = self.ptr(off);
        self.touch(self.page_of(off), off, p);
        p
    }

    /// [`Self::write_slot`] for a caller that has the slot's page, offset
    /// and address at hand (the value store's hot path).
    ///
    /// A slot stamped with the current epoch lies in a page already
    /// written in this epoch (a stamp is only ever set to the current
    /// epoch below, after the page's check; restored stamps are older than
    /// any epoch the store continues with), so the common case, a slot
    /// written again in the same epoch, reads the stamp alone.
    #[inline(always)]
    pub(crate) fn touch(&mut self, page: usize, off: u64, p: *mut u8) {
        debug_assert_eq!(self.ptr(off), p);
        if !self.stamped(p) {
            self.first_touch(page, off, p);
        }
        debug_assert_eq!(self.page_epoch[page], self.epoch, "a stamped slot in an unwritten page");
    }

    /// Whether the slot at address `p` was written in this epoch: then it
    /// is ready for writing ([`Self::touch`]).
    #[inline(always)]
    pub(crate) fn stamped(&self, p: *mut u8) -> bool {
        // SAFETY: the callers pass the address of a slot of an allocated
        // page, 8-aligned (pages are page-aligned, slot sizes multiples of
        // 8) and in a live mapping. Reading the stamp races with no write
        // (only this task writes, and snapshot jobs only read).
        unsafe { p.cast::<u32>().read() == self.epoch }
    }

    /// The first write to a slot in this epoch (the slot at `off`, address
    /// `p`, in `page`): the page's first write too, perhaps, then the
    /// slot's stamp and log entry.
    #[cold]
    #[inline(never)]
    pub(crate) fn first_touch(&mut self, page: usize, off: u64, p: *mut u8) {
        debug_assert_eq!(self.ptr(off), p);
        if self.page_epoch[page] != self.epoch {
            self.first_write(page);
        }
        // `first_write` resolved every job's claim on the page in this
        // epoch: no job reads it any more, the slot may be written.
        self.first_slot_write(off, p);
    }

    /// The address of `page`'s first byte (its slot 0).
    #[inline(always)]
    pub(crate) fn page_ptr(&self, page: usize) -> *mut u8 {
        self.ptr((page as u64) << self.page_shift)
    }

    #[cold]
    #[inline(never)]
    fn first_write(&mut self, page: usize) {
        if self.paced.is_some() {
            self.paced_copy_before_write(page);
        }
        let last = self.page_epoch[page];
        if !self.in_flight.is_empty() {
            self.retire_finished();
            let src = self.ptr((page as u64) << self.page_shift);
            for job in &self.in_flight {
                job.protect(page, last, src);
            }
        }
        self.page_epoch[page] = self.epoch;
        self.dirty.push(page as u32);
    }

    #[cold]
    #[inline(never)]
    fn first_slot_write(&mut self, off: u64, p: *mut u8) {
        // SAFETY: as in `write_slot`, which checked the stamp at `p`.
        unsafe { p.cast::<u32>().write(self.epoch) };
        if !self.log_full {
            if self.log.len() < self.pages() * self.slots_per_page / LOG_FRACTION + 64 {
                self.log.push(off);
            } else {
                self.log_full = true;
                self.log = Vec::new();
            }
        }
    }

    /// Moves jobs that need no page any more from `in_flight` to `retired`
    /// (freed in `snapshot_done`, or here once more than `MAX_RETIRED` wait).
    fn retire_finished(&mut self) {
        if self.retired.len() > MAX_RETIRED {
            self.retired.clear();
        }
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].is_finished() {
                self.retired.push(self.in_flight.swap_remove(i));
            } else {
                i += 1;
            }
        }
    }

    /// A free slot in key group `kg`, zeroed but for a stale epoch stamp.
    ///
    /// # Panics
    ///
    /// If a new segment file cannot be created or mapped (disk full, working
    /// directory gone): the hot path has no error channel, and a store that
    /// cannot grow cannot go on.
    pub(crate) fn alloc_slot(&mut self, kg: usize) -> u64 {
        let slot = self.slot_size as u64;
        let gi = kg - self.opts.key_groups.start;
        if let Some(off) = self.groups[gi].free.pop() {
            return off;
        }
        let g = &mut self.groups[gi];
        if g.next + slot <= g.end {
            g.next += slot;
            return g.next - slot;
        }
        let page = self.new_page(kg, 0, 0);
        let first = self.slot_offset(page, 0);
        let g = &mut self.groups[gi];
        g.next = first + slot;
        g.end = first + (self.slots_per_page * self.slot_size) as u64;
        first
    }

    /// Writes the occupied slot at `off` (after [`Self::write_slot`]): the
    /// meta word, the key area (filled by `key`) and `value` at the start
    /// of the value area, the rest of which is zeroed.
    pub(crate) fn write_entry(&mut self, off: u64, meta: u32, key: impl FnOnce(&mut [u8]), value: &[u8]) {
        let (slot_size, layout) = (self.slot_size, self.layout);
        let p = self.write_slot(off);
        // SAFETY: `write_slot` returned the start of a slot of `slot_size`
        // bytes in a live mapping that no job reads now; `&mut self` makes
        // this the only reference to it.
        let slot = unsafe { std::slice::from_raw_parts_mut(p, slot_size) };
        slot[4..8].copy_from_slice(&meta.to_le_bytes());
        key(&mut slot[SLOT_HEADER..SLOT_HEADER + layout.key_bytes as usize]);
        let area = &mut slot[layout.value_offset as usize..][..layout.value_bytes as usize];
        area[..value.len()].copy_from_slice(value);
        area[value.len()..].fill(0);
    }

    /// Clears the slot at `off` (all but the epoch stamp, which tells the
    /// next snapshot it changed).
    pub(crate) fn clear_slot(&mut self, off: u64) {
        let slot_size = self.slot_size;
        let p = self.write_slot(off);
        // SAFETY: as in `write_entry`.
        unsafe { std::ptr::write_bytes(p.add(4), 0, slot_size - 4) };
    }

    /// Copies the slot at `from` (all but its stamp) over the slot at `to`.
    pub(crate) fn copy_slot(&mut self, from: u64, to: u64) {
        debug_assert_ne!(from, to);
        let slot_size = self.slot_size;
        let dst = self.write_slot(to);
        let src = self.ptr(from);
        // SAFETY: both are slots of allocated pages, distinct, so the ranges
        // do not overlap; `to` is prepared for writing, `from` only read.
        unsafe { std::ptr::copy_nonoverlapping(src.add(4), dst.add(4), slot_size - 4) };
    }

    /// The encoded value of an occupied codec slot (meta word = 1 + length).
    pub(crate) fn entry_value(&self, off: u64) -> &[u8] {
        let slot = self.slot(off);
        let len = u32::from_le_bytes(slot[4..8].try_into().expect("4 bytes")) as usize - 1;
        &slot[self.layout.value_offset as usize..][..len]
    }

    /// Returns the slot at `off`, which the caller has cleared through
    /// [`Self::write_slot`], to the free list of its key group `kg` (the
    /// caller's, from the key's hash: reading the page trailer instead
    /// would cost a cache miss per removal).
    pub(crate) fn free_slot(&mut self, off: u64, kg: usize) {
        debug_assert_eq!(kg, self.page_key_group((off >> self.page_shift) as usize));
        self.groups[kg - self.opts.key_groups.start].free.push(off);
    }

    /// The key group of `key` under this arena's maximum parallelism.
    pub(crate) fn key_group_of<K: std::hash::Hash + ?Sized>(&self, key: &K) -> usize {
        crate::state::key_groups::key_group(crate::state::key_groups::stable_hash(key), self.opts.max_parallelism)
    }

    /// The key group a page belongs to (from its trailer).
    pub(crate) fn page_key_group(&self, page: usize) -> usize {
        let p = self.ptr(((page as u64 + 1) << self.page_shift) - PAGE_TRAILER as u64);
        // SAFETY: the page is allocated, so its 16-byte trailer lies in a
        // live mapping; the trailer is written once, when the page is made.
        (unsafe { p.cast::<u32>().read() }) as usize
    }

    /// A page for key group `kg` at position `pos` of table generation
    /// `gen` (both 0 outside tables): a released page if any, else a new
    /// one. The page is initialised through the copy-on-write path: every
    /// slot cleared and stamped with the current epoch (so the next
    /// snapshot carries the page whole, trailer included), then the
    /// trailer written.
    ///
    /// # Panics
    ///
    /// If a new segment file cannot be created or mapped (disk full,
    /// working directory gone): callers on the hot path have no error
    /// channel, and a store that cannot grow cannot go on.
    pub(crate) fn new_page(&mut self, kg: usize, gen: u32, pos: u32) -> usize {
        debug_assert!(self.opts.key_groups.contains(&kg));
        let page = match self.free_pages.pop() {
            Some(page) => page as usize,
            None => self
                .append_page(self.epoch)
                .unwrap_or_else(|e| panic!("state store cannot grow: {e}")),
        };
        if self.page_epoch[page] != self.epoch {
            self.first_write(page);
        }
        for i in 0..self.slots_per_page {
            let off = self.slot_offset(page, i);
            let p = self.write_slot(off);
            // SAFETY: a slot of an allocated page prepared for writing.
            unsafe { std::ptr::write_bytes(p.add(4), 0, self.slot_size - 4) };
        }
        let base = (page as u64) << self.page_shift;
        let t = self.ptr(base + (self.opts.page_size - PAGE_TRAILER) as u64);
        // SAFETY: the trailer's 16 bytes lie in the page, which
        // `first_write` made safe to write in this epoch.
        unsafe {
            for (i, w) in [kg as u32, PAGE_MAGIC, gen, pos].into_iter().enumerate() {
                t.add(4 * i).cast::<u32>().write(w);
            }
        }
        page
    }

    /// Appends an untouched page (mapping a new segment when needed) that
    /// starts at `epoch`: the current one for new pages (which joins the
    /// dirty list), 0 for restored ones, whose content comes from a file.
    pub(crate) fn append_page(&mut self, epoch: u32) -> Result<usize> {
        let page = self.page_epoch.len();
        assert!(page < u32::MAX as usize, "state store exceeds 2^32 pages");
        let off = (page as u64) << self.page_shift;
        assert!(
            off + (self.opts.page_size as u64) < MAX_ARENA_BYTES,
            "state store exceeds 32 GiB"
        );
        if (off >> SEGMENT_SHIFT) as usize == self.segments.len() {
            let path = self
                .opts
                .working_dir
                .join(format!("{}-{:05}.seg", self.uid, self.segments.len()));
            let seg = Segment::create(path)?;
            self.bases.push(seg.base);
            self.segments.push(Arc::new(seg));
        }
        self.page_epoch.push(epoch);
        if epoch == self.epoch {
            self.dirty.push(page as u32);
        }
        Ok(page)
    }

    /// Gives a page back for reuse by [`Self::new_page`]. Its bytes stay
    /// as they are until then (a snapshot may still capture them; restore
    /// ignores them by their old table generation).
    pub(crate) fn release_page(&mut self, page: usize) {
        self.free_pages.push(page as u32);
    }

    /// A page's trailer: key group, table generation, table position.
    pub(crate) fn page_trailer(&self, page: usize) -> (usize, u32, u32) {
        let t = self.ptr(((page as u64 + 1) << self.page_shift) - PAGE_TRAILER as u64);
        // SAFETY: the trailer of an allocated page lies in a live mapping,
        // `PAGE_TRAILER` bytes from `t` to the page's end; only the task
        // thread writes the mapping, and it is the caller.
        decode_trailer(unsafe { std::slice::from_raw_parts(t, PAGE_TRAILER) })
    }

    /// Raw page addresses for a restore that fills pages in parallel.
    pub(crate) fn page_writer(&self) -> PageWriter<'_> {
        PageWriter {
            segments: &self.segments,
            page_shift: self.page_shift,
        }
    }

    /// Continues the epoch count of restored files: slots keep the stamps
    /// they were written with, all at most `max_file_epoch`, so epochs of
    /// this arena start above it and restored slots never look changed.
    pub(crate) fn continue_epochs(&mut self, max_file_epoch: u32) {
        debug_assert!(self.in_flight.is_empty() && self.history.is_empty());
        // Restore refuses files past it (`MAX_FILE_EPOCH`).
        assert!(max_file_epoch <= MAX_FILE_EPOCH, "state store epoch overflow");
        self.epoch = self.epoch.max(max_file_epoch + 1);
    }

    /// Walks every slot of a restored arena: free slots go to their key
    /// group's free list, occupied ones to `f(offset, key_group, slot)`.
    pub(crate) fn rebuild(&mut self, mut f: impl FnMut(u64, usize, &[u8]) -> Result<()>) -> Result<()> {
        debug_assert!(self.in_flight.is_empty());
        for page in 0..self.pages() {
            let kg = self.page_key_group(page);
            let gi = kg - self.opts.key_groups.start;
            for i in (0..self.slots_per_page).rev() {
                let off = self.slot_offset(page, i);
                let slot = self.slot(off);
                if slot[4..8] == [0; 4] {
                    self.groups[gi].free.push(off);
                } else {
                    f(off, kg, slot)?;
                }
            }
        }
        Ok(())
    }

    /// The synchronous part of a snapshot; see the module docs. Takes time
    /// independent of the state size: it closes the epoch's change lists
    /// (moves, no copies) and allocates (without touching) the job's claims.
    pub(crate) fn snapshot(&mut self, checkpoint_id: u64) -> SnapshotJob {
        // A paced copy still going completes first (its barrier came first).
        self.complete_paced_copy();
        let start = Instant::now();
        self.retire_finished();
        let epoch = self.close_epoch();
        let chain_ok = |b: &&Base| b.files.len() <= self.opts.max_delta_chain;
        let (full, base_epoch, base_files, lists) = match self.base.as_ref().filter(chain_ok) {
            None => (true, 0, Vec::new(), Vec::new()),
            Some(b) => {
                let lists = self.history.iter().filter(|c| c.epoch > b.epoch).cloned().collect();
                (false, b.epoch, b.files.clone(), lists)
            }
        };
        let n_pages = self.pages();
        let shared = Arc::new(JobShared::new(epoch, base_epoch, full, n_pages, self.opts.page_size));
        self.in_flight.push(shared.clone());
        self.add_pending(Pending {
            checkpoint: checkpoint_id,
            epoch,
            base_files: base_files.clone(),
            output: Some(shared.output.clone()),
        });
        let name = format!(
            "shared/{}-c{checkpoint_id}-s{}.{}.pages",
            self.uid,
            self.snapshots,
            if full { "full" } else { "delta" }
        );
        SnapshotJob {
            shared,
            segments: self.segments.clone(),
            lists,
            name,
            checkpoint_id,
            layout: self.layout,
            max_parallelism: self.opts.max_parallelism,
            key_groups: self.opts.key_groups.clone(),
            base_files,
            n_pages,
            sync_micros: start.elapsed().as_micros() as u64,
        }
    }

    /// Closes the current epoch for a snapshot taken now: its change lists
    /// join the history (incremental snapshots read them), and the next
    /// writes carry the next epoch's stamp. Returns the closed epoch.
    fn close_epoch(&mut self) -> u32 {
        let epoch = self.epoch;
        assert!(epoch < u32::MAX - 1, "state store epoch overflow");
        let (dirty_len, log_len) = (self.dirty.len(), self.log.len());
        let pages = std::mem::replace(&mut self.dirty, Vec::with_capacity(dirty_len));
        let slots = if self.log_full {
            None
        } else {
            Some(std::mem::replace(&mut self.log, Vec::with_capacity(log_len)))
        };
        self.log_full = false;
        self.history.push_back(Arc::new(EpochChanges { epoch, pages, slots }));
        if self.history.len() > MAX_HISTORY {
            // Nothing completed for too long: stop building on the old base.
            self.base = None;
            self.history.clear();
            self.horizon = epoch;
        }
        self.epoch += 1;
        self.snapshots += 1;
        epoch
    }

    fn add_pending(&mut self, p: Pending) {
        if self.pending.len() == MAX_PENDING {
            self.pending.remove(0);
        }
        self.pending.push(p);
    }

    /// Bytes of a full snapshot of this arena as plain page images: the
    /// most [`Arena::snapshot_inline`]'s image can take (pages are packed
    /// when that is smaller).
    pub(crate) fn image_bytes(&self) -> usize {
        format::image_bytes(self.pages(), self.opts.page_size)
    }

    /// A full snapshot taken whole, now, on the calling (task) thread: every
    /// page copied (packed, when that is smaller) into one snapshot-file
    /// image carried by the handle (no file, no job). For small stores,
    /// where a copy of everything costs less than handing a job to another
    /// thread and syncing a file; the task thread is the only writer, so the
    /// pages are read as they are at the barrier without any claim.
    ///
    /// An inline snapshot is never the base of an incremental one: once it
    /// completes, the next file snapshot is full.
    pub(crate) fn snapshot_inline(&mut self, checkpoint_id: u64) -> StateHandle {
        self.snapshot_inline_copy(checkpoint_id).encode()
    }

    /// The barrier's part of [`Arena::snapshot_inline`]: closes the epoch
    /// and copies every page; the packing is left to
    /// [`InlineCopy::encode`], which may run on another thread.
    pub(crate) fn snapshot_inline_copy(&mut self, checkpoint_id: u64) -> InlineCopy {
        let start = Instant::now();
        let mut p = self.inline_copy_frame(checkpoint_id);
        for page in 0..p.pages() {
            p.copy_page(page, self.page_ptr(page));
        }
        p.copy.sync_micros = start.elapsed().as_micros() as u64;
        p.copy
    }

    /// The barrier's part of an inline snapshot taken in steps: closes the
    /// epoch like [`Arena::snapshot_inline_copy`] but copies no page yet.
    /// The task copies them afterwards, on its own thread, in steps of
    /// [`PACED_COPY_PAGES`] ([`Arena::advance_paced_copy`], between its
    /// batches) and, before its first write to a page not copied yet, that
    /// page ([`Arena::first_write`]): every page is copied as it was at the
    /// barrier, and no record waits for more than one step. The copy
    /// reaches the returned slot once every page is in it; a copy still
    /// going at the next barrier, or when the arena drops, is completed
    /// there at once.
    ///
    /// Why: copying a keyed job's pages whole at the barrier (64 pages of
    /// 4 KiB per subtask) holds every record behind it for tens of µs at
    /// each checkpoint, which at a 10 ms interval and 200,000 records/s is
    /// about 1% of all records: the p99 (docs/design/state.md#working-files).
    pub(crate) fn begin_paced_copy(&mut self, checkpoint_id: u64) -> Arc<CopySlot> {
        let start = Instant::now();
        let mut p = self.inline_copy_frame(checkpoint_id);
        p.copy.sync_micros = start.elapsed().as_micros() as u64;
        let slot = Arc::clone(&p.slot);
        // Handed over at once if there is no page.
        self.put_back(p);
        slot
    }

    /// What both kinds of inline copy do at the barrier: completes a paced
    /// copy still going (its barrier came first), closes the epoch, and
    /// prepares the copy's buffer, with no page copied yet.
    fn inline_copy_frame(&mut self, checkpoint_id: u64) -> PacedCopy {
        self.complete_paced_copy();
        self.retire_finished();
        let epoch = self.close_epoch();
        self.add_pending(Pending {
            checkpoint: checkpoint_id,
            epoch,
            base_files: Vec::new(),
            output: None,
        });
        let ps = self.opts.page_size;
        let n_pages = self.pages();
        let mut pages = self
            .inline_spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        // The copies start at a 4 KiB boundary, as the mapped pages do:
        // `memcpy` (`rep movsb`) between buffers of different alignment
        // runs several times slower than aligned on an AMD EPYC guest
        // (docs/design/state.md#working-files), and this copy is a
        // stall of every record at the barrier. A spare buffer keeps its
        // length and its allocation (so the same offset), and every page
        // of it is overwritten: only growth is zeroed.
        pages.reserve((n_pages * ps + COPY_ALIGN).saturating_sub(pages.len()));
        let offset = pages.as_ptr().align_offset(COPY_ALIGN);
        pages.resize(offset + n_pages * ps, 0);
        PacedCopy {
            copy: InlineCopy {
                pages,
                offset,
                n_pages,
                page_size: ps,
                header: format::FileHeader {
                    full: true,
                    layout: self.layout,
                    checkpoint: checkpoint_id,
                    epoch,
                    base_epoch: 0,
                },
                max_parallelism: self.opts.max_parallelism,
                key_group_range: self.opts.key_groups.clone(),
                layout: self.layout,
                checkpoint_id,
                sync_micros: 0,
                spare: Arc::clone(&self.inline_spare),
            },
            copied: vec![0; n_pages.div_ceil(64)],
            left: n_pages,
            next: 0,
            slot: Arc::new(CopySlot::default()),
        }
    }

    /// Copies up to `pages` more pages of the paced copy, if one is going;
    /// hands it over once complete. Returns the pages copied.
    pub(crate) fn advance_paced_copy(&mut self, pages: usize) -> usize {
        let Some(mut p) = self.paced.take() else { return 0 };
        let mut copied = 0;
        while copied < pages && p.left > 0 {
            let page = p.next;
            p.next += 1;
            if !p.is_copied(page) {
                p.copy_page(page, self.page_ptr(page));
                copied += 1;
            }
        }
        self.put_back(p);
        copied
    }

    /// Whether a paced copy is going ([`Arena::begin_paced_copy`]).
    pub(crate) fn paced_copy_going(&self) -> bool {
        self.paced.is_some()
    }

    /// Copies every page the paced copy still lacks, and hands it over.
    pub(crate) fn complete_paced_copy(&mut self) {
        let _ = self.advance_paced_copy(usize::MAX);
    }

    /// `first_write` of `page` while a paced copy goes on: the page as it
    /// was at the barrier joins the copy before the write.
    fn paced_copy_before_write(&mut self, page: usize) {
        let Some(mut p) = self.paced.take() else { return };
        if page < p.pages() && !p.is_copied(page) {
            p.copy_page(page, self.page_ptr(page));
        }
        self.put_back(p);
    }

    /// Keeps a paced copy going, or hands it over if complete.
    fn put_back(&mut self, p: PacedCopy) {
        if p.left == 0 {
            p.slot.fill(p.copy);
        } else {
            self.paced = Some(p);
        }
    }

    /// Records the outcome of checkpoint `checkpoint_id`: a completed one
    /// whose file was written becomes the base of the next incremental
    /// snapshot (a completed inline one leaves no base: the next is full);
    /// anything else is forgotten. Also frees retired jobs.
    pub(crate) fn snapshot_done(&mut self, checkpoint_id: u64, completed: bool) {
        self.retired.clear();
        let Some(i) = self.pending.iter().position(|p| p.checkpoint == checkpoint_id) else {
            return;
        };
        let p = self.pending.remove(i);
        if !completed || p.epoch < self.horizon || self.base.as_ref().is_some_and(|b| b.epoch >= p.epoch) {
            return;
        }
        let Some(output) = p.output else {
            // Inline: restores need nothing older, and nothing builds on it.
            self.base = None;
            self.history.retain(|c| c.epoch > p.epoch);
            self.pending.retain(|q| q.epoch > p.epoch);
            return;
        };
        let Some(file) = output.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            // Completed without a written file: the coordinator and the job
            // disagree; building on it would lose data, so keep the old base.
            debug_assert!(
                false,
                "checkpoint {checkpoint_id} completed but its state was never written"
            );
            return;
        };
        let mut files = p.base_files;
        files.push(file);
        self.base = Some(Base { epoch: p.epoch, files });
        self.history.retain(|c| c.epoch > p.epoch);
        self.pending.retain(|q| q.epoch > p.epoch);
    }

    /// Number of mapped segment files.
    #[cfg(test)]
    pub(crate) fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

/// Writes whole pages of an arena from several threads during restore.
pub(crate) struct PageWriter<'a> {
    segments: &'a [Arc<Segment>],
    page_shift: u32,
}

impl PageWriter<'_> {
    /// The address of `page`'s first byte.
    ///
    /// # Safety
    ///
    /// `page` must be allocated, and no two threads may write the same page
    /// (restore gives each page record of a file its own target page).
    pub(crate) unsafe fn page_ptr(&self, page: usize) -> *mut u8 {
        let off = (page as u64) << self.page_shift;
        // SAFETY: per the contract, the page lies in a live mapping.
        unsafe {
            self.segments[(off >> SEGMENT_SHIFT) as usize]
                .base()
                .add(off as usize & (SEGMENT_BYTES - 1))
        }
    }

    /// Writes `bytes`, whole pages, at `first_page` through the segment
    /// file rather than the mapping: the kernel copies into the page cache
    /// the mapping shares, without a page fault per page. The pages must
    /// lie in one segment, and no other thread may write them.
    pub(crate) fn write_pages(&self, first_page: usize, bytes: &[u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let off = (first_page as u64) << self.page_shift;
        let seg = &self.segments[(off >> SEGMENT_SHIFT) as usize];
        let at = off & (SEGMENT_BYTES as u64 - 1);
        debug_assert!(at as usize + bytes.len() <= SEGMENT_BYTES);
        seg.file.write_all_at(bytes, at).map_err(|e| Error::State {
            context: format!("restoring pages into {}", seg.path.display()),
            message: e.to_string(),
        })
    }

    /// Whether two pages lie in the same segment.
    pub(crate) fn same_segment(&self, a: usize, b: usize) -> bool {
        ((a as u64) << self.page_shift) >> SEGMENT_SHIFT == ((b as u64) << self.page_shift) >> SEGMENT_SHIFT
    }
}
