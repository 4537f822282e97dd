//! The fuzzed decoders on the stable toolchain: proptest mutates the
//! committed seed corpora (`fuzz/corpus/<decoder>/`, the cargo-fuzz
//! targets' seeds) and throws random bytes at every decoder of
//! `weir_core::fuzzing` and `weir_io::fuzzing`, each input as it is and
//! with its checksums fixed. Every decode must return (an error or not)
//! without panicking, within [`TIME_LIMIT`], and without allocating more
//! at once than the decoder's stated bound, which a counting global
//! allocator measures.
//!
//! `WEIR_FUZZ_SCALE` multiplies the cases per decoder (default 1).
//! Regenerate the seeds after a format change with
//! `cargo test --release -p weir-bench --test fuzz_decoders -- --ignored write_seed_corpora`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use weir_core::fuzzing::Decoder;

/// Counts heap bytes in use and their peak, over all threads.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Any single allocation above this is refused (the test then aborts with
/// its size) instead of taking the machine's memory: 1 GiB.
const REFUSE_OVER: usize = 1 << 30;

impl Counting {
    fn add(size: usize) {
        let now = IN_USE.fetch_add(size, Ordering::Relaxed) + size;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > REFUSE_OVER {
            return std::ptr::null_mut();
        }
        let p = System.alloc(layout);
        if !p.is_null() {
            Self::add(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > REFUSE_OVER {
            return std::ptr::null_mut();
        }
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            Self::add(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > REFUSE_OVER {
            return std::ptr::null_mut();
        }
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            // Both blocks may exist at once during the move: count the new
            // one before the old one goes.
            Self::add(new_size);
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One decode may take this long at most (a hang guard: the largest
/// inputs here take milliseconds).
const TIME_LIMIT: Duration = Duration::from_secs(5);

/// One test at a time: allocations are counted over all threads.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn decoders() -> Vec<Decoder> {
    weir_core::fuzzing::DECODERS
        .iter()
        .chain(weir_io::fuzzing::DECODERS)
        .copied()
        .collect()
}

fn decoder(name: &str) -> Decoder {
    decoders()
        .into_iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no decoder {name}"))
}

fn corpus_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(name)
}

/// The committed seeds of a decoder, `(file name, bytes)` in name order.
/// Seeds named `bad-*` are inputs the decoder must refuse (a torn tail, a
/// malformed line); the others must decode.
fn named_seeds(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(name);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let seeds: Vec<(String, Vec<u8>)> = paths
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(p).unwrap())
        })
        .collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

fn seeds(name: &str) -> Vec<Vec<u8>> {
    named_seeds(name).into_iter().map(|(_, b)| b).collect()
}

/// Decodes `bytes` once, measuring: the result, the time it took and the
/// most bytes it had allocated at once.
fn measured(d: &Decoder, bytes: &[u8]) -> (Result<(), String>, Duration, usize) {
    let base = IN_USE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let start = Instant::now();
    let result = (d.decode)(bytes);
    let took = start.elapsed();
    (result, took, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

/// Decodes `bytes`, checking the time and allocation bounds. Over the
/// allocation bound, the input is decoded again and only that counts: the
/// first use of some paths initialises the standard library's lazy
/// statics (one 270 KB allocation was seen once per process), a real
/// over-allocation happens every time.
fn checked(d: &Decoder, bytes: &[u8]) -> Result<(), String> {
    let bound = (d.max_alloc)(bytes.len());
    let (mut result, took, mut peak) = measured(d, bytes);
    assert!(
        took < TIME_LIMIT,
        "{}: decoding {} bytes took {took:?}",
        d.name,
        bytes.len()
    );
    if peak > bound {
        (result, _, peak) = measured(d, bytes);
    }
    assert!(
        peak <= bound,
        "{}: decoding {} bytes allocated {peak} bytes at once, over its bound of {bound}",
        d.name,
        bytes.len()
    );
    result
}

/// One change to an input.
#[derive(Debug, Clone)]
enum Mutation {
    /// Flip bit `bit` of the byte at this position.
    Flip(prop::sample::Index, u8),
    /// Overwrite the byte at this position.
    Set(prop::sample::Index, u8),
    /// Overwrite 1, 2, 4 or 8 bytes with an edge value (length fields).
    Edge(prop::sample::Index, u64, u8),
    /// Insert bytes.
    Insert(prop::sample::Index, Vec<u8>),
    /// Delete up to this many bytes.
    Delete(prop::sample::Index, usize),
    /// Cut the input here.
    Truncate(prop::sample::Index),
    /// Copy a piece of another seed (or of this input) in.
    Splice(prop::sample::Index, prop::sample::Index, prop::sample::Index, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    use prop::sample::Index;
    let edge = prop_oneof![
        Just(0u64),
        Just(1),
        Just(0x7f),
        Just(0xff),
        Just(0xffff),
        Just(u32::MAX as u64),
        Just(u32::MAX as u64 / 2 + 1),
        Just(16 << 20),
        Just(u64::MAX),
        Just(i64::MAX as u64),
        any::<u64>(),
    ];
    prop_oneof![
        4 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        3 => (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::Set(i, v)),
        3 => (any::<Index>(), edge, prop::sample::select(vec![1u8, 2, 4, 8])).prop_map(|(i, v, w)| Mutation::Edge(i, v, w)),
        2 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        2 => (any::<Index>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        2 => (any::<Index>(), any::<Index>(), any::<Index>(), 1usize..256)
            .prop_map(|(s, from, to, n)| Mutation::Splice(s, from, to, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation, seeds: &[Vec<u8>]) {
    let at = |i: &prop::sample::Index, len: usize| if len == 0 { 0 } else { i.index(len + 1).min(len) };
    match m {
        Mutation::Flip(i, bit) if !bytes.is_empty() => {
            let p = i.index(bytes.len());
            bytes[p] ^= 1 << bit;
        }
        Mutation::Set(i, v) if !bytes.is_empty() => {
            let p = i.index(bytes.len());
            bytes[p] = *v;
        }
        Mutation::Edge(i, v, w) if !bytes.is_empty() => {
            let p = i.index(bytes.len());
            let w = usize::from(*w).min(bytes.len() - p);
            bytes[p..p + w].copy_from_slice(&v.to_le_bytes()[..w]);
        }
        Mutation::Insert(i, b) => {
            let p = at(i, bytes.len());
            bytes.splice(p..p, b.iter().copied());
        }
        Mutation::Delete(i, n) if !bytes.is_empty() => {
            let p = i.index(bytes.len());
            let end = (p + n).min(bytes.len());
            bytes.drain(p..end);
        }
        Mutation::Truncate(i) => {
            let p = at(i, bytes.len());
            bytes.truncate(p);
        }
        Mutation::Splice(s, from, to, n) => {
            let src = seeds[s.index(seeds.len())].clone();
            if !src.is_empty() {
                let f = from.index(src.len());
                let piece = &src[f..(f + n).min(src.len())];
                let p = at(to, bytes.len());
                bytes.splice(p..p, piece.iter().copied());
            }
        }
        _ => {}
    }
}

/// An input: a seed with mutations, or random bytes.
fn input(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let n = seeds.len();
    let mutated = (0..n, prop::collection::vec(mutation(), 1..6)).prop_map(move |(s, ms)| {
        let mut bytes = seeds[s].clone();
        for m in &ms {
            apply(&mut bytes, m, &seeds);
        }
        bytes
    });
    prop_oneof![
        9 => mutated,
        1 => prop::collection::vec(any::<u8>(), 0..512),
    ]
}

/// `cases` scaled by `WEIR_FUZZ_SCALE` (default 1), and by 1/20 in a
/// build without optimisations (`cargo test` without `--release`).
fn scaled(cases: u32) -> u32 {
    let scale: f64 = std::env::var("WEIR_FUZZ_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let scale = if cfg!(debug_assertions) { scale / 20.0 } else { scale };
    ((f64::from(cases) * scale) as u32).max(1)
}

/// Mutates the seeds of `name` for `cases` cases (scaled).
fn mutate(name: &str, cases: u32) {
    let _guard = serial();
    let d = decoder(name);
    let seeds = seeds(name);
    let cases = scaled(cases);
    let start = Instant::now();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&input(seeds), |bytes| {
            let _ = checked(&d, &bytes);
            let mut fixed = bytes.clone();
            (d.fix_checksums)(&mut fixed);
            if fixed != bytes {
                let _ = checked(&d, &fixed);
            }
            Ok(())
        })
        .unwrap();
    eprintln!("{name}: {cases} cases in {:.1?}", start.elapsed());
}

macro_rules! mutation_tests {
    ($($name:ident: $cases:expr),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                mutate(stringify!($name), $cases);
            }
        )*

        /// Every decoder has a test here.
        #[test]
        fn every_decoder_is_mutated() {
            let tested = [$(stringify!($name)),*];
            for d in decoders() {
                assert!(tested.contains(&d.name), "no mutation test for {}", d.name);
            }
        }
    };
}

// Cases per decoder: tens of thousands where a decode takes microseconds,
// fewer where it writes files and restores stores (about 0.5-1 ms each,
// in memory under /dev/shm); some 30 s in all in release mode on a loaded
// 2-core machine.
mutation_tests!(
    manifest: 20_000,
    task_state: 20_000,
    state_file: 6_000,
    state_image: 10_000,
    wal_segment: 50_000,
    wal_marker: 50_000,
    wal_sink_state: 50_000,
    twophase_state: 50_000,
    file_lines: 10_000,
    file_offset: 10_000,
    nexmark_json: 50_000,
    kafka_offset: 50_000,
    kafka_records: 50_000,
    kafka_marker: 50_000,
);

/// The committed seeds are valid (they were written by weir's encoders and
/// the formats have not drifted) or, named `bad-*`, refused; within the
/// bounds; unchanged by fixing their checksums; and every single-byte flip
/// of a valid one is an error for the formats that are checksummed whole.
#[test]
fn seeds_decode_and_every_flip_is_detected() {
    let _guard = serial();
    for d in decoders() {
        for (name, seed) in named_seeds(d.name) {
            let what = format!("{}/{name}", d.name);
            let result = checked(&d, &seed);
            if name.starts_with("bad-") {
                assert!(result.is_err(), "{what} decodes");
                continue;
            }
            result.unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut fixed = seed.clone();
            (d.fix_checksums)(&mut fixed);
            assert!(
                fixed == seed,
                "{what}: fixing the checksums of a valid input changes it"
            );
            // A marker falls back to its other slot; the others have no
            // checksums of their own (offsets live in checksummed task
            // states, framed Kafka records in checksummed log frames).
            let whole = !matches!(
                d.name,
                "wal_marker" | "file_lines" | "file_offset" | "nexmark_json" | "kafka_offset" | "kafka_records"
            );
            if whole && seed.len() <= 1024 {
                for p in 0..seed.len() {
                    let mut b = seed.clone();
                    b[p] ^= 0x10;
                    assert!(checked(&d, &b).is_err(), "{what}: a flip at byte {p} went unnoticed");
                }
            }
        }
    }
}

/// Regenerates `fuzz/corpus/` from weir's own encoders (run by hand after
/// a format change; the bytes differ from run to run where they hold
/// times or unique names).
#[test]
#[ignore]
fn write_seed_corpora() {
    let dir = tempfile::tempdir().unwrap();
    let mut all = weir_core::fuzzing::seeds(&dir.path().join("core")).unwrap();
    std::fs::create_dir_all(dir.path().join("io")).unwrap();
    all.extend(weir_io::fuzzing::seeds(&dir.path().join("io")).unwrap());
    for d in decoders() {
        let out = corpus_dir(d.name);
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        for (_, name, bytes) in all.iter().filter(|(n, _, _)| *n == d.name) {
            std::fs::write(out.join(name), bytes).unwrap();
        }
        eprintln!("{}: {} seeds", d.name, std::fs::read_dir(&out).unwrap().count());
    }
}
