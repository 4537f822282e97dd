//! Waiting for a producer's delivery reports without `flush`.
//!
//! Why it exists: `rdkafka`'s `flush` (0.39), when records are still in
//! flight, serves the client's event queue with `poll(min(timeout, 100
//! ms))`, and that `poll` returns only when its time is up, not when the
//! last report arrived. Every flush with records in flight therefore
//! took at least 100 ms, and so did every `commit_transaction`, which
//! calls it. The at-least-once sink flushed each hand-over and the
//! exactly-once sink committed each checkpoint that way: both sinks'
//! visibility latency had a 100 ms floor and their throughput a ceiling
//! set by it (docs/notebook/benchmarks-2026-12.md, "The 100 ms flush and
//! the fetch backoff").
//!
//! Here a [`ThreadedProducer`]'s own thread serves the reports as they
//! arrive, and [`Deliveries`] counts them; a sink's thread that needs its
//! records acknowledged waits on a condition variable until the count
//! reaches what it sent ([`Deliveries::wait_for`]), woken by the report
//! that completes it.
//!
//! Invariants:
//! - `settled` only grows, by one per delivery report (delivered or not);
//!   a report comes exactly once per record the client accepted.
//! - A waiter stores its target before it checks `settled` under the lock;
//!   the report that reaches the target takes the lock to notify. So a
//!   report cannot slip between the waiter's check and its wait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::error::KafkaResult;
use rdkafka::message::ToBytes;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};

use super::sink_config::queue_full;

/// A sink's producer: librdkafka's, with a thread of the `rdkafka` crate's
/// that serves delivery reports into [`Deliveries`].
pub(crate) type SinkProducer = ThreadedProducer<Deliveries>;

/// Sees every record's delivery report, on the producer's polling thread.
/// A record the client gave up on (its `message.timeout.ms` passed, a
/// non-retriable error) is counted, and the first reason kept: a sink that
/// only waited for its queue to drain would lose such records silently.
#[derive(Default)]
pub(crate) struct Deliveries {
    failed: AtomicU64,
    first: Mutex<Option<String>>,
    /// Records the client accepted ([`send`]).
    sent: AtomicU64,
    /// Reports seen, delivered or not.
    settled: AtomicU64,
    /// The count a waiter waits for (0: nobody waits).
    target: AtomicU64,
    lock: Mutex<()>,
    reached: Condvar,
}

impl ClientContext for Deliveries {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        super::log_to_tracing(level, fac, log_message);
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_none() {
                *first = Some(format!("partition {}: {e}", rdkafka::message::Message::partition(m)));
            }
        }
        self.settle();
    }
}

impl Deliveries {
    /// Counts one report, and wakes a waiter whose count it completes.
    fn settle(&self) {
        let n = self.settled.fetch_add(1, Ordering::SeqCst) + 1;
        let target = self.target.load(Ordering::SeqCst);
        if target != 0 && n >= target {
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.reached.notify_all();
        }
    }

    /// Records not delivered so far, and the first one's reason.
    pub(crate) fn failures(&self) -> Option<(u64, String)> {
        let n = self.failed.load(Ordering::Relaxed);
        (n > 0).then(|| {
            let first = self.first.lock().unwrap_or_else(|p| p.into_inner());
            (n, first.clone().unwrap_or_default())
        })
    }

    /// Reports seen so far, delivered or not.
    fn settled(&self) -> u64 {
        self.settled.load(Ordering::SeqCst)
    }

    /// Records accepted and not yet reported on.
    pub(crate) fn unacknowledged(&self) -> u64 {
        self.sent.load(Ordering::Relaxed).saturating_sub(self.settled())
    }

    /// Waits until `sent` reports were seen in all (the producer's count of
    /// records it accepted), or until `deadline`. True if they were.
    pub(crate) fn wait_for(&self, sent: u64, deadline: Instant) -> bool {
        if self.settled() >= sent {
            return true;
        }
        self.target.store(sent, Ordering::SeqCst);
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let done = loop {
            if self.settled() >= sent {
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            g = self
                .reached
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        drop(g);
        self.target.store(0, Ordering::SeqCst);
        done
    }
}

/// Sends `record`, waiting until `deadline` for room in the client's
/// queue (its own thread frees room as reports arrive), and counts it for
/// [`acknowledged`].
pub(crate) fn send<K, P>(
    producer: &SinkProducer,
    mut record: BaseRecord<'_, K, P>,
    deadline: Instant,
) -> KafkaResult<()>
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => {
                producer.context().sent.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Err((e, back)) if queue_full(&e) && Instant::now() < deadline => {
                record = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Waits until every record [`send`] gave `producer` has its delivery
/// report, and the client let go of them all (its queue is empty: a
/// `commit_transaction` then finds nothing to flush and does not wait).
/// False if `deadline` passed first.
pub(crate) fn acknowledged(producer: &SinkProducer, deadline: Instant) -> bool {
    let sent = producer.context().sent.load(Ordering::Relaxed);
    if !producer.context().wait_for(sent, deadline) {
        return false;
    }
    // The client frees a report's records just after the last callback of
    // that report returned: microseconds.
    while producer.in_flight_count() > 0 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(20));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_waiter_wakes_when_the_last_report_arrives() {
        let d = Arc::new(Deliveries::default());
        let far = Instant::now() + Duration::from_secs(30);
        assert!(d.wait_for(0, far), "nothing sent: nothing to wait for");
        let reporter = {
            let d = d.clone();
            std::thread::spawn(move || {
                for i in 0..1000 {
                    if i % 100 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    d.settle();
                }
            })
        };
        let start = Instant::now();
        assert!(d.wait_for(1000, far));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "woken by the report, not the deadline"
        );
        reporter.join().unwrap();
        assert_eq!(d.target.load(Ordering::SeqCst), 0, "no waiter left behind");
    }

    #[test]
    fn a_waiter_gives_up_at_its_deadline() {
        let d = Deliveries::default();
        let start = Instant::now();
        assert!(!d.wait_for(1, start + Duration::from_millis(50)));
        assert!(start.elapsed() >= Duration::from_millis(50));
    }
}
