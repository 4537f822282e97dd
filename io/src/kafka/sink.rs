//! The Kafka sinks: at-least-once through an idempotent producer on the
//! sink's own thread, exactly-once through the write-ahead log and one
//! transaction per completed checkpoint ([`super::target`]).
//!
//! Records reach both as [`super::framing`] bytes: the sink's `encode`
//! writes each record with [`super::framing::encode`] (key and value).

use std::sync::Arc;
use std::time::Instant;

use rdkafka::producer::{BaseRecord, Producer};

use super::delivery::{self, acknowledged, SinkProducer};
use super::framing::Records;
use super::sink_config::KafkaSinkConfig;
use super::target::KafkaTarget;
use crate::direct::{Appender, DirectFileSink};
use crate::wal::{WalSink, WalSinkConfig};
use crate::Result;

/// The at-least-once Kafka sink: a [`DirectFileSink`] whose thread
/// produces to a topic. See [`at_least_once`].
pub type KafkaAtLeastOnceSink<T, F, E> = DirectFileSink<T, F, E, KafkaAppender>;

/// The exactly-once Kafka sink: a [`WalSink`] publishing to a topic. See
/// [`exactly_once`].
pub type KafkaExactlyOnceSink<T, F, E> = WalSink<T, F, E, KafkaTarget>;

/// The at-least-once sink of `subtask`: an idempotent producer on the
/// sink's own thread. A hand-over of records (at most every 500 µs, or
/// more at once when the broker is slower) is produced, and is visible to
/// readers once the broker acknowledged it, which the sink waits for; a barrier's
/// acknowledgement waits for every record before it. After a failure the
/// source replays from the checkpoint: duplicates, never losses.
///
/// `encode(record, out)` writes the record with
/// [`super::framing::encode`]; `emitted_ns(record)` gives its emission time
/// (0: unknown).
pub fn at_least_once<T, F, E>(
    config: Arc<KafkaSinkConfig>,
    subtask: usize,
    encode: F,
    emitted_ns: E,
) -> KafkaAtLeastOnceSink<T, F, E>
where
    F: Fn(&T, &mut Vec<u8>),
    E: Fn(&T) -> u64,
{
    let slot = config.slot(subtask);
    DirectFileSink::with_appender(
        Box::new(move || KafkaAppender::new(config.clone(), slot)),
        encode,
        emitted_ns,
    )
}

/// The exactly-once sink of `subtask`: its records go to a write-ahead log
/// in `wal` (synced at each barrier, on the sink's log thread); each
/// completed checkpoint's records are published in one Kafka transaction
/// with the slot's marker ([`KafkaTarget`]), on the sink's committer
/// thread. A `read_committed` reader sees each record once, after its
/// checkpoint completed. `wal.target_dir` and `wal.suffix` are not used.
pub fn exactly_once<T, F, E>(
    config: Arc<KafkaSinkConfig>,
    wal: WalSinkConfig,
    subtask: usize,
    encode: F,
    emitted_ns: E,
) -> KafkaExactlyOnceSink<T, F, E>
where
    F: Fn(&T, &mut Vec<u8>),
    E: Fn(&T) -> u64,
{
    let slot = config.slot(subtask);
    WalSink::with_target(
        wal,
        subtask,
        Box::new(move || KafkaTarget::new(config.clone(), slot)),
        encode,
        emitted_ns,
    )
}

/// Produces a direct sink's hand-overs to a topic: every record sent, then
/// a wait for their delivery reports as they come (`io/src/kafka/delivery.rs`;
/// not `rdkafka`'s 100 ms `flush`), so a hand-over is visible
/// (acknowledged by the broker) when [`Appender::append`] returns.
pub struct KafkaAppender {
    config: Arc<KafkaSinkConfig>,
    slot: usize,
    producer: Option<SinkProducer>,
}

impl std::fmt::Debug for KafkaAppender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaAppender")
            .field("topic", &self.config.topic)
            .field("slot", &self.slot)
            .finish()
    }
}

impl KafkaAppender {
    /// Produces for `slot` (not connected yet).
    pub fn new(config: Arc<KafkaSinkConfig>, slot: usize) -> Self {
        KafkaAppender {
            config,
            slot,
            producer: None,
        }
    }
}

impl Drop for KafkaAppender {
    fn drop(&mut self) {
        // Destroying the producer joins librdkafka's threads, which may
        // wait for a broker that is gone: not on the sink's thread, which
        // the sink's owner joins. Every hand-over it acknowledged was
        // flushed; what it did not is replayed from the checkpoint.
        if let Some(producer) = self.producer.take() {
            super::drop_detached(producer, "producer");
        }
    }
}

impl Appender for KafkaAppender {
    fn describe(&self) -> String {
        format!("kafka-{}-{}", self.config.topic, self.slot)
    }

    fn open(&mut self) -> Result<()> {
        let c = &self.config;
        c.validate()?;
        c.ensure_topic(&c.topic, c.partitions, false, false)?;
        self.producer = Some(c.producer(None)?);
        Ok(())
    }

    fn append(&mut self, buf: &[u8]) -> Result<()> {
        let c = &self.config;
        let producer = self.producer.as_ref().expect("opened before the first append");
        let deadline = Instant::now() + c.timeout;
        for r in Records::new(buf) {
            let (k, v) = r.map_err(|at| {
                c.topic_error(
                    &c.topic,
                    format!(
                        "slot {}: the sink's encode wrote bytes that are not whole records (at byte {at}); \
                         write each record with weir_io::kafka::framing::encode",
                        self.slot
                    ),
                )
            })?;
            delivery::send(producer, BaseRecord::to(&c.topic).key(k).payload(v), deadline)
                .map_err(|e| c.error(&c.topic, format!("produce (slot {})", self.slot), e))?;
        }
        if !acknowledged(producer, deadline) {
            return Err(c.topic_error(
                &c.topic,
                format!(
                    "slot {}: the broker did not acknowledge {} record(s) within {:?}; the job fails and restarts \
                     from its last checkpoint, which sends them again",
                    self.slot,
                    producer.context().unacknowledged(),
                    c.timeout
                ),
            ));
        }
        // Every record sent has its delivery report now.
        if let Some((n, first)) = producer.context().failures() {
            return Err(c.topic_error(
                &c.topic,
                format!(
                    "slot {}: {n} record(s) were not delivered (first: {first}); the job fails and restarts from its \
                     last checkpoint, which sends them again",
                    self.slot
                ),
            ));
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        // Every append was acknowledged (by all in-sync replicas).
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::framing::encode;
    use std::time::Duration;

    /// A record the client gives up on fails the append: its delivery
    /// report settles it, delivered or not.
    #[test]
    fn an_undelivered_record_fails_the_append() {
        let mut config = KafkaSinkConfig::new("127.0.0.1:1", "out");
        config.timeout = Duration::from_secs(20);
        // No broker listens at port 1: each record times out after 300 ms.
        config.properties.push(("message.timeout.ms".into(), "300".into()));
        let config = Arc::new(config);
        let mut a = KafkaAppender::new(config.clone(), 0);
        // As `open` does, without its topic check (it needs a broker).
        a.producer = Some(config.producer(None).unwrap());
        let mut buf = Vec::new();
        encode(b"k", b"1,1", &mut buf);
        encode(b"k", b"1,2", &mut buf);
        let start = Instant::now();
        let e = a.append(&buf).unwrap_err().to_string();
        assert!(e.contains("2 record(s) were not delivered"), "{e}");
        assert!(e.contains("slot 0"), "{e}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "failed at the records' timeout, not the call's"
        );
    }
}
