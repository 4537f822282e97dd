//! The exactly-once Kafka sink's target: a completed checkpoint's epochs,
//! from the sink's write-ahead log, published to the output topic in one
//! Kafka transaction together with a marker record that says so.
//!
//! Why this design (and not Flink's, which keeps a transaction open from
//! one checkpoint to the next and resumes it after a crash by its producer
//! id and epoch, through reflection on the Java client): librdkafka cannot
//! resume a transaction, and a transaction open across a checkpoint
//! interval can be aborted by the broker's timeout, losing its records.
//! Here the records are durable in the sink's own log at the barrier, and
//! a transaction is open only while a completed checkpoint is published:
//!
//! - **open**: each sink slot has [`PRODUCERS_PER_SLOT`] fixed
//!   `transactional.id`s, one per producer. `init_transactions` on each
//!   fences an older producer with that id (a zombie of a previous attempt
//!   or process) and completes or aborts the transaction it left open.
//!   Only then is the slot's marker read with `read_committed` to the end
//!   of its partition of the marker topic: the last checkpoint (and log
//!   position) whose publication committed.
//! - **producers in turn**: consecutive publishes use the slot's producers
//!   in turn. A transaction's `commit_transaction` returns once the
//!   coordinator has logged the decision; it writes the commit markers
//!   into the partitions after that, and until it is done it answers the
//!   *same* id's next `AddPartitionsToTxn` with `CONCURRENT_TRANSACTIONS`,
//!   which librdkafka retries about 20 ms later. With one producer, a
//!   publish that followed the previous one at once (a checkpoint held
//!   back behind it) waited those 20 ms in 10-30% of the transactions at a
//!   10 ms interval (docs/notebook/benchmarks-2026-12.md, "Kafka to Kafka:
//!   where a transaction's time goes"). Publishes stay sequential (one in
//!   flight per slot), so the markers of the slot's producers land in its
//!   partition in commit order, and the last committed one is the newest.
//! - **publish** (checkpoint `n` complete): `begin_transaction`, the
//!   records of every epoch up to `n` not yet published, the marker record
//!   `(slot, n, log position)`, `commit_transaction`. A reader with
//!   `read_committed` sees all of it or none of it.
//! - **coalescing**: one transaction is in flight per slot
//!   ([`EpochTarget::COMMITS_IN_FLIGHT`] = 1); the checkpoints that
//!   complete meanwhile are held back by the sink and published together
//!   in the next transaction, their records in log order and one marker
//!   naming the newest of them, at most [`MAX_CHECKPOINTS_PER_TRANSACTION`]
//!   checkpoints and [`MAX_TRANSACTION_BYTES`] bytes of records per
//!   transaction (more go in the following ones). So the checkpoint rate
//!   is not bounded by the transaction rate. The marker still means
//!   "published through checkpoint `n`, up to log position `p`": a
//!   transaction holds exactly the log between the previous marker's
//!   position and its own, so recovery needs to know nothing else about
//!   which checkpoints it covered
//!   (docs/design/kafka-sink.md#coalesced-transactions).
//! - **restore** (the WAL sink's, see [`crate::wal`]): epochs after the
//!   marker up to the restored checkpoint are published again, in one new
//!   transaction; later ones are dropped from the log.
//! - **an unknown outcome** (a commit that timed out, a fatal error): the
//!   sink fails, the job restarts, and the next `open` settles it: the
//!   transaction was committed (the marker shows it) or aborted by
//!   `init_transactions` (the marker does not, and the restore publishes
//!   the epochs again).
//!
//! No transaction stays open between checkpoints, none lingers after a
//! restart, and a transaction timeout never loses data (the log holds the
//! records until a marker covers them).

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use weir_core::clock;

use super::delivery::{self, acknowledged, SinkProducer};
use super::framing::Records;
use super::sink_config::KafkaSinkConfig;
use crate::wal::codec::WalPos;
use crate::wal::{Committed, EpochTarget};
use crate::{Error, Result};

/// Transactional producers per sink slot, used in turn by consecutive
/// publishes: 2 (see the module docs: the next transaction never waits
/// for the coordinator to finish the previous one's commit markers).
pub const PRODUCERS_PER_SLOT: usize = 2;

/// Completed checkpoints published in one Kafka transaction at most: 64.
/// When more are held back (the broker was slow), they go in several
/// transactions, each with its own marker. Bounds the work one transaction
/// does, so that it ends well within the transaction timeout.
pub const MAX_CHECKPOINTS_PER_TRANSACTION: usize = 64;

/// Bytes of records (keys and values) beyond which a transaction takes no
/// further checkpoint: 16 MiB. Checked after each checkpoint's records (a
/// checkpoint's records are never split), so a transaction holds at most
/// this plus one checkpoint's output. At the tens of MB/s a broker here
/// takes, such a transaction commits in about a second, far below the
/// transaction timeout (60 s by default).
pub const MAX_TRANSACTION_BYTES: u64 = 16 << 20;

/// Marker record value: magic, then epoch, segment, offset (u64 LE), then
/// a CRC-32 of the 28 bytes before it (u32 LE): a marker decides what a
/// restore publishes again, so it is verified like every byte weir reads
/// back, whatever the broker and client checked on the way.
const MARKER_MAGIC: &[u8; 4] = b"WKM2";
/// The first format's magic (no checksum), refused with its own message.
const MARKER_MAGIC_V1: &[u8; 4] = b"WKM1";
/// Bytes of a marker record's value.
pub const MARKER_BYTES: usize = 4 + 24 + 4;

/// Encodes a marker record's value.
pub(crate) fn encode_marker(c: Committed) -> [u8; MARKER_BYTES] {
    let mut v = [0u8; MARKER_BYTES];
    v[..4].copy_from_slice(MARKER_MAGIC);
    v[4..12].copy_from_slice(&c.epoch.to_le_bytes());
    v[12..20].copy_from_slice(&c.pos.seg.to_le_bytes());
    v[20..28].copy_from_slice(&c.pos.off.to_le_bytes());
    let crc = crc32fast::hash(&v[..28]);
    v[28..].copy_from_slice(&crc.to_le_bytes());
    v
}

/// Decodes and verifies a marker record's value; why it is not a valid
/// one otherwise (the byte offset in the value, and the reason).
pub(crate) fn decode_marker(v: &[u8]) -> std::result::Result<Committed, (usize, String)> {
    if v.starts_with(MARKER_MAGIC_V1) {
        return Err((
            0,
            "a marker of an earlier weir's format (WKM1, without a checksum): restore with that \
             version, or start the sink with a new marker topic"
                .into(),
        ));
    }
    if v.len() != MARKER_BYTES || !v.starts_with(MARKER_MAGIC) {
        return Err((
            0,
            format!(
                "not a weir marker record ({} bytes, expected {MARKER_BYTES} starting WKM2)",
                v.len()
            ),
        ));
    }
    let stored = u32::from_le_bytes(v[28..].try_into().expect("4 bytes"));
    let computed = crc32fast::hash(&v[..28]);
    if stored != computed {
        return Err((
            28,
            format!("checksum mismatch (stored {stored:08x}, computed {computed:08x}): the marker is damaged"),
        ));
    }
    let u = |i: usize| u64::from_le_bytes(v[i..i + 8].try_into().expect("8 bytes"));
    Ok(Committed {
        epoch: u(4),
        pos: WalPos { seg: u(12), off: u(20) },
    })
}

/// The key of `slot`'s marker records (compaction keeps the last one).
pub(crate) fn marker_key(slot: usize) -> String {
    format!("slot-{slot}")
}

/// Reads `slot`'s last committed marker: `read_committed`, from the start
/// of its partition of the marker topic to the end.
pub fn read_marker(config: &KafkaSinkConfig, slot: usize) -> Result<Option<Committed>> {
    let topic = &config.marker_topic;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &config.brokers)
        .set("group.id", format!("{}-marker-reader", config.transactional_id_prefix))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        // A fetch that finds nothing new answers at once, not after the
        // default 500 ms: the read to the end took 1.0 s of every sink start
        // (and restart) with it, 0.5 s without.
        .set("fetch.wait.max.ms", "10")
        // The client verifies the record batches' CRC-32C too (a few
        // markers: nothing to save by skipping it).
        .set("check.crcs", "true")
        .create()
        .map_err(|e| config.error(topic, "create the marker reader", e))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, slot as i32, Offset::Beginning)
        .map_err(|e| config.error(topic, format!("assign partition {slot}"), e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| config.error(topic, format!("assign partition {slot}"), e))?;
    let last = read_to_end(config, slot, &consumer);
    // Its close (it has a group) would wait for librdkafka without a bound.
    super::drop_detached(consumer, "marker-reader");
    last
}

/// The last marker of `slot` that `consumer` (assigned to the slot's
/// partition, from its start) reads before the end of the partition, within
/// the sink's call timeout.
fn read_to_end(config: &KafkaSinkConfig, slot: usize, consumer: &BaseConsumer) -> Result<Option<Committed>> {
    let topic = &config.marker_topic;
    let key = marker_key(slot);
    let deadline = Instant::now() + config.timeout;
    let mut last = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(config.topic_error(
                topic,
                format!(
                    "partition {slot}: the end of the slot's markers was not reached in {:?}; is the broker up?",
                    config.timeout
                ),
            ));
        }
        match consumer.poll(left.min(Duration::from_millis(200))) {
            None => {}
            Some(Ok(m)) if m.key() == Some(key.as_bytes()) => {
                let v = m.payload().unwrap_or_default();
                let c = decode_marker(v).map_err(|(at, reason)| {
                    config.topic_error(
                        topic,
                        format!(
                            "partition {slot}, offset {}, byte {at} of the record's value: {reason}",
                            m.offset()
                        ),
                    )
                })?;
                last = Some(c);
            }
            Some(Ok(_)) => {}
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(last),
            // A dropped connection: librdkafka reconnects, within `left`.
            Some(Err(e)) if super::is_transient(&e) => {}
            Some(Err(e)) => return Err(config.error(topic, format!("read partition {slot}"), e)),
        }
    }
}

/// One of a slot's transactional producers.
struct TxnProducer {
    /// Its `transactional.id`.
    id: String,
    producer: Arc<SinkProducer>,
    /// Runs `begin_transaction` with a bound on the wait (`None` after a
    /// call that did not return in time).
    beginner: Option<Beginner>,
    in_transaction: bool,
}

impl TxnProducer {
    /// Creates the producer of `id` and fences its older incarnations:
    /// `init_transactions` completes or aborts what they left open.
    fn open(config: &KafkaSinkConfig, slot: usize, id: String) -> Result<Self> {
        let producer = config.producer(Some(&id))?;
        let error = |what: &str, e: KafkaError| {
            config.error(&config.topic, format!("{what} (slot {slot}, transactional id {id})"), e)
        };
        producer
            .init_transactions(config.timeout)
            .map_err(|e| error("initialize transactions", e))?;
        let producer = Arc::new(producer);
        let p = producer.clone();
        let beginner = Beginner::spawn(move || p.begin_transaction(), slot).map_err(|e| {
            config.topic_error(
                &config.topic,
                format!("slot {slot}: cannot start a thread for the producer {id}: {e}"),
            )
        })?;
        Ok(TxnProducer {
            id,
            producer,
            beginner: Some(beginner),
            in_transaction: false,
        })
    }
}

/// The exactly-once Kafka sink's [`EpochTarget`] for one slot; see the
/// module docs. Made per start of a sink subtask, opened on the sink's
/// threads.
pub struct KafkaTarget {
    config: Arc<KafkaSinkConfig>,
    slot: usize,
    /// The slot's producers (empty before `open`).
    producers: Vec<TxnProducer>,
    /// The producer of the next (or open) transaction.
    current: usize,
    epochs: Vec<u64>,
    /// When the open transaction began ([`clock`] nanoseconds).
    began_ns: u64,
    visible_ns: u64,
}

impl std::fmt::Debug for KafkaTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTarget")
            .field("topic", &self.config.topic)
            .field("slot", &self.slot)
            .field("current", &self.current)
            .field(
                "in_transaction",
                &self.producers.get(self.current).is_some_and(|p| p.in_transaction),
            )
            .finish()
    }
}

impl KafkaTarget {
    /// The target of `slot` (not opened).
    pub fn new(config: Arc<KafkaSinkConfig>, slot: usize) -> Self {
        KafkaTarget {
            config,
            slot,
            producers: Vec::new(),
            current: 0,
            epochs: Vec::new(),
            began_ns: 0,
            visible_ns: 0,
        }
    }

    fn txn(&self) -> &TxnProducer {
        self.producers
            .get(self.current)
            .expect("the target is opened before it is written")
    }

    fn producer(&self) -> &SinkProducer {
        &self.txn().producer
    }

    fn txn_error(&self, what: &str, e: KafkaError) -> Error {
        self.config.error(
            &self.config.topic,
            format!("{what} (slot {}, transactional id {})", self.slot, self.txn().id),
            e,
        )
    }

    /// Begins a transaction on the current producer unless one is open,
    /// waiting at most the call timeout ([`Beginner`]).
    fn begin_transaction(&mut self) -> Result<()> {
        if self.txn().in_transaction {
            return Ok(());
        }
        let timeout = self.config.timeout;
        let Some(beginner) = self.txn().beginner.as_ref() else {
            return Err(self.config.topic_error(
                &self.config.topic,
                format!(
                    "slot {}: the producer {} is unusable after a transaction call that did not return",
                    self.slot,
                    self.txn().id
                ),
            ));
        };
        match beginner.begin(timeout) {
            Ok(done) => done.map_err(|e| self.txn_error("begin a transaction", e))?,
            Err(()) => {
                // The call may still be running: this producer is done.
                let current = self.current;
                self.producers[current].beginner = None;
                return Err(self.config.topic_error(
                    &self.config.topic,
                    format!(
                        "slot {} (transactional id {}): beginning a transaction did not return within {timeout:?} \
                         (a known librdkafka hang after a fatal error, librdkafka #4420); the job fails and \
                         restarts from its last checkpoint; check the broker if it recurs",
                        self.slot,
                        self.txn().id
                    ),
                ));
            }
        }
        let current = self.current;
        self.producers[current].in_transaction = true;
        self.began_ns = clock::now_ns();
        Ok(())
    }

    /// Sends one record, waiting (bounded) for room in the producer's queue.
    fn send(&self, topic: &str, partition: Option<i32>, key: &[u8], value: &[u8]) -> Result<()> {
        let mut record = BaseRecord::to(topic).key(key).payload(value);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        delivery::send(self.producer(), record, Instant::now() + self.config.timeout)
            .map_err(|e| self.config.error(topic, "produce a record", e))
    }
}

impl Drop for KafkaTarget {
    fn drop(&mut self) {
        // Destroying a producer joins librdkafka's threads, which may
        // wait for a broker that is gone: not on the committer thread,
        // which the sink's owner joins. A transaction left open is
        // aborted by the next `init_transactions` of its id.
        for p in self.producers.drain(..) {
            super::drop_detached(p.producer, "txn-producer");
        }
    }
}

impl EpochTarget for KafkaTarget {
    const COMMITS_IN_FLIGHT: usize = 1;
    const MAX_EPOCHS_PER_COMMIT: usize = MAX_CHECKPOINTS_PER_TRANSACTION;
    const MAX_BYTES_PER_COMMIT: u64 = MAX_TRANSACTION_BYTES;

    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn describe(&self) -> String {
        format!(
            "topic '{}' at {} (slot {}, markers in '{}')",
            self.config.topic, self.config.brokers, self.slot, self.config.marker_topic
        )
    }

    fn open(&mut self) -> Result<Option<Committed>> {
        let c = self.config.clone();
        c.validate()?;
        c.ensure_topic(&c.topic, c.partitions, false, false)?;
        c.ensure_topic(&c.marker_topic, self.slot as i32 + 1, true, true)?;
        // Every id is fenced, and what its older producer left open
        // settled, before the marker says what was published: a zombie's
        // transaction on either id commits before this read or never.
        // The ids are initialized side by side: each is a few broker round
        // trips, and a first use of an id (the coordinator making its
        // state) took 0.5 s here.
        let slot = self.slot;
        let opened: Vec<Result<TxnProducer>> = std::thread::scope(|s| {
            let c = &c;
            let handles: Vec<_> = (0..PRODUCERS_PER_SLOT)
                .map(|k| s.spawn(move || TxnProducer::open(c, slot, c.transactional_id_of(slot, k))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        // The producers that opened are kept even if another failed: the
        // target's drop lets go of them off this thread (closing one waits
        // for librdkafka).
        let mut failed = None;
        for p in opened {
            match p {
                Ok(p) => self.producers.push(p),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        self.current = 0;
        read_marker(&c, self.slot)
    }

    fn begin(&mut self, epoch: u64) -> Result<()> {
        self.begin_transaction()?;
        self.epochs.push(epoch);
        Ok(())
    }

    fn write(&mut self, payloads: &[u8]) -> Result<()> {
        let topic = self.config.topic.clone();
        for r in Records::new(payloads) {
            let (k, v) = r.map_err(|at| {
                self.config.topic_error(
                    &topic,
                    format!(
                        "slot {}: a logged record at byte {at} of an epoch is cut short",
                        self.slot
                    ),
                )
            })?;
            self.send(&topic, None, k, v)?;
        }
        Ok(())
    }

    fn end(&mut self) -> Result<()> {
        Ok(())
    }

    fn publish(&mut self, committed: Committed) -> Result<Vec<u64>> {
        self.begin_transaction()?;
        let marker = encode_marker(committed);
        let key = marker_key(self.slot);
        let topic = self.config.marker_topic.clone();
        self.send(&topic, Some(self.slot as i32), key.as_bytes(), &marker)?;
        // Waits for the records' acknowledgements here, as they arrive:
        // `commit_transaction` would wait at least 100 ms for them
        // (super::delivery). Not acknowledged in time: the commit below
        // flushes and fails or succeeds on its own.
        let deadline = Instant::now() + self.config.timeout;
        acknowledged(self.producer(), deadline);
        let commit_ns = clock::now_ns();
        let done = self.producer().commit_transaction(self.config.timeout);
        // Whatever the outcome, this transaction is over for this
        // producer: committed, or failed (the sink fails, and the next
        // open settles an unknown outcome by the marker).
        let current = self.current;
        self.producers[current].in_transaction = false;
        done.map_err(|e| self.txn_error(&format!("commit checkpoint {}", committed.epoch), e))?;
        self.visible_ns = clock::now_ns();
        self.config
            .stats
            .add_transaction(self.visible_ns - self.began_ns, self.visible_ns - commit_ns);
        // The next transaction on the other producer: this one's commit
        // markers may still be on their way (see the module docs).
        self.current = (current + 1) % self.producers.len();
        Ok(std::mem::take(&mut self.epochs))
    }

    fn visible_ns(&self) -> u64 {
        self.visible_ns
    }
}

/// A thread of the target's own that calls `begin_transaction`, so that
/// the committer waits for it at most the sink's call timeout:
/// `rd_kafka_begin_transaction` waits for librdkafka's main thread with no
/// bound, and was seen to hang forever after a fatal error (librdkafka
/// #4420). Every other call the sink makes takes a timeout. The thread
/// ends when the target drops its [`Beginner`] (and, if the call hangs,
/// when librdkafka returns; the sink failed long before).
struct Beginner {
    ask: SyncSender<()>,
    answer: Receiver<rdkafka::error::KafkaResult<()>>,
}

impl Beginner {
    /// Starts the thread; `call` is `begin_transaction` on the slot's
    /// producer (a closure, for the tests).
    fn spawn<C>(call: C, slot: usize) -> std::io::Result<Self>
    where
        C: Fn() -> rdkafka::error::KafkaResult<()> + Send + 'static,
    {
        let (ask, asked) = sync_channel::<()>(1);
        let (answer_tx, answer) = sync_channel(1);
        std::thread::Builder::new()
            .name(format!("weir-kafka-begin-{slot}"))
            .spawn(move || {
                while asked.recv().is_ok() {
                    if answer_tx.send(call()).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Beginner { ask, answer })
    }

    /// `begin_transaction`'s outcome, or `Err(())` if it did not return
    /// within `timeout` (or the thread is gone).
    fn begin(&self, timeout: Duration) -> std::result::Result<rdkafka::error::KafkaResult<()>, ()> {
        self.ask.send(()).map_err(|_| ())?;
        match self.answer.recv_timeout(timeout) {
            Ok(r) => Ok(r),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => Err(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_encode_and_decode() {
        let c = Committed {
            epoch: 7,
            pos: WalPos { seg: 3, off: 4096 },
        };
        assert_eq!(decode_marker(&encode_marker(c)), Ok(c));
        let e = decode_marker(b"WKM1\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0").unwrap_err();
        assert!(e.1.contains("earlier weir's format"), "{e:?}");
        let mut bad = encode_marker(c);
        bad[0] = b'X';
        assert!(decode_marker(&bad).unwrap_err().1.contains("not a weir marker"));
        assert!(decode_marker(&bad[..MARKER_BYTES - 1]).is_err());
        // Every flipped bit is caught by the checksum.
        for bit in 32..8 * MARKER_BYTES {
            let mut flipped = encode_marker(c);
            flipped[bit / 8] ^= 1 << (bit % 8);
            let e = decode_marker(&flipped).unwrap_err();
            assert!(e.1.contains("checksum mismatch"), "bit {bit}: {e:?}");
        }
    }

    #[test]
    fn a_begin_that_does_not_return_in_time_is_reported() {
        let b = Beginner::spawn(|| Ok(()), 0).unwrap();
        assert!(matches!(b.begin(Duration::from_secs(5)), Ok(Ok(()))));
        assert!(matches!(b.begin(Duration::from_secs(5)), Ok(Ok(()))));
        let hang = Beginner::spawn(
            || {
                std::thread::sleep(Duration::from_secs(2));
                Ok(())
            },
            1,
        )
        .unwrap();
        let start = Instant::now();
        assert!(hang.begin(Duration::from_millis(50)).is_err());
        assert!(start.elapsed() < Duration::from_secs(1));
    }
}
