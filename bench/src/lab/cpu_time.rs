//! Where the probed cores' time went, from the kernel's per-CPU counters
//! (`/proc/stat`): how much the hypervisor took (steal) and how much went
//! to interrupts, read at the platform probe's start and stop.
//!
//! The probe's lateness says how late a `SCHED_FIFO` thread woke, not
//! why. On these guests the main why is **steal**: with both vCPUs busy
//! the host runs something else on them for milliseconds at a time (two
//! workers at 200,000 events/s: about 5% of the cores stolen and a
//! platform p99 of about 5 ms, against no steal and a platform p99 of tens
//! of µs with one worker and a quiet second core;
//! docs/notebook/benchmarks-2026-12.md, "The platform probe"). Reported
//! beside the probe, a user can tell a machine that took the cores away
//! from one that did not.
//!
//! What it does not say: which thread a core's time went to. A `SCHED_OTHER`
//! kernel thread (a `kworker`, DAMON's `kdamond`) that preempts a worker
//! delays its records, but the probe preempts such threads itself and does
//! not see it; that time is the core's `system` time here, mixed with
//! weir's own. [`crate::lab::co_runners`] measures it from the workers' side.
//! Linux only; elsewhere the figures are absent.

/// Cumulative time of one CPU, in the kernel's clock ticks (`USER_HZ`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTicks {
    /// Every state summed: user, nice, system, idle, iowait, irq, softirq,
    /// steal.
    pub total: u64,
    /// Time the hypervisor ran something else on this virtual CPU.
    pub steal: u64,
    /// Hardware and software interrupt handling.
    pub irq: u64,
}

impl CpuTicks {
    /// What accrued between `earlier` and `self` (counters only grow; a
    /// reset, such as a CPU taken offline and back, gives zeros).
    pub fn since(&self, earlier: &CpuTicks) -> CpuTicks {
        CpuTicks {
            total: self.total.saturating_sub(earlier.total),
            steal: self.steal.saturating_sub(earlier.steal),
            irq: self.irq.saturating_sub(earlier.irq),
        }
    }

    /// Adds `other`'s ticks (several runs or cores, one figure).
    pub fn add(&mut self, other: &CpuTicks) {
        self.total += other.total;
        self.steal += other.steal;
        self.irq += other.irq;
    }

    /// Steal as a percentage of the time counted; `None` without any.
    pub fn steal_pct(&self) -> Option<f64> {
        (self.total > 0).then(|| 100.0 * self.steal as f64 / self.total as f64)
    }

    /// Interrupts as a percentage of the time counted; `None` without any.
    pub fn irq_pct(&self) -> Option<f64> {
        (self.total > 0).then(|| 100.0 * self.irq as f64 / self.total as f64)
    }
}

/// Every CPU's counters now, by CPU number; `None` where `/proc/stat`
/// cannot be read or parsed.
pub fn read() -> Option<Vec<(usize, CpuTicks)>> {
    parse(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The `cpuN` lines of a `/proc/stat` text.
pub fn parse(text: &str) -> Option<Vec<(usize, CpuTicks)>> {
    let mut cpus = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(name) = fields.next() else { continue };
        let Some(Ok(cpu)) = name
            .strip_prefix("cpu")
            .filter(|n| !n.is_empty())
            .map(str::parse::<usize>)
        else {
            continue;
        };
        // user nice system idle iowait irq softirq steal [guest guest_nice]:
        // guest time is already counted in user and nice.
        let v: Vec<u64> = fields.take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
        if v.len() < 8 {
            return None;
        }
        cpus.push((
            cpu,
            CpuTicks {
                total: v.iter().sum(),
                steal: v[7],
                irq: v[5] + v[6],
            },
        ));
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// The counters of `cpu` in a [`read`] result.
pub fn of(cpus: &[(usize, CpuTicks)], cpu: usize) -> Option<CpuTicks> {
    cpus.iter().find(|(c, _)| *c == cpu).map(|(_, t)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "cpu  1446231 567 243660 689838 25032 0 10862 14329 0 0\n\
        cpu0 771715 221 103451 328209 2636 0 2539 6704 0 0\n\
        cpu1 674516 345 140209 361628 22396 0 8322 7625 0 0\n\
        intr 1 2 3\nctxt 99\n";
    const AFTER: &str = "cpu  1 1 1 1 1 1 1 1 0 0\n\
        cpu0 771815 221 103451 328209 2636 0 2539 6704 0 0\n\
        cpu1 674556 345 140219 361628 22396 10 8332 7655 0 0\n";

    #[test]
    fn parses_the_per_cpu_lines_and_skips_the_total() {
        let cpus = parse(BEFORE).unwrap();
        assert_eq!(cpus.len(), 2);
        let c1 = of(&cpus, 1).unwrap();
        assert_eq!(c1.steal, 7625);
        assert_eq!(c1.irq, 8322);
        assert_eq!(c1.total, 674516 + 345 + 140209 + 361628 + 22396 + 8322 + 7625);
        assert_eq!(of(&cpus, 2), None);
    }

    #[test]
    fn shares_of_an_interval() {
        let (a, b) = (parse(BEFORE).unwrap(), parse(AFTER).unwrap());
        let d0 = of(&b, 0).unwrap().since(&of(&a, 0).unwrap());
        assert_eq!((d0.total, d0.steal), (100, 0));
        assert_eq!(d0.steal_pct(), Some(0.0));
        let d1 = of(&b, 1).unwrap().since(&of(&a, 1).unwrap());
        // 40 user + 10 system + 10 irq + 10 softirq + 30 steal.
        assert_eq!((d1.total, d1.steal, d1.irq), (100, 30, 20));
        assert_eq!(d1.steal_pct(), Some(30.0));
        let mut both = d0;
        both.add(&d1);
        assert_eq!(both.steal_pct(), Some(15.0));
        assert_eq!(both.irq_pct(), Some(10.0));
        assert_eq!(CpuTicks::default().steal_pct(), None);
    }

    #[test]
    fn refuses_what_is_not_a_proc_stat() {
        assert_eq!(parse("intr 1 2\n"), None);
        assert_eq!(parse("cpu0 1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(parse("cpu0 1 2 3\n"), None);
        // This machine's own file parses (Linux).
        if cfg!(target_os = "linux") {
            assert!(read().is_some_and(|c| !c.is_empty()));
        }
    }
}
