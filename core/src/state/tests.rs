//! Tests across the state modules: a model-checked property test with
//! snapshots written concurrently with updates, corruption of every byte,
//! rescaling, crashes during the write, and incremental size.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use proptest::prelude::*;

use super::snapshot::FailPoint;
use super::*;
use crate::error::Error;
use crate::state::key_groups::{key_group, stable_hash, subtask_for_key_group};

type Value = [u64; 2];
type Store = ValueStore<u64, Value>;

fn opts(dir: &Path, name: &str) -> StoreOptions {
    StoreOptions::new(dir.join("work").join(name))
}

fn contents<V: StateValue>(store: &ValueStore<u64, V>) -> BTreeMap<u64, V> {
    let mut out = BTreeMap::new();
    store.for_each(|k, v| {
        assert!(out.insert(*k, *v).is_none(), "key {k} listed twice");
    });
    assert_eq!(out.len(), store.len());
    out
}

fn write_async(job: SnapshotJob, root: &Path) -> JoinHandle<crate::Result<StateHandle>> {
    let root = root.to_path_buf();
    std::thread::spawn(move || job.write(&root))
}

fn restore_all(dir: &Path, name: &str, handles: &[StateHandle]) -> crate::Result<Store> {
    Store::restore(opts(dir, name), &dir.join("chk"), handles)
}

fn unique(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{name}-{}", N.fetch_add(1, Ordering::Relaxed))
}

#[test]
fn updates_gets_and_removes() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::create(opts(dir.path(), "a")).unwrap();
    assert!(s.is_empty());
    for k in 0..1000u64 {
        s.get_or_default(&k)[0] = k * 3;
    }
    s.get_or_default(&5)[1] += 1;
    assert_eq!(s.get(&5), Some(&[15, 1]));
    assert_eq!(s.get(&1000), None);
    assert_eq!(s.remove(&5), Some([15, 1]));
    assert_eq!(s.remove(&5), None);
    assert_eq!(s.get(&5), None);
    assert_eq!(*s.get_or_default(&5), [0, 0], "a removed key comes back as default");
    assert_eq!(s.len(), 1000);
    let c = contents(&s);
    assert_eq!(c[&999], [2997, 0]);
}

#[test]
fn snapshot_chain_restores_each_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let mut s = Store::create(opts(dir.path(), "a").with_max_delta_chain(3)).unwrap();
    let mut expected = Vec::new();
    for id in 1..=9u64 {
        for k in 0..2000u64 {
            if k % 7 == id % 7 {
                s.get_or_default(&k)[0] += id;
            }
            if k % 11 == id % 11 {
                s.remove(&k);
            }
        }
        let job = s.snapshot(id);
        let h = job.write(&root).unwrap();
        s.snapshot_done(id, true);
        assert_eq!(
            h.full,
            (id - 1) % 4 == 0,
            "checkpoint {id}: full every 1 + max_delta_chain"
        );
        assert!(h.files.len() <= 4);
        assert_eq!(h.files.last().unwrap().size, h.written_bytes);
        expected.push((h, contents(&s)));
    }
    for (h, want) in &expected {
        let r = restore_all(dir.path(), &unique("r"), std::slice::from_ref(h)).unwrap();
        assert_eq!(&contents(&r), want, "checkpoint {}", h.checkpoint_id);
    }
}

#[test]
fn restored_store_keeps_working_and_snapshots_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let mut s = Store::create(opts(dir.path(), "a")).unwrap();
    for k in 0..500u64 {
        *s.get_or_default(&k) = [k, k];
    }
    let h1 = s.snapshot(1).write(&root).unwrap();
    let mut r = restore_all(dir.path(), "r", &[h1]).unwrap();
    for k in 0..500u64 {
        if k % 2 == 0 {
            r.remove(&k);
        }
    }
    *r.get_or_default(&7000) = [1, 2];
    let h2 = r.snapshot(2).write(&root).unwrap();
    r.snapshot_done(2, true);
    assert!(h2.full, "the first snapshot after a restore is full");
    *r.get_or_default(&1) = [9, 9];
    let h3 = r.snapshot(3).write(&root).unwrap();
    assert!(!h3.full);
    let r3 = restore_all(dir.path(), "r3", &[h3]).unwrap();
    assert_eq!(contents(&r3), contents(&r));
    assert_eq!(r3.len(), 251);
}

/// One key group's table grows to many pages while the others have none:
/// the page directory of the hot path (`ValueStore::locate`) widens its
/// stride as that table doubles, tables without pages look up in the
/// empty page, and a restore rebuilds the directory from the pages.
#[test]
fn one_table_grown_far_past_the_others_is_found_before_and_after_a_restore() {
    let dir = tempfile::tempdir().unwrap();
    let maxp = crate::state::key_groups::DEFAULT_MAX_PARALLELISM;
    let in_group = |g: usize| (0u64..).filter(move |k| key_group(stable_hash(k), maxp) == g);
    let crowded: Vec<u64> = in_group(5).take(3_000).collect();
    let mut s = Store::create(opts(dir.path(), "a")).unwrap();
    for &k in &crowded {
        *s.get_or_default(&k) = [k, 1];
    }
    assert!(s.state_bytes() >= 16 * 4096, "group 5's table spans many pages");
    let elsewhere: Vec<u64> = (0..maxp)
        .filter(|&g| g != 5)
        .map(|g| in_group(g).next().unwrap())
        .collect();
    for &k in &elsewhere {
        assert_eq!(s.get(&k), None, "key {k} of a table without pages");
    }
    for &k in &crowded {
        assert_eq!(s.get(&k), Some(&[k, 1]));
    }
    // The other tables get pages now, one each; the crowded one stays.
    for &k in &elsewhere {
        s.get_or_default(&k)[1] += 2;
    }
    let want = contents(&s);
    assert_eq!(want.len(), crowded.len() + elsewhere.len());
    let h = s.snapshot(1).write(&dir.path().join("chk")).unwrap();
    let mut r = restore_all(dir.path(), "r", &[h]).unwrap();
    assert_eq!(contents(&r), want);
    for (&k, v) in &want {
        assert_eq!(r.get(&k), Some(v));
        r.get_or_default(&k)[1] += 1;
    }
    assert_eq!(
        r.len(),
        want.len(),
        "updates after the restore found every key in place"
    );
}

/// Updates every key many times while the snapshot's asynchronous part
/// runs: the file holds exactly the state at the barrier (copy-on-write),
/// including with a second snapshot taken while the first is in flight.
#[test]
fn concurrent_writes_do_not_leak_into_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let mut s = Store::create(opts(dir.path(), "a")).unwrap();
    let n = 60_000u64;
    for k in 0..n {
        *s.get_or_default(&k) = [k, 0];
    }
    let h0 = s.snapshot(1).write(&root).unwrap();
    s.snapshot_done(1, true);
    for round in 0..3u64 {
        let at_barrier = contents(&s);
        let id = 2 + 2 * round;
        let first = write_async(s.snapshot(id), &root);
        for pass in 0..3 {
            for k in 0..n {
                s.get_or_default(&k)[1] += pass + 1;
            }
        }
        let at_second = contents(&s);
        let second = write_async(s.snapshot(id + 1), &root);
        for k in (0..n).step_by(3) {
            s.remove(&k);
        }
        for k in n..n + 1000 {
            *s.get_or_default(&k) = [k, round];
        }
        let h1 = first.join().unwrap().unwrap();
        let h2 = second.join().unwrap().unwrap();
        s.snapshot_done(id, true);
        s.snapshot_done(id + 1, round != 1);
        assert_eq!(
            contents(&restore_all(dir.path(), &unique("a"), &[h1]).unwrap()),
            at_barrier
        );
        assert_eq!(
            contents(&restore_all(dir.path(), &unique("b"), &[h2]).unwrap()),
            at_second
        );
    }
    assert_eq!(restore_all(dir.path(), "first", &[h0]).unwrap().len(), n as usize);
}

/// Tables double (new pages, old ones released and reused by other key
/// groups) between incremental snapshots; every checkpoint of the chain
/// restores exactly, also at another parallelism.
#[test]
fn table_growth_and_page_reuse_across_incremental_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let o = |name: &str| opts(dir.path(), name).with_max_parallelism(4).with_max_delta_chain(100);
    let mut s = Store::create(o("a").with_key_groups(0..4)).unwrap();
    let mut expected = Vec::new();
    let mut x = 1u64;
    for round in 0..12u64 {
        // Grow: keys arrive in doubling waves; shrink: every third removed.
        for _ in 0..(500 << (round % 5)) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let k = x >> 44;
            s.get_or_default(&k)[0] += round + 1;
        }
        let keys: Vec<u64> = contents(&s).into_keys().collect();
        for k in keys.iter().step_by(3) {
            assert!(s.remove(k).is_some());
        }
        let h = s.snapshot(round + 1).write(&root).unwrap();
        s.snapshot_done(round + 1, true);
        assert_eq!(h.full, round == 0);
        expected.push((h, contents(&s)));
    }
    for (h, want) in &expected {
        let whole = Store::restore(o(&unique("w")).with_key_groups(0..4), &root, std::slice::from_ref(h)).unwrap();
        assert_eq!(&contents(&whole), want, "checkpoint {}", h.checkpoint_id);
        let mut union = BTreeMap::new();
        for r in [0..1, 1..3, 3..4] {
            let part = Store::restore(o(&unique("p")).with_key_groups(r), &root, std::slice::from_ref(h)).unwrap();
            union.extend(contents(&part));
        }
        assert_eq!(&union, want, "checkpoint {} rescaled", h.checkpoint_id);
    }
}

/// Large slots (200 bytes: 20 per page, where 20 slots with their indices
/// take less than a page): a page reused by another key group's table is
/// rewritten whole, so its every slot changes, and must be written as a
/// full image (a delta record carries no trailer).
#[test]
fn reused_pages_with_large_slots_restore_with_their_new_owner() {
    type Big = ValueStore<u64, [u64; 23]>;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let o = |name: &str| opts(dir.path(), name).with_max_parallelism(8).with_key_groups(0..8);
    let mut s = Big::create(o("a")).unwrap();
    let mut model = BTreeMap::new();
    let mut handles = Vec::new();
    for round in 0..8u64 {
        // Each round grows some tables (releasing pages) while others reuse them.
        for k in (round * 300)..(round * 300 + 150 * (round + 1)) {
            let v = [k ^ round; 23];
            *s.get_or_default(&k) = v;
            model.insert(k, v);
        }
        let h = s.snapshot(round + 1).write(&root).unwrap();
        s.snapshot_done(round + 1, true);
        handles.push((h, model.clone()));
    }
    for (h, want) in &handles {
        let r = Big::restore(o(&unique("r")), &root, std::slice::from_ref(h)).unwrap();
        let mut got = BTreeMap::new();
        r.for_each(|k, v| {
            got.insert(*k, *v);
        });
        assert_eq!(&got, want, "checkpoint {}", h.checkpoint_id);
    }
}

#[test]
fn dropping_a_job_releases_its_pages() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let mut s = Store::create(opts(dir.path(), "a")).unwrap();
    for k in 0..5000u64 {
        *s.get_or_default(&k) = [k, 1];
    }
    let job = s.snapshot(1);
    // Copies are made for the job, then freed with it unused.
    for k in 0..5000u64 {
        s.get_or_default(&k)[1] = 2;
    }
    drop(job);
    s.snapshot_done(1, false);
    for k in 0..5000u64 {
        s.get_or_default(&k)[1] = 3;
    }
    let h = s.snapshot(2).write(&root).unwrap();
    assert!(h.full, "nothing completed yet");
    let r = restore_all(dir.path(), "r", &[h]).unwrap();
    assert_eq!(r.get(&4999), Some(&[4999, 3]));
}

// ---------------------------------------------------------------- model

#[derive(Clone, Debug)]
enum Op {
    Put(u64, u64),
    Add(u64, u64),
    Del(u64),
    /// Take a snapshot and write it on another thread while later ops run.
    Snap,
    /// Take a whole snapshot inline, now (as a small store does at the
    /// barrier); it completes in order with the others.
    SnapInline,
    /// Begin an inline snapshot copied in steps afterwards (as a task
    /// does at the barrier); its pages are copied by `Step`, before the
    /// first write to each, or whole by the next snapshot.
    SnapPaced,
    /// A step of the paced copy going, of this many pages.
    Step(usize),
    /// Wait for the oldest in-flight snapshot, report it completed or not.
    Finish(bool),
    /// Fail over: restore from the newest completed checkpoint.
    Restore,
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u64..600;
    prop_oneof![
        6 => (key.clone(), any::<u64>()).prop_map(|(k, v)| Op::Put(k, v)),
        6 => (key.clone(), 1u64..100).prop_map(|(k, d)| Op::Add(k, d)),
        3 => key.prop_map(Op::Del),
        1 => Just(Op::Snap),
        1 => Just(Op::SnapInline),
        2 => Just(Op::SnapPaced),
        3 => (0usize..3).prop_map(Op::Step),
        2 => Just(Op::Finish(true)),
        1 => Just(Op::Finish(false)),
        1 => Just(Op::Restore),
    ]
}

struct InFlight {
    id: u64,
    model: HashMap<u64, Value>,
    thread: JoinHandle<crate::Result<StateHandle>>,
}

fn check_against_model(store: &Store, model: &HashMap<u64, Value>) {
    let want: BTreeMap<u64, Value> = model.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(contents(store), want);
}

fn run_model(ops: Vec<Op>, max_delta_chain: usize) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let o = |name: &str| {
        opts(dir.path(), name)
            .with_max_parallelism(4)
            .with_key_groups(0..4)
            .with_max_delta_chain(max_delta_chain)
    };
    let mut store = Store::create(o("s0")).unwrap();
    let mut model: HashMap<u64, Value> = HashMap::new();
    let mut in_flight: Vec<InFlight> = Vec::new();
    let mut completed: Option<(StateHandle, HashMap<u64, Value>)> = None;
    let mut next_id = 1;
    let mut restores = 0;
    let finish =
        |store: &mut Store, f: InFlight, ok: bool, completed: &mut Option<(StateHandle, HashMap<u64, Value>)>| {
            // A paced copy's waiter needs the rest of its pages (the task
            // would copy them at its next turns).
            store.arena_mut().complete_paced_copy();
            let h = f.thread.join().unwrap().unwrap();
            assert_eq!(h.checkpoint_id, f.id);
            store.snapshot_done(f.id, ok);
            if ok {
                *completed = Some((h, f.model));
            }
        };
    for op in ops {
        match op {
            Op::Put(k, v) => {
                *store.get_or_default(&k) = [v, k];
                model.insert(k, [v, k]);
            }
            Op::Add(k, d) => {
                store.get_or_default(&k)[0] += d;
                model.entry(k).or_default()[0] += d;
            }
            Op::Del(k) => assert_eq!(store.remove(&k), model.remove(&k)),
            Op::Snap => {
                let job = store.snapshot(next_id);
                in_flight.push(InFlight {
                    id: next_id,
                    model: model.clone(),
                    thread: write_async(job, &root),
                });
                next_id += 1;
            }
            Op::SnapInline => {
                let h = store.snapshot_inline(next_id);
                assert!(h.files.is_empty() && h.full && h.inline.is_some());
                in_flight.push(InFlight {
                    id: next_id,
                    model: model.clone(),
                    thread: std::thread::spawn(move || Ok(h)),
                });
                next_id += 1;
            }
            Op::SnapPaced => {
                let slot = store.arena_mut().begin_paced_copy(next_id);
                in_flight.push(InFlight {
                    id: next_id,
                    model: model.clone(),
                    thread: std::thread::spawn(move || {
                        let copy = slot
                            .wait(std::time::Duration::from_secs(60))
                            .expect("the paced copy completes");
                        Ok(copy.encode())
                    }),
                });
                next_id += 1;
            }
            Op::Step(pages) => {
                store.arena_mut().advance_paced_copy(pages);
            }
            Op::Finish(ok) => {
                if !in_flight.is_empty() {
                    finish(&mut store, in_flight.remove(0), ok, &mut completed);
                }
            }
            Op::Restore => {
                for f in in_flight.drain(..) {
                    finish(&mut store, f, true, &mut completed);
                }
                if let Some((h, m)) = &completed {
                    restores += 1;
                    let restored = Store::restore(o(&format!("r{restores}")), &root, std::slice::from_ref(h)).unwrap();
                    check_against_model(&restored, m);
                    store = restored;
                    model = m.clone();
                    completed = None;
                }
            }
        }
        check_against_model(&store, &model);
    }
    for f in in_flight.drain(..) {
        finish(&mut store, f, true, &mut completed);
    }
    if let Some((h, m)) = completed {
        check_against_model(&Store::restore(o("final"), &root, &[h]).unwrap(), &m);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn restored_state_equals_the_model_at_the_snapshot(
        ops in proptest::collection::vec(op(), 1..120),
        chain in 0usize..4,
    ) {
        run_model(ops, chain);
    }

    /// `update_many` (and `update_records`) applies its keys in order, exactly like one
    /// `get_or_default` per key: same values, same visits, across table
    /// growth (which moves the slots the slot cache names), removals and
    /// probe runs that cross pages (two key groups of
    /// up to 1,500 keys each fill tables up to their 3/4 bound).
    #[test]
    fn update_many_equals_one_update_per_key(
        batches in proptest::collection::vec(proptest::collection::vec(0u64..3000, 0..400), 1..8),
        removes in proptest::collection::vec(0u64..3000, 0..200),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let o = |name: &str| opts(dir.path(), name).with_max_parallelism(2).with_key_groups(0..2);
        let mut many = Store::create(o("many")).unwrap();
        let mut single = Store::create(o("single")).unwrap();
        let mut records = Store::create(o("records")).unwrap();
        // The three paths of `update_records`: one pass over the table (a
        // small store), the slot cache's groups, and the table's
        // prefetching groups (each forced from the first entry); and
        // `get_or_default` through the slot cache.
        let mut grouped = Store::create(o("grouped")).unwrap();
        let mut cached = Store::create(o("cached")).unwrap();
        let mut cached_single = Store::create(o("cached-single")).unwrap();
        grouped.set_prefetch_from(0);
        records.set_prefetch_from(usize::MAX);
        records.set_cache_from(usize::MAX);
        single.set_cache_from(usize::MAX);
        for store in [&mut cached, &mut cached_single] {
            store.set_prefetch_from(usize::MAX);
            store.set_cache_from(0);
        }
        for (n, keys) in batches.iter().enumerate() {
            let mut visited = Vec::new();
            many.update_many(keys, |k, v| {
                visited.push(*k);
                v[0] += 1;
                v[1] = v[1] * 31 + n as u64;
            });
            prop_assert_eq!(&visited, keys);
            // The same through `update_records` (records carry their keys),
            // on each of its paths.
            for store in [&mut records, &mut grouped, &mut cached] {
                let mut batch: Vec<(u64, u64)> = keys.iter().map(|&k| (k, n as u64)).collect();
                let mut seen = Vec::new();
                store.update_records(&mut batch, |r| r.0, |k, v, r| {
                    seen.push((*k, r));
                    v[0] += 1;
                    v[1] = v[1] * 31 + r.1;
                });
                prop_assert!(batch.is_empty());
                prop_assert_eq!(seen, keys.iter().map(|&k| (k, (k, n as u64))).collect::<Vec<_>>());
            }
            for store in [&mut single, &mut cached_single] {
                for k in keys {
                    let v = store.get_or_default(k);
                    v[0] += 1;
                    v[1] = v[1] * 31 + n as u64;
                }
            }
            for k in removes.iter().skip(n * 25).take(25) {
                let expected = single.remove(k);
                prop_assert_eq!(many.remove(k), expected);
                prop_assert_eq!(records.remove(k), expected);
                prop_assert_eq!(grouped.remove(k), expected);
                prop_assert_eq!(cached.remove(k), expected);
                prop_assert_eq!(cached_single.remove(k), expected);
            }
        }
        prop_assert_eq!(contents(&many), contents(&single));
        prop_assert_eq!(contents(&records), contents(&single));
        prop_assert_eq!(contents(&grouped), contents(&single));
        prop_assert_eq!(contents(&cached), contents(&single));
        prop_assert_eq!(contents(&cached_single), contents(&single));
    }
}

/// A golden checkpoint: value state written by weir at 529af0b
/// (`core/testdata/golden-value-state`: 1,322 keys in 4 key groups, a
/// full file and a delta, tables of several generations, released pages
/// among them) restores whole and rescaled with every later build, so a
/// change to the page format or the stable hash cannot pass unnoticed.
/// The restored store goes on: its next snapshots restore too.
#[test]
fn restores_a_golden_checkpoint_of_an_earlier_build() {
    type Old = ValueStore<u64, u64>;
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/golden-value-state");
    let read = |name: &str| std::fs::read(data.join(name)).unwrap();
    let handles: Vec<StateHandle> = serde_json::from_slice(&read("handles.json")).unwrap();
    let mut model: BTreeMap<u64, u64> = serde_json::from_slice::<Vec<(u64, u64)>>(&read("expected.json"))
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(model.len(), 1322);
    // A copy: the restored store's snapshots go into the same root.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    std::fs::create_dir_all(root.join("shared")).unwrap();
    for f in std::fs::read_dir(data.join("checkpoint/shared")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), root.join("shared").join(f.file_name())).unwrap();
    }
    let o = |name: &str, kgs: std::ops::Range<usize>| {
        opts(dir.path(), &unique(name))
            .with_max_parallelism(4)
            .with_key_groups(kgs)
    };
    let check = |handles: &[StateHandle], want: &BTreeMap<u64, u64>| {
        let whole = Old::restore(o("w", 0..4), &root, handles).unwrap();
        assert_eq!(&contents(&whole), want);
        let mut union = BTreeMap::new();
        for kgs in [0..1, 1..3, 3..4] {
            union.extend(contents(&Old::restore(o("p", kgs), &root, handles).unwrap()));
        }
        assert_eq!(&union, want, "rescaled");
    };
    check(&handles, &model);
    let mut s = Old::restore(o("s", 0..4), &root, &handles).unwrap();
    for round in 0..3u64 {
        for k in (round..1400).step_by(5) {
            assert_eq!(s.remove(&k), model.remove(&k), "key {k}");
        }
        for k in (1400 + round * 500)..(1900 + round * 500) {
            *s.get_or_default(&k) = k;
            model.insert(k, k);
        }
        for k in (1..1400).step_by(3) {
            if let Some(v) = model.get_mut(&k) {
                *v += round + 1;
                *s.get_or_default(&k) += round + 1;
            }
        }
        let h = s.snapshot(3 + round).write(&root).unwrap();
        s.snapshot_done(3 + round, true);
        assert_eq!(contents(&s), model);
        check(&[h], &model);
    }
}

// ---------------------------------------------------------- inline

/// A small store snapshotted inline: restores to the state at the
/// snapshot (sparse pages included), and the next file snapshot after it
/// completed is full (an inline image is never a base), while one after an
/// aborted inline snapshot still builds on the older file.
#[test]
fn inline_snapshots_restore_and_are_never_a_base() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let o = |name: &str| opts(dir.path(), name).with_max_parallelism(4).with_key_groups(0..4);
    let mut s = Store::create(o("s")).unwrap();
    for k in 0..3000u64 {
        *s.get_or_default(&k) = [k, k * 7];
    }
    for k in (0..3000u64).filter(|k| k % 3 != 0) {
        s.remove(&k);
    }
    let h1 = s.snapshot_inline(1);
    let image = h1.inline.as_ref().unwrap().len();
    assert!(image < s.full_snapshot_bytes() / 2, "sparse pages: {image} bytes");
    assert_eq!(h1.written_bytes, image as u64);
    s.snapshot_done(1, true);
    let r1 = Store::restore(o("r1"), &root, std::slice::from_ref(&h1)).unwrap();
    assert_eq!(contents(&r1), contents(&s));
    assert_eq!(r1.len(), 1000);

    *s.get_or_default(&1) = [1, 1];
    let h2 = s.snapshot(2).write(&root).unwrap();
    assert!(
        h2.full,
        "after a completed inline snapshot the next file snapshot is full"
    );
    s.snapshot_done(2, true);
    *s.get_or_default(&2) = [2, 2];
    let _aborted = s.snapshot_inline(3);
    s.snapshot_done(3, false);
    *s.get_or_default(&3) = [3, 3];
    let h4 = s.snapshot(4).write(&root).unwrap();
    assert!(!h4.full && h4.files.len() == 2, "builds on checkpoint 2's file");
    let r4 = Store::restore(o("r4"), &root, std::slice::from_ref(&h4)).unwrap();
    assert_eq!(contents(&r4), contents(&s));

    // Rescaled: two subtasks' inline images into one store and back.
    let oa =
        |name: &str, kg: std::ops::Range<usize>| opts(dir.path(), name).with_max_parallelism(4).with_key_groups(kg);
    let mut a = Store::create(oa("a", 0..2)).unwrap();
    let mut b = Store::create(oa("b", 2..4)).unwrap();
    for k in 0..2000u64 {
        let kg = key_group(stable_hash(&k), 4);
        *(if kg < 2 { &mut a } else { &mut b }).get_or_default(&k) = [k, 1];
    }
    let hs = [a.snapshot_inline(5), b.snapshot_inline(5)];
    let whole = Store::restore(oa("w", 0..4), &root, &hs).unwrap();
    assert_eq!(whole.len(), 2000);
    let half = Store::restore(oa("h", 1..3), &root, &hs).unwrap();
    assert_eq!(
        contents(&half).len(),
        (0..2000u64)
            .filter(|k| (1..3).contains(&key_group(stable_hash(k), 4)))
            .count()
    );
}

/// Every flipped byte of an inline image is detected: the restore fails,
/// never restores silently, and a checksum error names the inline image.
#[test]
fn a_paced_copy_holds_the_state_at_its_barrier_and_completes_by_writes_steps_or_drop() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let mut s = Store::create(opts(dir.path(), "paced")).unwrap();
    for k in 0..3000u64 {
        *s.get_or_default(&k) = [k, 1];
    }
    let at_barrier = contents(&s);
    let slot = s.arena_mut().begin_paced_copy(1);
    assert!(s.arena_mut().paced_copy_going());
    assert!(slot.wait(Duration::ZERO).is_none(), "no page copied at the barrier");
    // Writing every key after the barrier: each page joins the copy
    // before its first write, which completes it with no step taken.
    for k in 0..3000u64 {
        s.get_or_default(&k)[1] += 1;
    }
    assert!(!s.arena_mut().paced_copy_going());
    let h1 = slot.wait(Duration::ZERO).expect("completed by the writes").encode();
    s.snapshot_done(1, true);
    let r = Store::restore(opts(dir.path(), "r1"), &root, std::slice::from_ref(&h1)).unwrap();
    assert_eq!(contents(&r), at_barrier);

    // Steps alone: a page per step.
    let at_second = contents(&s);
    let pages = s.full_snapshot_bytes() / 4096;
    let slot = s.arena_mut().begin_paced_copy(2);
    let mut steps = 0;
    while s.arena_mut().paced_copy_going() {
        assert_eq!(s.arena_mut().advance_paced_copy(1), 1);
        steps += 1;
        assert!(steps <= pages, "more steps than pages");
    }
    let h2 = slot.wait(Duration::ZERO).expect("completed by the steps").encode();
    let r = Store::restore(opts(dir.path(), "r2"), &root, std::slice::from_ref(&h2)).unwrap();
    assert_eq!(contents(&r), at_second);

    // A copy still going when the store drops completes there: its waiter
    // gets the state at the barrier, not a hang.
    let slot = s.arena_mut().begin_paced_copy(3);
    s.arena_mut().advance_paced_copy(2);
    for k in 0..100u64 {
        s.get_or_default(&k)[0] = 7;
    }
    drop(s);
    let h3 = slot
        .wait(Duration::from_secs(10))
        .expect("completed by the drop")
        .encode();
    let r = Store::restore(opts(dir.path(), "r3"), &root, std::slice::from_ref(&h3)).unwrap();
    assert_eq!(contents(&r), at_second);
}

/// An operator's step of a paced copy takes at most `PACED_COPY_PAGES`
/// pages, in a turn without input too: a record that arrives meanwhile
/// waits for one step, never for the whole copy. Steps alone complete it.
#[test]
fn a_paced_copy_step_is_bounded_in_every_turn_and_steps_complete_it() {
    use crate::operators::stores::{Snapshottable, StoreLifecycle};
    use crate::state::arena::PACED_COPY_PAGES;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let mut s = Store::create(opts(dir.path(), "bounded")).unwrap();
    for k in 0..3000u64 {
        *s.get_or_default(&k) = [k, 2];
    }
    let pages = s.full_snapshot_bytes() / 4096;
    assert!(pages > 4 * PACED_COPY_PAGES, "a store of {pages} pages tests nothing");
    let at_barrier = contents(&s);
    let mut lifecycle = StoreLifecycle::paced();
    let slot = s.arena_mut().begin_paced_copy(1);
    let mut steps = 0;
    loop {
        let mut stores: [&mut dyn Snapshottable; 1] = [&mut s];
        lifecycle.advance(&mut stores);
        steps += 1;
        if !lifecycle.copying() {
            break;
        }
        assert!(
            slot.wait(Duration::ZERO).is_none(),
            "handed over before every page was copied"
        );
        assert!(steps < pages, "more steps than pages");
    }
    assert_eq!(
        steps,
        pages.div_ceil(PACED_COPY_PAGES),
        "each step copies PACED_COPY_PAGES pages"
    );
    let h = slot.wait(Duration::ZERO).expect("completed by the steps").encode();
    let r = Store::restore(opts(dir.path(), "r"), &root, std::slice::from_ref(&h)).unwrap();
    assert_eq!(contents(&r), at_barrier);
}

#[test]
fn every_flipped_byte_of_an_inline_image_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let o = |name: &str| opts(dir.path(), name).with_max_parallelism(2).with_key_groups(0..2);
    let mut s = Store::create(o("s")).unwrap();
    for k in 0..300u64 {
        *s.get_or_default(&k) = [k, !k];
    }
    let h = s.snapshot_inline(7);
    let image = h.inline.clone().unwrap();
    for at in 0..image.len() {
        let mut bad = h.clone();
        bad.inline.as_mut().unwrap()[at] ^= 0x10;
        match Store::restore(o(&unique("c")), &dir.path().join("chk"), &[bad]) {
            Err(Error::Corrupt { checkpoint, file, .. }) => {
                assert_eq!(checkpoint, 7);
                assert!(file.contains("inline state image of checkpoint 7"), "{file}");
            }
            Err(_) => {}
            Ok(_) => panic!("byte {at} of {} flipped, restored anyway", image.len()),
        }
    }
    let mut cut = h.clone();
    cut.inline.as_mut().unwrap().truncate(image.len() - 1);
    assert!(Store::restore(o("t"), &dir.path().join("chk"), &[cut]).is_err());
}

// ---------------------------------------------------------- corruption

/// A checkpoint directory with one full and one incremental file.
fn two_checkpoints(dir: &Path) -> (StateHandle, StateHandle) {
    let root = dir.join("chk");
    let o = opts(dir, "src").with_max_parallelism(2).with_key_groups(0..2);
    let mut s = Store::create(o).unwrap();
    for k in 0..300u64 {
        *s.get_or_default(&k) = [k, !k];
    }
    let h1 = s.snapshot(1).write(&root).unwrap();
    s.snapshot_done(1, true);
    *s.get_or_default(&3) = [1, 1];
    s.remove(&4);
    let h2 = s.snapshot(2).write(&root).unwrap();
    assert!(h1.full && !h2.full && h2.files.len() == 2);
    (h1, h2)
}

fn expect_corrupt(dir: &Path, h: &StateHandle, file: &StateFile, what: &str) -> Option<u64> {
    let o = opts(dir, &unique("c")).with_max_parallelism(2).with_key_groups(0..2);
    match Store::restore(o, &dir.join("chk"), std::slice::from_ref(h)) {
        Err(Error::Corrupt {
            checkpoint,
            file: f,
            page,
            expected,
            actual,
            ..
        }) => {
            assert_eq!(checkpoint, h.checkpoint_id, "{what}");
            assert_eq!(f, file.path, "{what}");
            assert_ne!(expected, actual, "{what}");
            page
        }
        other => panic!("{what}: expected a corruption error, got {other:?}"),
    }
}

#[test]
fn every_flipped_byte_is_detected_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let (_, h2) = two_checkpoints(dir.path());
    for file in &h2.files {
        let path = dir.path().join("chk").join(&file.path);
        let original = std::fs::read(&path).unwrap();
        let mut pages_named = 0;
        for i in 0..original.len() {
            let mut bytes = original.clone();
            bytes[i] ^= 1 << (i % 8);
            std::fs::write(&path, &bytes).unwrap();
            let page = expect_corrupt(dir.path(), &h2, file, &format!("{} byte {i}", file.path));
            let in_records = i >= 48 && i < original.len() - 24;
            assert_eq!(
                page.is_some(),
                in_records,
                "byte {i}: page named iff the byte is in a page record"
            );
            pages_named += usize::from(page.is_some());
        }
        assert!(pages_named > 0);
        std::fs::write(&path, &original).unwrap();
    }
    let msg = {
        let file = &h2.files[0];
        let path = dir.path().join("chk").join(&file.path);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[100] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let o = opts(dir.path(), "msg").with_max_parallelism(2).with_key_groups(0..2);
        Store::restore(o, &dir.path().join("chk"), std::slice::from_ref(&h2))
            .unwrap_err()
            .to_string()
    };
    assert!(
        msg.contains("checkpoint 2") && msg.contains("page 0") && msg.contains("expected CRC 0x"),
        "{msg}"
    );
}

#[test]
fn every_truncation_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (_, h2) = two_checkpoints(dir.path());
    for file in &h2.files {
        let path = dir.path().join("chk").join(&file.path);
        let original = std::fs::read(&path).unwrap();
        let step = (original.len() / 300).max(1);
        let cuts = (0..original.len())
            .step_by(step)
            .chain([original.len() - 1, original.len() - 24]);
        for len in cuts {
            std::fs::write(&path, &original[..len]).unwrap();
            expect_corrupt(dir.path(), &h2, file, &format!("{} cut to {len}", file.path));
        }
        std::fs::write(&path, &original).unwrap();
    }
    let o = opts(dir.path(), "ok").with_max_parallelism(2).with_key_groups(0..2);
    assert_eq!(Store::restore(o, &dir.path().join("chk"), &[h2]).unwrap().len(), 299);
}

#[test]
fn a_missing_file_or_foreign_layout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (h1, h2) = two_checkpoints(dir.path());
    let o = || {
        opts(dir.path(), &unique("x"))
            .with_max_parallelism(2)
            .with_key_groups(0..2)
    };
    let other: crate::Result<ValueStore<u32, Value>> =
        ValueStore::restore(o(), &dir.path().join("chk"), std::slice::from_ref(&h2));
    assert!(matches!(other, Err(Error::State { .. })), "{other:?}");
    let mut swapped = h2.clone();
    swapped.files[0].crc32 = h2.files[1].crc32; // the manifest records another file's CRC
    assert!(matches!(
        Store::restore(o(), &dir.path().join("chk"), &[swapped]),
        Err(Error::Corrupt { .. })
    ));
    std::fs::remove_file(dir.path().join("chk").join(&h1.files[0].path)).unwrap();
    assert!(matches!(
        Store::restore(o(), &dir.path().join("chk"), &[h2]),
        Err(Error::State { .. })
    ));
}

// ------------------------------------------------------------ rescaling

fn owner(k: &u64, maxp: usize, parallelism: usize) -> usize {
    subtask_for_key_group(key_group(stable_hash(k), maxp), maxp, parallelism)
}

fn ranges(parallelism: usize) -> Vec<std::ops::Range<usize>> {
    (0..parallelism)
        .map(|i| i * 128 / parallelism..(i + 1) * 128 / parallelism)
        .collect()
}

#[test]
fn rescaling_value_state_from_2_to_1_and_4() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let mut stores: Vec<Store> = ranges(2)
        .into_iter()
        .map(|r| Store::create(opts(dir.path(), &unique("p2")).with_key_groups(r)).unwrap())
        .collect();
    let mut all = BTreeMap::new();
    for k in 0..20_000u64 {
        let v = [k * k, k];
        *stores[owner(&k, 128, 2)].get_or_default(&k) = v;
        all.insert(k, v);
    }
    // A full and then an incremental checkpoint, so rescaling reads chains.
    for s in &mut stores {
        s.snapshot(1).write(&root).unwrap();
        s.snapshot_done(1, true);
    }
    for k in (0..20_000u64).step_by(10) {
        stores[owner(&k, 128, 2)].remove(&k);
        all.remove(&k);
    }
    let handles: Vec<StateHandle> = stores.iter_mut().map(|s| s.snapshot(2).write(&root).unwrap()).collect();
    assert!(handles.iter().all(|h| !h.full));
    for parallelism in [1, 4, 2] {
        let mut union = BTreeMap::new();
        for (i, r) in ranges(parallelism).into_iter().enumerate() {
            let s = Store::restore(opts(dir.path(), &unique("r")).with_key_groups(r), &root, &handles).unwrap();
            for (k, v) in contents(&s) {
                assert_eq!(owner(&k, 128, parallelism), i, "key {k} restored by the wrong subtask");
                assert!(union.insert(k, v).is_none());
            }
        }
        assert_eq!(union, all, "parallelism {parallelism}");
    }
    // Handles that do not cover the key groups are refused.
    let partial = Store::restore(opts(dir.path(), "partial"), &root, &handles[..1]);
    assert!(matches!(partial, Err(Error::State { .. })));
}

#[test]
fn rescaling_map_and_list_state() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let mut maps: Vec<MapStore<String, u32, String>> = ranges(2)
        .into_iter()
        .map(|r| MapStore::create(opts(dir.path(), &unique("m")).with_key_groups(r)).unwrap())
        .collect();
    let mut lists: Vec<ListStore<u64, Vec<u16>>> = ranges(2)
        .into_iter()
        .map(|r| ListStore::create(opts(dir.path(), &unique("l")).with_key_groups(r)).unwrap())
        .collect();
    let sub = |k: &String, p: usize| subtask_for_key_group(key_group(stable_hash(k), 128), 128, p);
    let mut map_model: BTreeMap<(String, u32), String> = BTreeMap::new();
    let mut list_model: BTreeMap<u64, Vec<Vec<u16>>> = BTreeMap::new();
    for i in 0..3000u64 {
        let k = format!("user-{}", i % 400);
        let v = format!("v{i}");
        maps[sub(&k, 2)].put(&k, &((i % 7) as u32), &v).unwrap();
        map_model.insert((k, (i % 7) as u32), v);
        let lk = i % 300;
        let elem = vec![i as u16; (i % 5) as usize];
        lists[owner(&lk, 128, 2)].append(&lk, &elem).unwrap();
        list_model.entry(lk).or_default().push(elem);
    }
    let mh1: Vec<StateHandle> = maps.iter_mut().map(|m| m.snapshot(1).write(&root).unwrap()).collect();
    let lh1: Vec<StateHandle> = lists.iter_mut().map(|l| l.snapshot(1).write(&root).unwrap()).collect();
    assert!(mh1.iter().chain(&lh1).all(|h| h.full));
    maps.iter_mut().for_each(|m| m.snapshot_done(1, true));
    lists.iter_mut().for_each(|l| l.snapshot_done(1, true));
    // Changes after the base: removals, clears, overwrites, appends.
    for i in 0..400u64 {
        let k = format!("user-{i}");
        if i % 3 == 0 {
            assert!(maps[sub(&k, 2)].remove(&k, &1) == map_model.remove(&(k.clone(), 1)).is_some());
        }
        if i % 50 == 0 {
            maps[sub(&k, 2)].clear(&k);
            map_model.retain(|(mk, _), _| *mk != k);
        }
        if i < 300 && i % 4 == 0 {
            let n = lists[owner(&i, 128, 2)].clear(&i);
            assert_eq!(n, list_model.remove(&i).map_or(0, |l| l.len()));
            lists[owner(&i, 128, 2)].append(&i, &vec![7]).unwrap();
            list_model.insert(i, vec![vec![7]]);
        }
    }
    let mh: Vec<StateHandle> = maps.iter_mut().map(|m| m.snapshot(2).write(&root).unwrap()).collect();
    let lh: Vec<StateHandle> = lists.iter_mut().map(|l| l.snapshot(2).write(&root).unwrap()).collect();
    assert!(mh.iter().chain(&lh).all(|h| !h.full && h.files.len() == 2));
    for parallelism in [1, 4] {
        let mut map_union = BTreeMap::new();
        let mut list_union = BTreeMap::new();
        for r in ranges(parallelism) {
            let m: MapStore<String, u32, String> =
                MapStore::restore(opts(dir.path(), &unique("rm")).with_key_groups(r.clone()), &root, &mh).unwrap();
            m.for_each(|k, uk, v| assert!(map_union.insert((k.clone(), *uk), v).is_none()));
            let l: ListStore<u64, Vec<u16>> =
                ListStore::restore(opts(dir.path(), &unique("rl")).with_key_groups(r), &root, &lh).unwrap();
            for k in 0..300u64 {
                if l.len_of(&k) > 0 {
                    assert!(list_union.insert(k, l.get(&k)).is_none());
                }
            }
        }
        assert_eq!(map_union, map_model, "map state at parallelism {parallelism}");
        assert_eq!(list_union, list_model, "list state at parallelism {parallelism}");
    }
}

#[test]
fn oversized_codec_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut m: MapStore<u64, u64, String> = MapStore::create(opts(dir.path(), "m").with_max_value_len(8)).unwrap();
    assert!(m.put(&1, &1, &"1234567".to_string()).is_ok());
    assert!(matches!(
        m.put(&1, &2, &"12345678".to_string()),
        Err(Error::State { .. })
    ));
    assert_eq!(m.len(), 1);
}

// ---------------------------------------------------------------- crash

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

#[test]
fn a_crash_during_the_write_leaves_the_previous_checkpoint_intact() {
    for fail in [
        FailPoint::AfterBytes(0),
        FailPoint::AfterBytes(5000),
        FailPoint::AfterBytes(40_000),
        FailPoint::BeforeRename,
        FailPoint::BeforeDirSync,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("chk");
        let mut s = Store::create(opts(dir.path(), "a")).unwrap();
        for k in 0..3000u64 {
            *s.get_or_default(&k) = [k, 1];
        }
        let h1 = s.snapshot(1).write(&root).unwrap();
        s.snapshot_done(1, true);
        let at_1 = contents(&s);
        let before: Vec<(PathBuf, Vec<u8>)> = files_in(&root.join("shared"))
            .into_iter()
            .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
            .collect();
        for k in 0..3000u64 {
            s.get_or_default(&k)[1] = 2;
        }
        let err = s.snapshot(2).write_with(&root, Some(fail), true).unwrap_err();
        assert!(err.to_string().contains("injected fault"), "{fail:?}: {err}");
        s.snapshot_done(2, false);
        // Earlier files are byte-for-byte untouched and restore.
        for (p, bytes) in &before {
            assert_eq!(&std::fs::read(p).unwrap(), bytes, "{fail:?}");
        }
        assert_eq!(
            contents(&restore_all(dir.path(), &unique("r"), std::slice::from_ref(&h1)).unwrap()),
            at_1
        );
        let leftovers = files_in(&root.join("shared")).len() - before.len();
        assert_eq!(leftovers, 1, "{fail:?}: one unreferenced temp or orphan file");
        // The next checkpoint builds on checkpoint 1 and restores in full.
        let h3 = s.snapshot(3).write(&root).unwrap();
        assert!(!h3.full && h3.files[0] == h1.files[0], "{fail:?}");
        assert!(h3.files.iter().all(|f| !f.path.ends_with(".tmp")));
        assert_eq!(
            contents(&restore_all(dir.path(), &unique("r"), &[h3]).unwrap()),
            contents(&s)
        );
        let removed = remove_temp_files(&root).unwrap();
        assert_eq!(
            removed,
            usize::from(!matches!(fail, FailPoint::BeforeDirSync)),
            "{fail:?}"
        );
    }
}

// ---------------------------------------------------------- incremental

#[test]
fn one_percent_changed_writes_under_five_percent() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let mut s = Store::create(opts(dir.path(), "a")).unwrap();
    let n = 200_000u64;
    for k in 0..n {
        *s.get_or_default(&k) = [k, 0];
    }
    let full = s.snapshot(1).write(&root).unwrap();
    s.snapshot_done(1, true);
    // 1% of keys, spread over the whole key space (every page is touched).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..n / 100 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.get_or_default(&(x % n))[1] += 1;
    }
    let inc = s.snapshot(2).write(&root).unwrap();
    let ratio = inc.written_bytes as f64 / full.written_bytes as f64;
    assert!(
        !inc.full && ratio <= 0.05,
        "incremental is {:.2}% of full",
        ratio * 100.0
    );
    assert_eq!(inc.state_bytes, full.state_bytes);
    let r = restore_all(dir.path(), "r", &[inc]).unwrap();
    assert_eq!(contents(&r), contents(&s));
}

#[test]
fn segments_grow_past_one_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let mut s = Store::create(opts(dir.path(), "a")).unwrap();
    // 16 MiB segments of 4 KiB pages with 127 slots of 32 bytes.
    let n = 700_000u64;
    for k in 0..n {
        *s.get_or_default(&k) = [k, 5];
    }
    assert!(s.arena().segment_count() >= 2);
    let h = s.snapshot(1).write(&root).unwrap();
    let r = restore_all(dir.path(), "r", &[h]).unwrap();
    assert_eq!(r.len(), n as usize);
    assert_eq!(r.get(&(n - 1)), Some(&[n - 1, 5]));
    drop(s);
    drop(r);
    assert!(
        files_in(&dir.path().join("work").join("a")).is_empty(),
        "segment files are removed with the store"
    );
}
