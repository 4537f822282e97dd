//! Settings of the Kafka sinks, and the client calls both need: making a
//! producer, creating a topic that is missing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::delivery::{Deliveries, SinkProducer};
use crate::{Error, Result};

/// Where and how a Kafka sink writes; shared by all its subtasks.
///
/// ```
/// use weir_io::kafka::KafkaSinkConfig;
/// let c = KafkaSinkConfig::new("127.0.0.1:9092", "counts");
/// assert_eq!(c.marker_topic, "counts.weir-markers");
/// assert_eq!(c.transactional_id(3), "weir-counts-3");
/// ```
#[derive(Debug, Clone)]
pub struct KafkaSinkConfig {
    /// Bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The output topic; created with [`KafkaSinkConfig::partitions`]
    /// partitions if missing.
    pub topic: String,
    /// Partitions of the output topic when the sink creates it (default 1).
    pub partitions: i32,
    /// Exactly-once: the compacted topic where each sink slot records its
    /// last committed checkpoint, one partition per slot (default
    /// `<topic>.weir-markers`); created if missing.
    pub marker_topic: String,
    /// Exactly-once: slot `s` uses the transactional ids `<prefix>-<s>` and
    /// `<prefix>-<s>.1` in turn (default prefix `weir-<topic>`; see
    /// [`super::target::PRODUCERS_PER_SLOT`]). Fixed ids per slot: a
    /// restarted slot fences its predecessor (a zombie) by them.
    pub transactional_id_prefix: String,
    /// The first slot of this process: subtask `i` is slot
    /// `slot_base + i` (default 0). Processes sharing one output topic and
    /// marker topic must use disjoint slots.
    pub slot_base: usize,
    /// Exactly-once: the broker aborts a transaction open this long
    /// (default 60 s). A transaction is open only while a completed
    /// checkpoint is published, so this bounds a publish, not an interval.
    pub transaction_timeout: Duration,
    /// Longest wait for one client call: initializing transactions,
    /// committing, flushing, reading a marker (default 30 s). A call that
    /// takes longer fails the sink, and the job restarts.
    pub timeout: Duration,
    /// More librdkafka settings for the producer, `(name, value)`.
    pub properties: Vec<(String, String)>,
    /// The timings every subtask of this sink adds to (shared by clones).
    pub stats: Arc<KafkaSinkStats>,
}

/// What an exactly-once Kafka sink's transactions took, summed over its
/// subtasks: how long each publish took from its `begin_transaction` to
/// `commit_transaction`'s return (the records and the marker produced and
/// acknowledged, then the commit), and the commit call alone. Recorded
/// once per transaction, under a lock (never per record).
#[derive(Debug)]
pub struct KafkaSinkStats {
    transactions: AtomicU64,
    publish_ns: Mutex<Histogram<u64>>,
    commit_ns: Mutex<Histogram<u64>>,
}

impl Default for KafkaSinkStats {
    fn default() -> Self {
        let h = || Mutex::new(Histogram::new_with_bounds(1, weir_core::LATENCY_MAX_NS, 3).expect("valid bounds"));
        KafkaSinkStats {
            transactions: AtomicU64::new(0),
            publish_ns: h(),
            commit_ns: h(),
        }
    }
}

impl KafkaSinkStats {
    /// Transactions committed.
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    /// Per transaction, nanoseconds from its `begin_transaction` to the
    /// return of its `commit_transaction`.
    pub fn publish_ns(&self) -> Histogram<u64> {
        self.publish_ns.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Per transaction, nanoseconds of the `commit_transaction` call alone
    /// (the records already acknowledged).
    pub fn commit_ns(&self) -> Histogram<u64> {
        self.commit_ns.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn add_transaction(&self, publish_ns: u64, commit_ns: u64) {
        self.transactions.fetch_add(1, Ordering::Relaxed);
        let record = |h: &Mutex<Histogram<u64>>, v: u64| {
            h.lock().unwrap_or_else(|p| p.into_inner()).saturating_record(v.max(1));
        };
        record(&self.publish_ns, publish_ns);
        record(&self.commit_ns, commit_ns);
    }
}

impl KafkaSinkConfig {
    /// A sink writing `topic` at `brokers`, other settings default.
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        let topic = topic.into();
        KafkaSinkConfig {
            brokers: brokers.into(),
            marker_topic: format!("{topic}.weir-markers"),
            transactional_id_prefix: format!("weir-{topic}"),
            topic,
            partitions: 1,
            slot_base: 0,
            transaction_timeout: Duration::from_secs(60),
            timeout: Duration::from_secs(30),
            properties: Vec::new(),
            stats: Arc::default(),
        }
    }

    /// The slot of sink subtask `subtask`.
    pub fn slot(&self, subtask: usize) -> usize {
        self.slot_base + subtask
    }

    /// The transactional id of `slot`'s first producer (the one a slot
    /// had before it had two).
    pub fn transactional_id(&self, slot: usize) -> String {
        self.transactional_id_of(slot, 0)
    }

    /// The transactional id of `slot`'s producer `k`, in
    /// `0..`[`super::target::PRODUCERS_PER_SLOT`]: `<prefix>-<slot>`, then
    /// `<prefix>-<slot>.<k>`.
    pub fn transactional_id_of(&self, slot: usize, k: usize) -> String {
        match k {
            0 => format!("{}-{slot}", self.transactional_id_prefix),
            k => format!("{}-{slot}.{k}", self.transactional_id_prefix),
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        let bad = |setting: &'static str, value: String, reason: &'static str| {
            Err(Error::InvalidConfig { setting, value, reason })
        };
        if self.brokers.trim().is_empty() {
            return bad("brokers", self.brokers.clone(), "must name at least one host:port");
        }
        if self.topic.is_empty() || self.marker_topic.is_empty() || self.topic == self.marker_topic {
            return bad(
                "marker_topic",
                self.marker_topic.clone(),
                "the output and marker topics must be named and differ",
            );
        }
        if self.partitions < 1 {
            return bad("partitions", self.partitions.to_string(), "must be at least 1");
        }
        if self.timeout.is_zero() || self.transaction_timeout < Duration::from_secs(1) {
            return bad(
                "timeout",
                format!("{:?} / {:?}", self.timeout, self.transaction_timeout),
                "the call timeout must be positive and the transaction timeout at least 1 s",
            );
        }
        Ok(())
    }

    /// A `KafkaError` while `context`, on `topic`.
    pub(crate) fn error(&self, topic: &str, context: impl Into<String>, source: KafkaError) -> Error {
        Error::Kafka {
            brokers: self.brokers.clone(),
            topic: topic.to_string(),
            context: context.into(),
            source: Box::new(source),
        }
    }

    /// A topic that cannot be used as asked.
    pub(crate) fn topic_error(&self, topic: &str, reason: String) -> Error {
        Error::KafkaTopic {
            brokers: self.brokers.clone(),
            topic: topic.to_string(),
            reason,
        }
    }

    /// The producer's settings: idempotent, murmur2 partitioning (as Java
    /// clients), acks from all replicas; `transactional_id` for
    /// exactly-once. Its delivery reports are served on a thread of its
    /// own into [`Deliveries`] (see [`super::delivery`] for why).
    pub(crate) fn producer(&self, transactional_id: Option<&str>) -> Result<SinkProducer> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "1");
        let mut message_timeout = self.timeout;
        if let Some(id) = transactional_id {
            c.set("transactional.id", id).set(
                "transaction.timeout.ms",
                self.transaction_timeout.as_millis().to_string(),
            );
            // librdkafka: a record's delivery cannot outlast its transaction.
            message_timeout = message_timeout.min(self.transaction_timeout);
        }
        c.set("message.timeout.ms", message_timeout.as_millis().to_string());
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c.create_with_context(Deliveries::default())
            .map_err(|e| self.error(&self.topic, "create a producer", e))
    }

    /// Creates `topic` with `partitions` partitions (compacted if
    /// `compact`) unless it exists; with `need_all`, an existing topic with
    /// fewer partitions gets more (the marker topic: one per slot; the
    /// sink's subtasks may race to create it, each asking for its own
    /// slot's).
    pub(crate) fn ensure_topic(&self, topic: &str, partitions: i32, compact: bool, need_all: bool) -> Result<()> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        let admin: AdminClient<DefaultClientContext> =
            c.create().map_err(|e| self.error(topic, "create an admin client", e))?;
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
        if compact {
            new = new.set("cleanup.policy", "compact");
        }
        let opts = AdminOptions::new()
            .operation_timeout(Some(self.timeout))
            .request_timeout(Some(self.timeout));
        let results = futures_executor::block_on(admin.create_topics([&new], &opts))
            .map_err(|e| self.error(topic, "create the topic", e))?;
        for r in results {
            match r {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    if need_all {
                        self.grow_topic(&admin, topic, partitions)?;
                    }
                }
                Err((_, code)) => {
                    return Err(self.error(topic, "create the topic", KafkaError::AdminOp(code)));
                }
            }
        }
        Ok(())
    }

    /// Adds partitions to `topic` until it has `partitions` (others may be
    /// doing the same: a request refused because the topic has grown
    /// meanwhile is looked at again, a bounded number of times).
    fn grow_topic(&self, admin: &AdminClient<DefaultClientContext>, topic: &str, partitions: i32) -> Result<()> {
        const ATTEMPTS: usize = 5;
        let mut have = 0;
        for _ in 0..ATTEMPTS {
            have = self.partition_count(topic)?;
            if have >= partitions {
                return Ok(());
            }
            let grow = NewPartitions::new(topic, partitions as usize);
            let opts = AdminOptions::new()
                .operation_timeout(Some(self.timeout))
                .request_timeout(Some(self.timeout));
            let results = futures_executor::block_on(admin.create_partitions([&grow], &opts))
                .map_err(|e| self.error(topic, "add partitions", e))?;
            for r in results {
                match r {
                    Ok(_) | Err((_, RDKafkaErrorCode::InvalidPartitions)) => {}
                    Err((_, code)) => return Err(self.error(topic, "add partitions", KafkaError::AdminOp(code))),
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Err(self.topic_error(
            topic,
            format!("has {have} partitions, and this sink needs {partitions} (one per slot); adding them failed"),
        ))
    }

    /// The partitions of `topic`, from the cluster's metadata.
    fn partition_count(&self, topic: &str) -> Result<i32> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()
            .map_err(|e| self.error(topic, "create a metadata client", e))?;
        let md = consumer
            .fetch_metadata(Some(topic), self.timeout)
            .map_err(|e| self.error(topic, "read the topic's metadata", e))?;
        Ok(md.topics().first().map_or(0, |t| t.partitions().len() as i32))
    }
}

/// How long a sink waits at most for room in the producer's queue before
/// it reports the producer stuck: the call timeout.
pub(crate) fn queue_full(e: &KafkaError) -> bool {
    matches!(e, KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
}
