//! How long weir's workers waited behind other threads on their own cores:
//! the machine's delay that the platform probe cannot see.
//!
//! The probe runs under `SCHED_FIFO`, so it preempts every ordinary thread
//! at once. A worker is an ordinary thread: when a `SCHED_OTHER` kernel
//! thread (DAMON's `kdamond`, a `kworker`) or another program's thread
//! runs on its core, the worker waits for the end of that thread's slice,
//! and its records with it, while the probe sees nothing late. On these
//! guests such waits are 0.2-0.8 ms for `kdamond` and up to a few ms for a
//! shell command run beside the benchmark (`sched_switch` traces:
//! docs/notebook/benchmarks-2026-12.md, "The platform probe").
//!
//! This sampler asks the kernel instead. Every [`WINDOW_NS`] it reads each
//! worker's `/proc/self/task/<tid>/schedstat`, whose second field is the
//! nanoseconds the thread spent runnable but not running, from a core the
//! workers do not use when there is one (a few µs per window there,
//! nothing on the workers' cores). The probe's own wake-ups preempt the
//! worker too; the probe thread's run time on that core over the same
//! window is subtracted. A window in which the worker lost at least
//! [`WAIT_FLOOR_NS`] counts: how many such windows, the most lost in one,
//! and their sum are reported.
//!
//! Why windows of 10 ms and not finer: a sampler waking every 250 µs on
//! the spare core kept that vCPU from going idle, and the host then took
//! the workers' vCPU away far more: a higher platform p99 in 10 of 10
//! interleaved pairs (4.4-6.2 ms in nine, against 0.02-1.5 ms) and steal
//! 3.6-5.7% against 0.4-1.8% in the six that printed it
//! (docs/notebook/benchmarks-2026-12.md, "The platform probe").
//! At 100 wake-ups a second it is one more of weir's own periodic helpers.
//!
//! What it does not see: steal (the hypervisor stops the whole vCPU, the
//! worker counts as running; the probe and [`crate::lab::cpu_time`] measure it);
//! how a window's loss was split (one 800 µs slice or several short ones);
//! which thread the core ran instead (`perf record -e sched:sched_switch`
//! says). When weir's helper threads share the workers' cores (no spare
//! core), their time is counted too. Linux only: elsewhere, or without
//! `schedstat`, the result is absent.
//!
//! Nothing here runs on a worker or per event.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::Serialize;

/// Time between two readings of the workers' wait, nanoseconds: 10 ms
/// (see the module docs for why not finer).
pub const WINDOW_NS: u64 = 10_000_000;

/// A window counts when the worker lost at least this much of it: 100 µs.
/// The probe's context switches and short kernel work on the core add a
/// few tens of µs per window; a slice of another thread is longer.
pub const WAIT_FLOOR_NS: u64 = 100_000;

/// How often the sampler looks for worker threads it does not follow yet
/// once it follows some (a restarted attempt starts new ones): 100 ms.
/// Until it follows one (a job starts its workers after the probe), at
/// every window.
const SCAN_NS: u64 = 100_000_000;

/// The name prefix of weir's worker threads (`weir-worker-{w}`, worker `w`
/// pinned to core `w`).
const WORKER_PREFIX: &str = "weir-worker-";

/// What the sampler found over one run (or several runs, merged).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CoRunners {
    /// Windows in which a worker lost at least [`WAIT_FLOOR_NS`] to other
    /// threads, over every worker.
    pub windows: u64,
    /// The most a worker lost in one window, microseconds (0 without any).
    pub worst_us: f64,
    /// What the workers lost in those windows, milliseconds.
    pub total_ms: f64,
    /// Worker threads followed.
    pub workers: usize,
    /// The window, milliseconds.
    pub window_ms: u64,
}

impl CoRunners {
    /// Adds `other`'s windows into this one (several runs, one row).
    pub fn merge(&mut self, other: &CoRunners) {
        self.windows += other.windows;
        self.worst_us = self.worst_us.max(other.worst_us);
        self.total_ms += other.total_ms;
        self.workers = self.workers.max(other.workers);
        self.window_ms = self.window_ms.max(other.window_ms);
    }

    /// `workers lost 1.1 ms to other threads (3 windows of 10 ms over
    /// 100 µs, at most 712 µs in one)`.
    pub fn describe(&self) -> String {
        let floor = WAIT_FLOOR_NS / 1000;
        if self.windows == 0 {
            return format!("no {} ms window lost over {floor} µs to other threads", self.window_ms);
        }
        format!(
            "workers lost {:.1} ms to other threads ({} window{} of {} ms over {floor} µs, at most {:.0} µs in one)",
            self.total_ms,
            self.windows,
            if self.windows == 1 { "" } else { "s" },
            self.window_ms,
            self.worst_us
        )
    }
}

/// `(time running, time runnable but waiting)` in nanoseconds, from a
/// `schedstat` text (`"<run ns> <wait ns> <slices>\n"`).
pub fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_ascii_whitespace();
    let run = f.next()?.parse().ok()?;
    let wait = f.next()?.parse().ok()?;
    Some((run, wait))
}

/// One thread's `schedstat`, kept open and read again in place.
struct Stat {
    file: File,
    buf: [u8; 96],
}

impl Stat {
    fn open(tid: i32) -> Option<Stat> {
        let file = File::open(format!("/proc/self/task/{tid}/schedstat")).ok()?;
        Some(Stat { file, buf: [0; 96] })
    }

    /// `(run, wait)` now; `None` once the thread has exited.
    fn read(&mut self) -> Option<(u64, u64)> {
        let n = self.file.read_at(&mut self.buf, 0).ok()?;
        parse_schedstat(std::str::from_utf8(&self.buf[..n]).ok()?)
    }
}

/// The windows that count, of one worker or of all.
#[derive(Default)]
struct Windows {
    count: u64,
    worst: u64,
    total: u64,
}

impl Windows {
    /// One window in which the worker lost `lost` ns behind other threads.
    fn window(&mut self, lost: u64) {
        if lost >= WAIT_FLOOR_NS {
            self.count += 1;
            self.worst = self.worst.max(lost);
            self.total += lost;
        }
    }

    fn merge(&mut self, other: &Windows) {
        self.count += other.count;
        self.worst = self.worst.max(other.worst);
        self.total += other.total;
    }
}

/// A followed worker: its wait at the last sample.
struct Worker {
    stat: Stat,
    /// Its index (`weir-worker-{index}`): the probe on core `index` shares its core.
    index: usize,
    last_wait: u64,
    windows: Windows,
}

/// The sampler thread; see the module docs.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<CoRunners>,
}

impl Sampler {
    /// Starts sampling. `probes` holds `(core index, thread id)` of each
    /// platform probe thread, whose run time is subtracted from the wait of
    /// the worker with the same index; `core` is where the sampler runs
    /// (`None`: unpinned). `None` if the thread cannot start or this
    /// kernel has no `schedstat`.
    pub fn start(probes: Vec<(usize, i32)>, core: Option<core_affinity::CoreId>) -> Option<Sampler> {
        // SAFETY: gettid takes no arguments and cannot fail.
        let me = unsafe { libc::gettid() };
        Stat::open(me)?.read()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("weir-co-runners".into())
            .spawn(move || {
                if let Some(c) = core {
                    let _ = core_affinity::set_for_current(c);
                }
                sample(&probes, &flag)
            })
            .ok()?;
        Some(Sampler { stop, thread })
    }

    /// Stops the thread (within a window) and returns what it found.
    pub fn stop(self) -> Option<CoRunners> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().ok()
    }
}

/// Worker threads of this process not followed yet: `(tid, index)`.
fn scan_workers(known: &HashMap<i32, Worker>) -> Vec<(i32, usize)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if known.contains_key(&tid) {
            continue;
        }
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        if let Some(index) = comm.trim_end().strip_prefix(WORKER_PREFIX).and_then(|i| i.parse().ok()) {
            found.push((tid, index));
        }
    }
    found
}

fn sample(probes: &[(usize, i32)], stop: &AtomicBool) -> CoRunners {
    let mut probe_stats: Vec<(usize, Stat, u64)> = probes
        .iter()
        .filter_map(|&(core, tid)| {
            let mut s = Stat::open(tid)?;
            let (run, _) = s.read()?;
            Some((core, s, run))
        })
        .collect();
    let mut workers: HashMap<i32, Worker> = HashMap::new();
    let mut done = Windows::default();
    let mut seen = 0usize;
    let mut next_scan = 0;
    let mut tick = crate::lab::platform::monotonic_ns();
    loop {
        let now = crate::lab::platform::monotonic_ns();
        if now >= next_scan {
            for (tid, index) in scan_workers(&workers) {
                let Some(mut stat) = Stat::open(tid) else { continue };
                let Some((_, last_wait)) = stat.read() else { continue };
                seen += 1;
                let windows = Windows::default();
                workers.insert(
                    tid,
                    Worker {
                        stat,
                        index,
                        last_wait,
                        windows,
                    },
                );
            }
            next_scan = if workers.is_empty() { now } else { now + SCAN_NS };
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        tick += WINDOW_NS * (now.saturating_sub(tick) / WINDOW_NS + 1);
        crate::lab::platform::sleep_until(tick);
        // The probes' run time over this window, by core index.
        let mut probe_run: Vec<(usize, u64)> = Vec::with_capacity(probe_stats.len());
        for (core, s, last) in &mut probe_stats {
            if let Some((run, _)) = s.read() {
                probe_run.push((*core, run.saturating_sub(*last)));
                *last = run;
            }
        }
        workers.retain(|_, w| {
            let Some((_, wait)) = w.stat.read() else {
                // Exited.
                done.merge(&w.windows);
                return false;
            };
            let probe = probe_run.iter().find(|(c, _)| *c == w.index).map_or(0, |&(_, r)| r);
            w.windows.window(wait.saturating_sub(w.last_wait).saturating_sub(probe));
            w.last_wait = wait;
            true
        });
    }
    for w in workers.values() {
        done.merge(&w.windows);
    }
    CoRunners {
        windows: done.count,
        worst_us: done.worst as f64 / 1e3,
        total_ms: done.total as f64 / 1e6,
        workers: seen,
        window_ms: WINDOW_NS / 1_000_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn schedstat_texts_parse() {
        assert_eq!(parse_schedstat("183676334 14951972 346\n"), Some((183676334, 14951972)));
        assert_eq!(parse_schedstat("0 0 1\n"), Some((0, 0)));
        assert_eq!(parse_schedstat("12\n"), None);
        assert_eq!(parse_schedstat("a b c\n"), None);
    }

    #[test]
    fn only_windows_over_the_floor_count() {
        let mut w = Windows::default();
        for lost in [800_000, 30_000, 99_999, 100_000, 0, 2_500_000] {
            w.window(lost);
        }
        assert_eq!((w.count, w.worst, w.total), (3, 2_500_000, 3_400_000));
        let mut all = Windows::default();
        all.merge(&w);
        all.merge(&w);
        assert_eq!((all.count, all.worst, all.total), (6, 2_500_000, 6_800_000));
        let one = CoRunners {
            windows: 1,
            worst_us: 800.0,
            total_ms: 0.8,
            workers: 1,
            window_ms: 10,
        };
        let mut merged = one;
        merged.merge(&CoRunners::default());
        assert_eq!(merged, one);
        assert!(one.describe().contains("1 window of 10 ms"), "{}", one.describe());
    }

    /// A thread named as a worker and another spinning thread pinned to the
    /// same core: the scheduler shares the core between them, so the
    /// "worker" waits for whole slices of the other, and the sampler must
    /// report those windows. Exercises the whole path: finding the worker by
    /// name, reading its `schedstat`, the intervals and the result.
    #[test]
    fn a_thread_spinning_beside_a_worker_shows_as_lost_windows() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let core = core_affinity::get_core_ids().and_then(|ids| ids.first().copied());
        let stop = Arc::new(AtomicBool::new(false));
        let spin = |name: &str| {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    if let Some(c) = core {
                        let _ = core_affinity::set_for_current(c);
                    }
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
                .expect("spawn")
        };
        let sampler = Sampler::start(Vec::new(), None).expect("this kernel has schedstat");
        let threads = [spin("weir-worker-7"), spin("co-runner")];
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(400) {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().expect("spinner");
        }
        let r = sampler.stop().expect("a result");
        // Worker threads of other tests in this binary may be followed too.
        assert!(r.workers >= 1, "{r:?}");
        assert_eq!(r.window_ms, WINDOW_NS / 1_000_000);
        // Two spinners on one core for 400 ms: the worker waits about half
        // of it, about 5 ms of each 10 ms window. A tenth is a loose floor.
        assert!(r.windows >= 4 && r.total_ms >= 40.0, "{r:?}");
        assert!(r.worst_us >= 1000.0 && r.worst_us <= r.total_ms * 1e3, "{r:?}");
        assert!(r.describe().contains("to other threads"));
    }
}
