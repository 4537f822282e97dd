//! Where a record's time goes from the load generator through weir to a
//! `read_committed` reader, in `weir bench --source kafka --sink kafka`'s
//! open loop: one histogram per part, each part the difference of two
//! instants of the same record.
//!
//! Why: the visible latency alone says a record is late, not where. A
//! record carries its scheduled send `S` in its input value; the broker
//! stamps its append `A1` (both topics are created with
//! `message.timestamp.type=LogAppendTime`); the source's poll `P` and the
//! sink's write `W` go into its output value; the broker stamps the output
//! record's append `A2`; the reader sees it at `R`. The parts:
//!
//! | part | from, to | what it holds |
//! |---|---|---|
//! | generator → broker | `S`, `A1` | the load generator's `linger.ms`, its produce request |
//! | broker → source | `A1`, `P` | the source's fetch, and the wait for a worker's poll |
//! | source → sink | `P`, `W` | the job: exchange, keyed count |
//! | sink → output append | `W`, `A2` | exactly-once: the wait for the checkpoint's completion, then the transaction's produce; at-least-once: the hand-over and the produce |
//! | output append → visible | `A2`, `R` | exactly-once: the rest of the transaction and its commit, then the reader's fetch; at-least-once: the acknowledgement and the reader's fetch |
//!
//! `A1` and `A2` are wall-clock milliseconds (the broker's resolution),
//! turned into [`clock`] time by one offset taken at the start: the parts
//! next to them are exact to about a millisecond, and one ending at a
//! truncated stamp can read up to 1 ms short (never below zero here).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use weir_core::clock;

use crate::lab::report::Percentiles;

/// Converts the broker's wall-clock milliseconds to [`clock`] nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    /// Wall-clock nanoseconds minus [`clock::now_ns`], read together.
    offset_ns: i128,
}

impl WallClock {
    /// The offset now.
    pub fn now() -> Self {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        WallClock {
            offset_ns: wall - clock::now_ns() as i128,
        }
    }

    /// A broker timestamp (epoch milliseconds) on [`clock`]; `None` before
    /// the clock's origin or without a stamp.
    pub fn of_ms(&self, ms: Option<i64>) -> Option<u64> {
        let ns = ms? as i128 * 1_000_000 - self.offset_ns;
        u64::try_from(ns).ok()
    }
}

/// An empty histogram of the benchmark's Kafka latencies: 1 µs to 600 s,
/// nanoseconds (the visible latency and every part).
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1_000, 600_000_000_000, 3).expect("valid bounds")
}

/// Records `to - from` (at least 1 µs; 0 when `to` is earlier: a stamp
/// truncated to the millisecond).
pub(crate) fn record(h: &mut Histogram<u64>, from: u64, to: u64) {
    h.saturating_record(to.saturating_sub(from).max(1_000));
}

/// The two parts before the job, as one source subtask's parse function
/// sees them; merged into the shared total when the source is dropped.
pub struct InputParts {
    wall: WallClock,
    record_from_ns: Arc<AtomicU64>,
    generator_to_broker: Histogram<u64>,
    broker_to_source: Histogram<u64>,
    total: Arc<Mutex<(Histogram<u64>, Histogram<u64>)>>,
}

impl InputParts {
    /// A recorder for one source subtask, adding to `total` when dropped;
    /// records of scheduled sends before `record_from_ns` (the warm-up,
    /// set once the job is up) are not recorded.
    pub fn new(
        wall: WallClock,
        record_from_ns: Arc<AtomicU64>,
        total: Arc<Mutex<(Histogram<u64>, Histogram<u64>)>>,
    ) -> Self {
        InputParts {
            wall,
            record_from_ns,
            generator_to_broker: histogram(),
            broker_to_source: histogram(),
            total,
        }
    }

    /// The shared total both parts are merged into.
    pub fn total() -> Arc<Mutex<(Histogram<u64>, Histogram<u64>)>> {
        Arc::new(Mutex::new((histogram(), histogram())))
    }

    /// A record scheduled at `scheduled_ns` (0: closed loop, not
    /// recorded), appended at `append_ms`, polled at `polled_ns`.
    pub fn see(&mut self, scheduled_ns: u64, append_ms: Option<i64>, polled_ns: u64) {
        if scheduled_ns == 0 || scheduled_ns < self.record_from_ns.load(Ordering::Relaxed) {
            return;
        }
        if let Some(a1) = self.wall.of_ms(append_ms) {
            record(&mut self.generator_to_broker, scheduled_ns, a1);
            record(&mut self.broker_to_source, a1, polled_ns);
        }
    }
}

impl Drop for InputParts {
    fn drop(&mut self) {
        let mut t = self.total.lock().unwrap_or_else(|p| p.into_inner());
        let _ = t.0.add(&self.generator_to_broker);
        let _ = t.1.add(&self.broker_to_source);
    }
}

/// The parts after the job's source, as the reader sees each record.
pub struct OutputParts {
    wall: WallClock,
    source_to_sink: Histogram<u64>,
    sink_to_append: Histogram<u64>,
    append_to_visible: Histogram<u64>,
}

impl OutputParts {
    /// Empty.
    pub fn new(wall: WallClock) -> Self {
        OutputParts {
            wall,
            source_to_sink: histogram(),
            sink_to_append: histogram(),
            append_to_visible: histogram(),
        }
    }

    /// A record polled at `polled_ns`, written by the sink at
    /// `written_ns`, appended to the output at `append_ms`, read at
    /// `read_ns`.
    pub fn see(&mut self, polled_ns: u64, written_ns: u64, append_ms: Option<i64>, read_ns: u64) {
        record(&mut self.source_to_sink, polled_ns, written_ns);
        if let Some(a2) = self.wall.of_ms(append_ms) {
            record(&mut self.sink_to_append, written_ns, a2);
            record(&mut self.append_to_visible, a2, read_ns);
        }
    }
}

/// A record's time from the load generator to the reader, in parts
/// (microseconds; open loop, after the warm-up). See the module docs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KafkaParts {
    /// Scheduled send to the input's append.
    pub generator_to_broker_us: Percentiles,
    /// The input's append to the source's poll.
    pub broker_to_source_us: Percentiles,
    /// The source's poll to the sink's write.
    pub source_to_sink_us: Percentiles,
    /// The sink's write to the output's append.
    pub sink_to_append_us: Percentiles,
    /// The output's append to the reader.
    pub append_to_visible_us: Percentiles,
    /// Exactly-once: per transaction, `begin_transaction` to the return of
    /// `commit_transaction`.
    pub transaction_us: Option<Percentiles>,
    /// Exactly-once: per transaction, the `commit_transaction` call alone.
    pub commit_call_us: Option<Percentiles>,
    /// Exactly-once: transactions committed.
    pub transactions: Option<u64>,
}

impl KafkaParts {
    /// The parts of a run: the sources' (`input`), the reader's
    /// (`output`), and the sink's transactions (exactly-once).
    pub fn of(
        input: &(Histogram<u64>, Histogram<u64>),
        output: &OutputParts,
        sink: Option<&weir_io::kafka::KafkaSinkStats>,
    ) -> Self {
        KafkaParts {
            generator_to_broker_us: Percentiles::from_ns(&input.0),
            broker_to_source_us: Percentiles::from_ns(&input.1),
            source_to_sink_us: Percentiles::from_ns(&output.source_to_sink),
            sink_to_append_us: Percentiles::from_ns(&output.sink_to_append),
            append_to_visible_us: Percentiles::from_ns(&output.append_to_visible),
            transaction_us: sink.map(|s| Percentiles::from_ns(&s.publish_ns())),
            commit_call_us: sink.map(|s| Percentiles::from_ns(&s.commit_ns())),
            transactions: sink.map(|s| s.transactions()),
        }
    }

    /// One line: each part's p50 / p99 in milliseconds.
    pub fn line(&self) -> String {
        let ms = |p: &Percentiles| format!("{:.1} / {:.1}", p.p50 / 1e3, p.p99 / 1e3);
        let mut s = format!(
            "parts p50 / p99 ms: generator→broker {}, broker→source {}, source→sink {}, sink→output append {}, \
             output append→visible {}",
            ms(&self.generator_to_broker_us),
            ms(&self.broker_to_source_us),
            ms(&self.source_to_sink_us),
            ms(&self.sink_to_append_us),
            ms(&self.append_to_visible_us),
        );
        if let (Some(t), Some(c), Some(n)) = (&self.transaction_us, &self.commit_call_us, self.transactions) {
            s += &format!("; {n} transactions: begin→committed {}, commit call {}", ms(t), ms(c));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_stamps_come_back_on_the_clock() {
        // A stamp truncated to its millisecond may fall before the clock's
        // origin when the origin is that recent.
        let _ = clock::now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let w = WallClock::now();
        let now = clock::now_ns();
        let wall_ms = (SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()) as i64;
        let back = w.of_ms(Some(wall_ms)).expect("after the origin");
        // Truncated to the millisecond, read a moment later.
        assert!(back + 2_000_000 > now && back < now + 50_000_000, "{back} vs {now}");
        assert_eq!(w.of_ms(None), None);
        assert_eq!(w.of_ms(Some(0)), None, "before the clock's origin");
    }

    #[test]
    fn parts_are_differences_of_one_records_instants() {
        let w = WallClock { offset_ns: 0 };
        let total = InputParts::total();
        {
            let mut p = InputParts::new(w, Arc::new(AtomicU64::new(1_000_000)), total.clone());
            p.see(5_000_000, Some(7), 9_500_000);
            p.see(0, Some(7), 9_500_000); // closed loop: not recorded
            p.see(500_000, Some(7), 9_500_000); // warm-up: not recorded
        }
        let t = total.lock().unwrap();
        assert_eq!(t.0.len(), 1);
        assert!((1_999_000..=2_001_000).contains(&t.0.max()), "{}", t.0.max());
        assert!((2_499_000..=2_501_000).contains(&t.1.max()), "{}", t.1.max());
        let mut o = OutputParts::new(w);
        o.see(10_000_000, 10_400_000, Some(12), 12_300_000);
        assert!((399_000..=401_000).contains(&o.source_to_sink.max()));
        assert!((1_599_000..=1_601_000).contains(&o.sink_to_append.max()));
        assert!((299_000..=301_000).contains(&o.append_to_visible.max()));
        // A stamp truncated below its start counts as the smallest value.
        o.see(10_000_000, 12_500_000, Some(12), 13_000_000);
        assert_eq!(o.sink_to_append.len(), 2);
        assert_eq!(
            o.sink_to_append.count_between(0, 1_000),
            1,
            "recorded as 1 µs, not dropped"
        );
    }
}
