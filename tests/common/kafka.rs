//! A Kafka broker for the tests of one test binary, started once through
//! `bench/peers/kafka/kafka.sh` on free ports with a state folder of its
//! own, and stopped when the binary exits (an `atexit` handler; should the
//! process die without running it, the script's watcher stops the broker
//! within a second).
//!
//! Tests that need it call [`broker`]; if the broker cannot start (no Java,
//! no jars and no Maven, a port taken three times over), [`broker`] panics
//! and those tests fail: they never skip. The first call takes the broker's
//! start time (6-11 s on the project's machine).

#![allow(dead_code)] // each test binary uses a part of this module

use std::future::Future;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake};
use std::time::{Duration, Instant};

use weir_io::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use weir_io::rdkafka::client::DefaultClientContext;
use weir_io::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use weir_io::rdkafka::ClientConfig;

/// The script that installs, starts and stops the broker.
pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/kafka/kafka.sh");

/// Longest wait of a test's client call (produce, create a topic).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// A running broker.
pub struct Broker {
    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub addr: String,
    /// Its state folder (removed when it stops).
    pub dir: PathBuf,
    /// How long its start took.
    pub started_in: Duration,
}

static BROKER: OnceLock<Broker> = OnceLock::new();

/// The broker of this test binary, started on first use.
///
/// # Panics
/// If it cannot be started: the calling test fails with the script's reason.
pub fn broker() -> &'static Broker {
    BROKER.get_or_init(start)
}

fn free_port_pair() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let b = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

fn script(dir: &std::path::Path, ports: (u16, u16), command: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("bash")
        .arg(SCRIPT)
        .arg(command)
        .env("KAFKA_DIR", dir)
        .env("KAFKA_PORT", ports.0.to_string())
        .env("KAFKA_CONTROLLER_PORT", ports.1.to_string())
        .env("KAFKA_WATCH_PID", std::process::id().to_string())
        .status()
}

fn start() -> Broker {
    let dir = std::env::temp_dir().join(format!("weir-kafka-test-{}", std::process::id()));
    let (broker, ports) = start_in(dir);
    STOP.get_or_init(|| (broker.dir.clone(), ports));
    // SAFETY: registers a plain function with no captured state.
    unsafe { libc::atexit(stop_at_exit) };
    eprintln!(
        "kafka test broker at {} (started in {:.1} s)",
        broker.addr,
        broker.started_in.as_secs_f64()
    );
    broker
}

/// Starts a broker with its state in `dir` on free ports (three attempts).
fn start_in(dir: PathBuf) -> (Broker, (u16, u16)) {
    let t0 = Instant::now();
    let mut last = String::new();
    for attempt in 1..=3 {
        let _ = std::fs::remove_dir_all(&dir);
        let ports = free_port_pair();
        match script(&dir, ports, "start") {
            Ok(s) if s.success() => {
                let broker = Broker {
                    addr: format!("127.0.0.1:{}", ports.0),
                    dir: dir.clone(),
                    started_in: t0.elapsed(),
                };
                return (broker, ports);
            }
            Ok(s) => last = format!("attempt {attempt}: {SCRIPT} start exited with {s}"),
            Err(e) => last = format!("attempt {attempt}: cannot run {SCRIPT}: {e}"),
        }
        let _ = script(&dir, ports, "stop");
    }
    panic!(
        "the Kafka test broker did not start ({last}); it needs a JDK 17+ and either the jars \
         (bench/peers/kafka/kafka.sh install) or Maven with Maven Central reachable"
    );
}

/// A broker of one test's own, which the test may stop and start again
/// (same ports, same data) without disturbing the binary's other tests;
/// stopped and removed when dropped (or by the script's watcher when the
/// process dies).
pub struct OwnBroker {
    /// The broker.
    pub broker: Broker,
    ports: (u16, u16),
}

impl OwnBroker {
    /// Starts one in a fresh state folder.
    pub fn start(name: &str) -> OwnBroker {
        let dir = std::env::temp_dir().join(format!("weir-kafka-{name}-{}", std::process::id()));
        let (broker, ports) = start_in(dir);
        OwnBroker { broker, ports }
    }

    /// Stops the broker (a clean shutdown, as `kafka.sh stop`).
    pub fn stop(&self) {
        let s = script(&self.broker.dir, self.ports, "stop").expect("run kafka.sh stop");
        assert!(s.success(), "kafka.sh stop exited with {s}");
    }

    /// Starts it again on the same ports over the same data.
    pub fn start_again(&self) {
        let s = script(&self.broker.dir, self.ports, "start").expect("run kafka.sh start");
        assert!(s.success(), "kafka.sh start (again) exited with {s}");
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        let _ = script(&self.broker.dir, self.ports, "stop");
        let _ = std::fs::remove_dir_all(&self.broker.dir);
    }
}

static STOP: OnceLock<(PathBuf, (u16, u16))> = OnceLock::new();

extern "C" fn stop_at_exit() {
    if let Some((dir, ports)) = STOP.get() {
        let _ = script(dir, *ports, "stop");
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A topic name no other test of this process uses.
pub fn unique_topic(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future of the Kafka admin client to completion on this thread
/// (the client's own thread drives it), at most [`CLIENT_TIMEOUT`].
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = Arc::new(ThreadWaker(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "a Kafka admin call took over {CLIENT_TIMEOUT:?}"
        );
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

impl Broker {
    /// Client settings for this broker.
    pub fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.addr);
        c
    }

    /// Creates `topic` with `partitions` partitions (replication 1).
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = self.client().create().expect("admin client");
        let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let opts = AdminOptions::new().operation_timeout(Some(CLIENT_TIMEOUT));
        let results = block_on(admin.create_topics([&t], &opts)).expect("create topic");
        for r in results {
            r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
        }
    }

    /// A producer (idempotent, acks=all).
    pub fn producer(&self) -> BaseProducer {
        self.client()
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()
            .expect("producer")
    }

    /// A transactional producer with `transactional.id` `id`, initialised.
    pub fn transactional_producer(&self, id: &str) -> BaseProducer {
        let p: BaseProducer = self
            .client()
            .set("transactional.id", id)
            .set("linger.ms", "5")
            .create()
            .expect("transactional producer");
        p.init_transactions(CLIENT_TIMEOUT).expect("init transactions");
        p
    }

    /// Produces `records` (partition, key, value, timestamp ms) to `topic`
    /// and waits until every one is acknowledged.
    pub fn produce<'a>(&self, topic: &str, records: impl IntoIterator<Item = (i32, &'a str, String, Option<i64>)>) {
        let p = self.producer();
        send_all(&p, topic, records);
        p.flush(CLIENT_TIMEOUT).expect("flush the producer");
    }
}

/// Sends records through `p`, serving its delivery queue when it is full.
pub fn send_all<'a>(
    p: &BaseProducer,
    topic: &str,
    records: impl IntoIterator<Item = (i32, &'a str, String, Option<i64>)>,
) {
    for (partition, key, value, ts) in records {
        let mut r = BaseRecord::to(topic).partition(partition).key(key).payload(&value);
        if let Some(ts) = ts {
            r = r.timestamp(ts);
        }
        let mut r = Some(r);
        let deadline = Instant::now() + CLIENT_TIMEOUT;
        while let Some(rec) = r.take() {
            match p.send(rec) {
                Ok(()) => {}
                Err((e, rec)) => {
                    assert!(Instant::now() < deadline, "produce to {topic}: {e}");
                    p.poll(Duration::from_millis(10));
                    r = Some(rec);
                }
            }
        }
    }
}

/// Every record of `topic` (all `partitions`) a `read_committed` reader
/// sees, as `(key, value)` strings, partition by partition.
pub fn read_committed(topic: &str, partitions: i32) -> Vec<(String, String)> {
    read_committed_from(broker(), topic, partitions)
}

/// [`read_committed`] from the broker `b`.
pub fn read_committed_from(b: &Broker, topic: &str, partitions: i32) -> Vec<(String, String)> {
    use weir_io::rdkafka::consumer::{BaseConsumer, Consumer};
    use weir_io::rdkafka::error::KafkaError;
    use weir_io::rdkafka::message::Message;
    use weir_io::rdkafka::{Offset, TopicPartitionList};
    let consumer: BaseConsumer = b
        .client()
        .set("group.id", "weir-test-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let mut eof = std::collections::HashSet::new();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while eof.len() < partitions as usize {
        assert!(
            Instant::now() < deadline,
            "reading {topic} took over {CLIENT_TIMEOUT:?}"
        );
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => out.push((
                String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            )),
            Some(Err(KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            // A dropped connection (CI's 2 cores under load): librdkafka
            // reconnects, within the deadline above.
            Some(Err(e)) if weir_io::kafka::is_transient(&e) => {
                eprintln!("read {topic}: {e} (transient: reading on)");
            }
            Some(Err(e)) => panic!("read {topic}: {e}"),
        }
    }
    out
}
