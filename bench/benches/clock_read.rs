//! What a clock reading costs here, and which readings keep their order
//! across cores: `weir_core::clock::now_ns` (`Instant::now`, the vDSO)
//! against a bare `rdtsc` (what a TSC clock such as `quanta` reads) and
//! `lfence; rdtsc` (the same, ordered behind earlier loads).
//!
//! A worker reads the clock about a dozen times per 1,024 records, so a
//! reading's cost is a per-batch cost. The order matters more: a sink
//! subtracts a source's stamp taken on another core. The second part has
//! core 0 publish readings without pause and core 1 load the latest and
//! read its own clock at once; a reading that comes out smaller than the
//! one it loaded is counted (`clock::tests::readings_order_across_threads`
//! asserts there is none for `now_ns`).
//!
//! `cargo bench -p weir-bench --bench clock_read`

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Instant;

    const READS: u64 = 5_000_000;

    /// A clock to compare: its name, its reading, and its units per ns.
    type Clock = (&'static str, fn() -> u64, f64);
    const LOADS: u64 = 2_000_000;

    fn rdtsc() -> u64 {
        // SAFETY: every x86_64 CPU has RDTSC; it reads a counter and has
        // no other effect.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    fn fenced_rdtsc() -> u64 {
        // SAFETY: LFENCE is part of SSE2, which every x86_64 CPU has; it
        // only orders execution.
        unsafe { core::arch::x86_64::_mm_lfence() };
        rdtsc()
    }

    /// Nanoseconds per reading of `read`.
    fn cost(read: fn() -> u64) -> f64 {
        let start = Instant::now();
        let mut sum = 0u64;
        for _ in 0..READS {
            sum = sum.wrapping_add(read());
        }
        std::hint::black_box(sum);
        start.elapsed().as_nanos() as f64 / READS as f64
    }

    /// Of `LOADS` readings taken on core 1 right after loading core 0's
    /// latest: how many came out smaller, and by at most how many units.
    fn out_of_order(read: fn() -> u64) -> (u64, u64) {
        let (stamp, done) = (&AtomicU64::new(0), &AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(move || {
                core_affinity::set_for_current(core_affinity::CoreId { id: 0 });
                while !done.load(Ordering::Relaxed) {
                    stamp.store(read(), Ordering::Release);
                }
            });
            let reader = s.spawn(move || {
                core_affinity::set_for_current(core_affinity::CoreId { id: 1 });
                let (mut count, mut worst) = (0u64, 0u64);
                for _ in 0..LOADS {
                    let theirs = stamp.load(Ordering::Acquire);
                    let ours = read();
                    if theirs != 0 && ours < theirs {
                        count += 1;
                        worst = worst.max(theirs - ours);
                    }
                }
                done.store(true, Ordering::Relaxed);
                (count, worst)
            });
            reader.join().expect("the reader does not panic")
        })
    }

    pub fn main() {
        // TSC ticks per ns, to print the TSC's out-of-order gaps in ns.
        let (t0, i0) = (rdtsc(), Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(100));
        let ticks_per_ns = (rdtsc() - t0) as f64 / i0.elapsed().as_nanos() as f64;
        let clocks: [Clock; 3] = [
            ("clock::now_ns (Instant::now)", weir_core::clock::now_ns, 1.0),
            ("rdtsc", rdtsc, ticks_per_ns),
            ("lfence; rdtsc", fenced_rdtsc, ticks_per_ns),
        ];
        println!("clock                          ns/read   out of order (core 1 after core 0's, of {LOADS})");
        for round in 0..3 {
            for (name, read, per_ns) in clocks {
                let ns = cost(read);
                let two_cores = core_affinity::get_core_ids().unwrap_or_default().len() >= 2;
                let order = if two_cores {
                    let (count, worst) = out_of_order(read);
                    format!("{count:>7}, up to {:.0} ns", worst as f64 / per_ns)
                } else {
                    "(one core)".to_string()
                };
                println!("{name:<30} {ns:>7.1}   {order}   (round {round})");
            }
        }
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    x86::main();
    #[cfg(not(target_arch = "x86_64"))]
    println!("clock_read compares x86_64 counter reads");
}
