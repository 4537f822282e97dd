//! Apache Kafka in and out: a replayable, exactly-once source over a
//! topic's partitions, and at-least-once and exactly-once sinks.
//!
//! Why it exists: a stream processor is most often fed from a log such as
//! Kafka, and Kafka has what exactly-once needs from a source: records in
//! each partition have offsets that a checkpoint can store and a restore
//! can seek to, and transactional producers whose aborted records a
//! `read_committed` reader never sees. weir's file source gives the same
//! guarantee for data at rest; this one does it for data that keeps
//! arriving.
//!
//! - [`KafkaSource`] ([`source`]): one subtask reads the partitions `p`
//!   with `p mod parallelism == subtask` (assigned, no consumer-group
//!   rebalancing; [`KafkaSourceConfig::shard`] narrows it to one shard's
//!   partitions), with per-partition offsets in the checkpoint, per-
//!   partition event-time watermarks, a bounded mode, start positions and
//!   optional offset commits to a consumer group.
//! - [`KafkaSourceConfig`]: the settings; [`KafkaSourceStats`]: counters
//!   shared by every subtask of a source (skipped records, commits).
//!
//! The client is librdkafka through the `rdkafka` crate (re-exported as
//! [`crate::rdkafka`]): its consumer fetches on threads of its own and
//! hands the worker records from its buffers, so a poll never waits for
//! the network. The calls that do wait (metadata, offset look-ups) run on
//! a thread of the source's own ([`weir_core::io_thread`]) while the
//! worker goes on; see [`source`] for what runs where.
//!
//! - [`sink`]: the at-least-once sink (an idempotent producer on the
//!   sink's own thread) and the exactly-once sink (the write-ahead-log
//!   sink publishing each completed checkpoint in one transaction with a
//!   marker record, [`target`]); [`framing`]: key and value in a sink's
//!   buffers; [`KafkaSinkConfig`]: their settings. See
//!   docs/design/kafka-sink.md.

mod delivery;
pub mod framing;
pub mod sink;
pub mod sink_config;
pub mod source;
pub mod target;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use sink::{at_least_once, exactly_once, KafkaAppender, KafkaAtLeastOnceSink, KafkaExactlyOnceSink};
pub use sink_config::{KafkaSinkConfig, KafkaSinkStats};
pub use source::{KafkaRecordInfo, KafkaSource};
pub use target::{
    read_marker, KafkaTarget, MAX_CHECKPOINTS_PER_TRANSACTION, MAX_TRANSACTION_BYTES, PRODUCERS_PER_SLOT,
};

/// Where a source subtask starts reading a partition that its checkpoint
/// (if any) does not cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// The oldest record still in the partition (its low watermark).
    Earliest,
    /// After the last record present when the source starts (the high
    /// watermark; under `read_committed` the last stable offset).
    Latest,
    /// The first record whose timestamp is at or after this time (epoch
    /// milliseconds); the end of the partition if there is none.
    Timestamp(i64),
    /// The consumer group's committed offset; [`StartFrom::Earliest`] for a
    /// partition without one. Needs [`KafkaSourceConfig::group`].
    CommittedOrEarliest,
    /// The consumer group's committed offset; [`StartFrom::Latest`] for a
    /// partition without one. Needs [`KafkaSourceConfig::group`].
    CommittedOrLatest,
}

/// What the source does with a record its parse function rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KafkaBadRecords {
    /// Stop: the poll fails with [`crate::Error::KafkaMalformed`] naming the
    /// topic, partition and offset. The default.
    #[default]
    Fail,
    /// Skip the record and count it ([`KafkaSourceStats::skipped`]).
    Skip,
}

/// Per-partition event-time watermarks from the records' Kafka timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionWatermarks {
    /// Records up to this many milliseconds older than the newest one of
    /// their partition are on time: a partition's watermark is its largest
    /// timestamp minus this, minus 1.
    pub out_of_orderness_ms: i64,
    /// A partition that delivered nothing for this long stops holding the
    /// subtask's watermark back until its next record; when all of a
    /// subtask's partitions are idle, the subtask is marked idle. `None`:
    /// never idle (a partition without records holds event time back).
    pub idle_after_ms: Option<u64>,
}

/// Counters shared by every subtask (and every attempt) of one source.
#[derive(Debug, Default)]
pub struct KafkaSourceStats {
    skipped: AtomicU64,
    commits: AtomicU64,
    commit_failures: AtomicU64,
}

impl KafkaSourceStats {
    /// Records skipped as malformed under [`KafkaBadRecords::Skip`] (a
    /// record replayed after a restore is counted again).
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Offset commits to the consumer group handed to the client (one per
    /// completed checkpoint that stored offsets). They are asynchronous:
    /// the broker has them shortly after.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Offset commits the client refused or the broker failed (librdkafka
    /// logs the latter as `COMMITFAIL`, also passed to `tracing` as a
    /// warning). They do not fail the job: the offsets that count are the
    /// checkpoint's; the group's are for monitoring and for
    /// [`StartFrom::CommittedOrEarliest`].
    pub fn commit_failures(&self) -> u64 {
        self.commit_failures.load(Ordering::Relaxed)
    }

    pub(crate) fn add_skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_commit(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_commit_failure(&self) {
        self.commit_failures.fetch_add(1, Ordering::Relaxed);
    }
}

/// librdkafka's log line, into `tracing` (target `librdkafka`), for the
/// source's and the sinks' clients alike; without it the sinks' lines
/// (their `debug` property's output among them) went nowhere.
pub(crate) fn log_to_tracing(level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
    use rdkafka::config::RDKafkaLogLevel as L;
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error => tracing::error!(target: "librdkafka", "{fac}: {log_message}"),
        L::Warning => tracing::warn!(target: "librdkafka", "{fac}: {log_message}"),
        L::Notice | L::Info => tracing::info!(target: "librdkafka", "{fac}: {log_message}"),
        L::Debug => tracing::debug!(target: "librdkafka", "{fac}: {log_message}"),
    }
}

/// Drops a Kafka client (consumer, producer) on a short-lived thread of
/// its own, so that nothing waits for it: closing a consumer that has a
/// `group.id` polls until librdkafka reports it closed, with no bound
/// (rust-rdkafka's `Drop`), and destroying a client joins its threads,
/// which may wait for a broker that is gone. A client dropped this way
/// is done with: a producer's records were flushed or its transaction
/// settled (a zombie transactional producer is fenced by the next
/// `init_transactions` of its id), a consumer's offsets live in
/// checkpoints. Should no thread be had, it is dropped here.
pub(crate) fn drop_detached<T: Send + 'static>(client: T, what: &str) {
    let name = format!("weir-kafka-close-{what}");
    if let Err(e) = std::thread::Builder::new().name(name).spawn(move || drop(client)) {
        tracing::warn!(target: "weir_io::kafka", "no thread to close a Kafka client ({what}): {e}; closing it here");
    }
}

/// Whether a client error is one that librdkafka cures by itself, by
/// reconnecting or finding the partition's leader again (`AllBrokersDown`,
/// transport failures, timeouts, a leader or coordinator moving): a reader
/// polls on, within its own deadline, instead of failing.
///
/// ```
/// use weir_io::kafka::is_transient;
/// use weir_io::rdkafka::error::{KafkaError, RDKafkaErrorCode};
/// assert!(is_transient(&KafkaError::MessageConsumption(RDKafkaErrorCode::AllBrokersDown)));
/// assert!(!is_transient(&KafkaError::MessageConsumption(RDKafkaErrorCode::UnknownTopicOrPartition)));
/// assert!(!is_transient(&KafkaError::PartitionEOF(0)));
/// ```
pub fn is_transient(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    match e {
        KafkaError::MessageConsumptionFatal(_) | KafkaError::PartitionEOF(_) => false,
        _ => matches!(
            e.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::AllBrokersDown
                    | RDKafkaErrorCode::BrokerTransportFailure
                    | RDKafkaErrorCode::OperationTimedOut
                    | RDKafkaErrorCode::RequestTimedOut
                    | RDKafkaErrorCode::NetworkException
                    | RDKafkaErrorCode::NotCoordinator
                    | RDKafkaErrorCode::LeaderNotAvailable
                    | RDKafkaErrorCode::NotLeaderForPartition,
            )
        ),
    }
}

/// Longest wait of one blocking client call in the source's setup
/// (metadata, offsets), by default.
pub const DEFAULT_SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The settings of a [`KafkaSource`]; every subtask gets a clone.
///
/// ```
/// use weir_io::kafka::{KafkaSourceConfig, StartFrom};
/// let config = KafkaSourceConfig::new("127.0.0.1:9092", "events")
///     .start_from(StartFrom::Earliest)
///     .bounded()
///     .watermarks(100, Some(1_000))
///     .set("fetch.wait.max.ms", "50");
/// assert!(config.is_bounded());
/// ```
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    pub(crate) brokers: String,
    pub(crate) topic: String,
    pub(crate) start: StartFrom,
    pub(crate) bounded: bool,
    pub(crate) group: Option<String>,
    pub(crate) commit_offsets: bool,
    pub(crate) bad_records: KafkaBadRecords,
    pub(crate) watermarks: Option<PartitionWatermarks>,
    pub(crate) properties: Vec<(String, String)>,
    pub(crate) setup_timeout: Duration,
    pub(crate) stats: Arc<KafkaSourceStats>,
    /// `(shards, shard)`: this source reads only the partitions `p` with
    /// `p mod shards == shard`.
    pub(crate) shard: (usize, usize),
}

impl KafkaSourceConfig {
    /// Reads `topic` from the cluster at `brokers` (`host:port[,host:port]`,
    /// librdkafka's `bootstrap.servers`): from the earliest offsets,
    /// unbounded, no consumer group, bad records fail the job, no
    /// watermarks.
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSourceConfig {
            brokers: brokers.into(),
            topic: topic.into(),
            start: StartFrom::Earliest,
            bounded: false,
            group: None,
            commit_offsets: false,
            bad_records: KafkaBadRecords::Fail,
            watermarks: None,
            properties: Vec::new(),
            setup_timeout: DEFAULT_SETUP_TIMEOUT,
            stats: Arc::default(),
            shard: (1, 0),
        }
    }

    /// Reads only the partitions `p` with `p mod shards == shard` (default:
    /// one shard, every partition): several jobs, in one process or in
    /// several, share a topic this way, each with its own checkpoints.
    /// Within the shard, subtask `i` of `n` reads the shard's partitions
    /// `p` with `(p / shards) mod n == i`. `weir run --instances` runs one
    /// job per shard (docs/design/scaling.md).
    pub fn shard(mut self, shards: usize, shard: usize) -> Self {
        self.shard = (shards, shard);
        self
    }

    /// Whether this source reads partition `p` as subtask `subtask` of
    /// `parallelism` (see [`KafkaSourceConfig::shard`]).
    pub fn reads(&self, p: i32, subtask: usize, parallelism: usize) -> bool {
        let (shards, shard) = self.shard;
        p >= 0 && p as usize % shards == shard && (p as usize / shards) % parallelism == subtask
    }

    /// Where partition `p` sits in its subtask's ordered list of
    /// partitions.
    pub(crate) fn local_index(&self, p: i32, parallelism: usize) -> usize {
        p.max(0) as usize / self.shard.0 / parallelism
    }

    /// Where to start in partitions not covered by a restored checkpoint.
    pub fn start_from(mut self, start: StartFrom) -> Self {
        self.start = start;
        self
    }

    /// Bounded: read each partition up to the end offset it had when the
    /// source started (under `read_committed`, its last stable offset),
    /// then finish. The end offsets are stored in checkpoints, so a
    /// restored job ends where the first attempt would have.
    pub fn bounded(mut self) -> Self {
        self.bounded = true;
        self
    }

    /// Whether [`KafkaSourceConfig::bounded`] was set.
    pub fn is_bounded(&self) -> bool {
        self.bounded
    }

    /// The consumer group (`group.id`), for [`StartFrom::CommittedOrEarliest`]
    /// and [`KafkaSourceConfig::commit_offsets_on_checkpoint`]. The source
    /// never joins the group (no rebalancing): partitions are assigned by
    /// subtask index.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// When a checkpoint completes, commit the offsets it stored to the
    /// consumer group (asynchronously; a failed commit is counted, not
    /// fatal). For monitoring tools and [`StartFrom::CommittedOrEarliest`];
    /// the job itself restores from its checkpoints.
    pub fn commit_offsets_on_checkpoint(mut self) -> Self {
        self.commit_offsets = true;
        self
    }

    /// Skip (and count) records the parse function rejects instead of
    /// failing the job.
    pub fn skip_bad_records(mut self) -> Self {
        self.bad_records = KafkaBadRecords::Skip;
        self
    }

    /// Per-partition watermarks from the records' timestamps; see
    /// [`PartitionWatermarks`].
    pub fn watermarks(mut self, out_of_orderness_ms: i64, idle_after_ms: Option<u64>) -> Self {
        self.watermarks = Some(PartitionWatermarks {
            out_of_orderness_ms,
            idle_after_ms,
        });
        self
    }

    /// A librdkafka consumer setting (`fetch.wait.max.ms`, `security.protocol`,
    /// ...), applied after the source's own; see [`KafkaSourceConfig::client_config`].
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((key.into(), value.into()));
        self
    }

    /// Longest wait of each blocking call of the setup (default
    /// [`DEFAULT_SETUP_TIMEOUT`]).
    pub fn setup_timeout(mut self, timeout: Duration) -> Self {
        self.setup_timeout = timeout;
        self
    }

    /// The counters every subtask of this source adds to.
    pub fn stats(&self) -> Arc<KafkaSourceStats> {
        Arc::clone(&self.stats)
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The bootstrap servers.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The librdkafka settings of subtask `subtask`'s consumer:
    ///
    /// | setting | value | why |
    /// |---|---|---|
    /// | `isolation.level` | `read_committed` | never read aborted or open transactions |
    /// | `enable.auto.commit`, `enable.auto.offset.store` | `false` | the checkpoint holds the offsets |
    /// | `auto.offset.reset` | `error` | a stored offset that is gone (retention) fails the job instead of silently skipping data |
    /// | `enable.partition.eof` | `true` when bounded | tells a bounded source a partition is read to its end |
    /// | `queued.max.messages.kbytes`, `queued.min.messages` | 16384, 10000 | bounds the client's prefetch buffer |
    /// | `fetch.wait.max.ms` | 100 | a fetch with no data returns within 100 ms |
    /// | `fetch.queue.backoff.ms` | 5 | how soon the client looks again at a partition whose buffer was above `queued.min.messages`; librdkafka's 1000 ms lets each partition fetch about once a second, one `max.partition.fetch.bytes` (1 MiB) at a time: ~40,000 records/s per partition, whatever the machine (docs/notebook/benchmarks-2026-12.md, "The 100 ms flush and the fetch backoff") |
    ///
    /// then `group.id` ([`KafkaSourceConfig::group`], else `weir-unmanaged-TOPIC`,
    /// which the source never commits to), then every [`KafkaSourceConfig::set`].
    pub fn client_config(&self, subtask: usize) -> rdkafka::ClientConfig {
        let mut c = rdkafka::ClientConfig::new();
        let client_id = match self.shard {
            (1, _) => format!("weir-{}-{subtask}", self.topic),
            (_, shard) => format!("weir-{}-s{shard}-{subtask}", self.topic),
        };
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", client_id)
            .set("isolation.level", "read_committed")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", if self.bounded { "true" } else { "false" })
            .set("queued.max.messages.kbytes", "16384")
            .set("queued.min.messages", "10000")
            .set("fetch.wait.max.ms", "100")
            .set("fetch.queue.backoff.ms", "5");
        // librdkafka's consumer needs a group even for assigned partitions;
        // without one of the user's, a name of its own that nothing
        // commits to (the source never joins a group).
        match &self.group {
            Some(g) => c.set("group.id", g),
            None => c.set("group.id", format!("weir-unmanaged-{}", self.topic)),
        };
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }

    /// Checks the settings that do not need the cluster.
    pub(crate) fn validate(&self) -> crate::Result<()> {
        let invalid = |setting, value: String, reason| crate::Error::InvalidConfig { setting, value, reason };
        if self.brokers.trim().is_empty() {
            return Err(invalid("brokers", self.brokers.clone(), "name at least one host:port"));
        }
        if self.topic.is_empty() {
            return Err(invalid("topic", String::new(), "must not be empty"));
        }
        let needs_group = self.commit_offsets
            || matches!(
                self.start,
                StartFrom::CommittedOrEarliest | StartFrom::CommittedOrLatest
            );
        if needs_group && self.group.is_none() {
            return Err(invalid(
                "group",
                "none".into(),
                "committed start offsets and offset commits need a consumer group: KafkaSourceConfig::group",
            ));
        }
        if let Some(w) = &self.watermarks {
            if !(0..=weir_core::time::MAX_OUT_OF_ORDERNESS_MS).contains(&w.out_of_orderness_ms) {
                return Err(invalid(
                    "watermarks.out_of_orderness_ms",
                    w.out_of_orderness_ms.to_string(),
                    "must be between 0 and one day",
                ));
            }
            if w.idle_after_ms == Some(0) {
                return Err(invalid("watermarks.idle_after_ms", "0".into(), "must be at least 1"));
            }
        }
        let (shards, shard) = self.shard;
        if shards == 0 || shard >= shards {
            return Err(invalid(
                "shard",
                format!("{shard} of {shards}"),
                "the shard must be below the number of shards, which must be at least 1",
            ));
        }
        if self.setup_timeout.is_zero() {
            return Err(invalid("setup_timeout", "0".into(), "must be positive"));
        }
        Ok(())
    }
}
