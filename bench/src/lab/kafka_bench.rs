//! `weir bench --source kafka --sink kafka`: the keyed count
//! read from a Kafka topic and written to a Kafka topic, measured from
//! outside the job as a user would see it.
//!
//! Why it exists: the file and generator benchmarks say nothing about the
//! pipeline the checkpointing design exists for (Kafka → weir → Kafka,
//! exactly once). This one runs it against a real broker:
//!
//! - **closed loop** (no `--rate`): a producer step fills an input topic of
//!   `--partitions` partitions with `--events` records `key,value,stamp`,
//!   then the job reads it bounded (KafkaSource) → `key_by` → running count
//!   and sum → Kafka sink. Throughput is `events` over the time from the
//!   job's start until a `read_committed` reader of the output topic has
//!   seen the last output record.
//! - **open loop** (`--rate R`): a producer thread sends `R` records a
//!   second into a fresh input topic while the job runs unbounded; each
//!   record carries its *scheduled* send time (coordinated omission
//!   corrected), the job carries it to the output record, and a
//!   `read_committed` reader records `now − scheduled` when it sees it:
//!   end-to-end visibility latency. The first second is warm-up, not
//!   recorded.
//!
//! Mode `at-least-once` writes through the idempotent at-least-once sink;
//! `aligned` and `unaligned` through the exactly-once sink (write-ahead
//! log, one transaction per completed checkpoint). The reader checks the
//! output from the key's running counts: exactly-once runs must show every
//! `(key, count)` once and nothing else, at-least-once runs no loss.
//!
//! Without `--brokers` the benchmark starts a broker of its own through
//! `bench/peers/kafka/kafka.sh` (on free ports, in a temporary folder) and
//! stops it at the end.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use weir_core::{clock, Output, Pipeline};
use weir_io::kafka::{framing, KafkaRecordInfo, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
use weir_io::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use weir_io::rdkafka::client::DefaultClientContext;
use weir_io::rdkafka::consumer::{BaseConsumer, Consumer};
use weir_io::rdkafka::error::{KafkaError, RDKafkaErrorCode};
use weir_io::rdkafka::message::Message;
use weir_io::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use weir_io::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use weir_io::{ParseError, WalSinkConfig};

use crate::cli::{CliError, Mode};
use crate::lab::bench::{append_json, runtime_config, temp_checkpoint_dir, BenchArgs};
use crate::lab::event::Event;
use crate::lab::kafka_parts::{self, InputParts, KafkaParts, OutputParts, WallClock};
use crate::lab::report::{CheckpointSummary, Machine, Percentiles};

/// The broker script, beside this crate.
pub(crate) const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/kafka/kafka.sh");

/// Longest wait of one client call of the benchmark's own (create a topic,
/// flush the producer).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Open loop: records of the first this-many nanoseconds of the schedule
/// are warm-up (the load generator's connection, the source's first
/// fetches) and not recorded. The schedule itself starts only once the
/// job is up ([`READY_TIMEOUT`]).
pub(crate) const WARMUP_NS: u64 = 1_000_000_000;

/// Open loop: the longest wait for the job's first completed checkpoint
/// (its Kafka clients connected, the exactly-once sinks' transactions
/// initialized and markers read) before the load generator's schedule
/// starts. Before this wait the schedule started 2 s after the job, and a
/// start that took longer (1.4-2.4 s for the first checkpoint here) put
/// the backlog of the job's start into the measured records: visible p99
/// 440-570 ms instead of 120-140 ms in one run of three at a 100 ms
/// interval (docs/notebook/benchmarks-2026-12.md).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the reader waits for the output after the job or the producer
/// is done before the run is declared wrong.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// What a row of the Kafka benchmark ran and what its reader saw, for
/// weir's job and an external one alike (flattened into both rows' JSON).
#[derive(Debug, Clone, serde::Serialize)]
pub struct KafkaRun {
    /// Always `kafka-keyed`.
    pub pipeline: &'static str,
    /// Checkpoint mode (an external job's: the guarantee checked).
    pub mode: &'static str,
    /// Checkpoint interval, milliseconds (an external job's, as given).
    pub checkpoint_interval_ms: u64,
    /// Partitions of the input and output topics (an external job's: if
    /// this run created them).
    pub partitions: i32,
    /// Distinct keys.
    pub keys: u64,
    /// Input records.
    pub events: u64,
    /// Output records the reader saw.
    pub output_records: u64,
    /// Output records beyond one per input record (at-least-once).
    pub duplicates: u64,
}

impl KafkaRun {
    fn of(args: &BenchArgs, events: u64, seen: &Seen) -> Self {
        KafkaRun {
            pipeline: "kafka-keyed",
            mode: args.mode.name(),
            checkpoint_interval_ms: args.checkpoint_interval_ms,
            partitions: args.partitions,
            keys: args.keys,
            events,
            output_records: seen.records,
            duplicates: seen.records - events.min(seen.records),
        }
    }
}

/// One run of the Kafka benchmark, as printed and written to JSON.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KafkaBenchResult {
    /// What ran and what the reader saw of it.
    #[serde(flatten)]
    pub run: KafkaRun,
    /// `kafka-exactly-once` or `kafka-at-least-once`.
    pub sink: &'static str,
    /// Parallelism of source, keyed operator and sink.
    pub parallelism: usize,
    /// Worker threads (open loop: one core fewer than the machine has by
    /// default, left to the broker, librdkafka's threads and weir's own).
    pub workers: usize,
    /// Records per second offered (open loop), or `None` (closed loop).
    pub rate: Option<f64>,
    /// Closed loop: the producer step's rate, records per second.
    pub fill_per_sec: Option<f64>,
    /// Closed loop: job start until the reader saw the last output record;
    /// open loop: producer start until then.
    pub seconds: f64,
    /// `events / seconds`.
    pub events_per_sec: f64,
    /// The engine's own elapsed time (build to finish or cancel).
    pub job_seconds: f64,
    /// Scheduled send (open loop) or job start to reader (closed loop),
    /// microseconds; open loop after the warm-up only.
    pub visible_latency_us: Percentiles,
    /// Inside the job: from the source's poll to the sink's write,
    /// microseconds.
    pub latency_us: Percentiles,
    /// Open loop: where a record's visible latency went, part by part
    /// (`crate::lab::kafka_parts`).
    pub parts: Option<KafkaParts>,
    /// The platform figure (open loop; `--platform-probe`), microseconds:
    /// by default the wait of a record arriving at a random instant for a
    /// thread spinning alone on the workers' cores right before the run
    /// (the broker's threads, running beside it, count); with `fifo`, how
    /// late a `SCHED_FIFO` thread on those cores woke during the run.
    pub platform_us: Option<Percentiles>,
    /// How the platform figure was measured, with the share of the
    /// workers' cores the hypervisor took (`steal_pct`), as in `weir bench`.
    pub platform_probe: Option<crate::lab::report::ProbeInfo>,
    /// Checkpoints of the run.
    pub checkpoints: CheckpointSummary,
    /// Where and when.
    pub machine: Machine,
}

/// Runs the Kafka benchmark for each `--parallelism`.
pub fn run(args: &BenchArgs) -> Result<Vec<KafkaBenchResult>, CliError> {
    let exactly_once = match args.mode {
        Mode::AtLeastOnce => false,
        Mode::Aligned | Mode::Unaligned | Mode::Dedup => true,
        Mode::None => {
            return Err(CliError::Usage(
                "--source kafka needs checkpoints: --mode at-least-once (the at-least-once sink), aligned, \
                 unaligned or dedup (the exactly-once sink)"
                    .into(),
            ))
        }
    };
    if args.partitions < 1 {
        return Err(CliError::Usage("--partitions must be at least 1".into()));
    }
    if args.checkpoint_interval_ms == 0 {
        return Err(CliError::Usage("--checkpoint-interval-ms must be at least 1".into()));
    }
    // Open loop: 6 s of the rate (1 s of warm-up, 5 measured); an external
    // job's 13 s (5 s of warm-up, 8 measured).
    let seconds = if args.external_job.is_some() { 13.0 } else { 6.0 };
    let events = args.events.unwrap_or(match args.rate {
        None => 2_000_000,
        Some(r) => ((r * seconds) as u64).max(1000),
    });
    if events == 0 || args.keys == 0 {
        return Err(CliError::Usage("--events and --keys must be at least 1".into()));
    }
    if let Some(spec) = &args.external_job {
        let (input, output) = external_topics(spec, args)?;
        let (_own, brokers) = broker(args.brokers.as_deref())?;
        let r = external(args, &brokers, input, output, events, exactly_once)?;
        r.print();
        if let Some(path) = &args.json {
            append_json(path, &r)?;
        }
        return Ok(Vec::new());
    }
    let (_own, brokers) = broker(args.brokers.as_deref())?;
    run_on(args, &brokers, events, exactly_once)
}

/// The runs of `args` (one per parallelism) on the broker at `brokers`.
pub(crate) fn run_on(
    args: &BenchArgs,
    brokers: &str,
    events: u64,
    exactly_once: bool,
) -> Result<Vec<KafkaBenchResult>, CliError> {
    let sweep = if args.parallelism.is_empty() {
        vec![weir_core::available_cores()]
    } else {
        args.parallelism.clone()
    };
    let mut results = Vec::new();
    for &parallelism in &sweep {
        let run = Run {
            brokers,
            args,
            parallelism,
            events,
            exactly_once,
        };
        let r = run.go()?;
        print_result(&r);
        if let Some(path) = &args.json {
            append_json(path, &r)?;
        }
        results.push(r);
    }
    Ok(results)
}

fn print_result(r: &KafkaBenchResult) {
    let v = &r.visible_latency_us;
    let c = &r.checkpoints;
    println!(
        "kafka-keyed  {:<13} {:<19} interval {:>4} ms  P={} par={} workers={} {}  {:>10.0} ev/s ({} events, {:.2} s; job {:.2} s{})  \
         visible p50 {:.1} ms p99 {:.1} ms p99.9 {:.1} ms max {:.1} ms (source to sink: p50 {:.1} ms p99 {:.1} ms){}  checkpoints {} (p50 {:.1} ms, max {:.1} ms)  output {} (+{} dup)",
        r.run.mode,
        r.sink,
        r.run.checkpoint_interval_ms,
        r.run.partitions,
        r.parallelism,
        r.workers,
        r.rate.map_or("closed loop".to_string(), |x| format!("open loop {x:.0}/s")),
        r.events_per_sec,
        r.run.events,
        r.seconds,
        r.job_seconds,
        r.fill_per_sec.map_or(String::new(), |f| format!("; fill {f:.0} ev/s")),
        v.p50 / 1e3,
        v.p99 / 1e3,
        v.p999 / 1e3,
        v.max / 1e3,
        r.latency_us.p50 / 1e3,
        r.latency_us.p99 / 1e3,
        r.platform_us.as_ref().map_or(String::new(), |p| format!(
            "  platform p99 {:.2} ms p99.9 {:.2} ms max {:.2} ms{}",
            p.p99 / 1e3,
            p.p999 / 1e3,
            p.max / 1e3,
            r.platform_probe
                .as_ref()
                .and_then(|i| i.steal_pct)
                .map_or(String::new(), |s| format!(" (steal {s:.1}%)"))
        )),
        c.completed,
        c.duration_ms.p50,
        c.duration_ms.max,
        r.run.output_records,
        r.run.duplicates,
    );
    if let Some(p) = &r.parts {
        println!("  {}", p.line());
    }
}

/// The broker at `given`, or one started through the project's script:
/// its address, and the broker to keep (stopped when dropped).
pub(crate) fn broker(given: Option<&str>) -> Result<(Option<OwnBroker>, String), CliError> {
    Ok(match given {
        Some(b) => (None, b.to_string()),
        None => {
            let own = OwnBroker::start()?;
            let addr = own.addr.clone();
            (Some(own), addr)
        }
    })
}

/// A broker started by this benchmark, stopped when dropped.
pub(crate) struct OwnBroker {
    addr: String,
    dir: std::path::PathBuf,
    ports: (u16, u16),
}

impl OwnBroker {
    fn start() -> Result<Self, CliError> {
        let dir = std::env::temp_dir().join(format!("weir-bench-kafka-{}", std::process::id()));
        let a = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| io_err("a free port", e))?;
        let b = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| io_err("a free port", e))?;
        let ports = (
            a.local_addr().map_err(|e| io_err("a free port", e))?.port(),
            b.local_addr().map_err(|e| io_err("a free port", e))?.port(),
        );
        drop((a, b));
        eprintln!("weir bench: starting a Kafka broker with {SCRIPT} (give --brokers to use a running one)");
        let broker = OwnBroker {
            addr: format!("127.0.0.1:{}", ports.0),
            dir,
            ports,
        };
        let status = broker.script("start")?;
        if !status.success() {
            return Err(CliError::Usage(format!(
                "{SCRIPT} start exited with {status}; it needs a JDK 17+ and Maven (or installed jars); \
                 or give --brokers HOST:PORT of a running broker"
            )));
        }
        Ok(broker)
    }

    fn script(&self, command: &str) -> Result<std::process::ExitStatus, CliError> {
        Command::new("bash")
            .arg(SCRIPT)
            .arg(command)
            .env("KAFKA_DIR", &self.dir)
            .env("KAFKA_PORT", self.ports.0.to_string())
            .env("KAFKA_CONTROLLER_PORT", self.ports.1.to_string())
            .env("KAFKA_WATCH_PID", std::process::id().to_string())
            .status()
            .map_err(|e| io_err(SCRIPT, e))
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        let _ = self.script("stop");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn io_err(what: &str, source: std::io::Error) -> CliError {
    CliError::Io {
        path: what.to_string(),
        source,
    }
}

fn kafka_err(what: impl std::fmt::Display, e: KafkaError) -> CliError {
    CliError::Usage(format!("Kafka: {what}: {e}"))
}

/// SplitMix64: the generator benchmarks' key scrambling.
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The key of input record `seq`, in `0..keys` (multiply-shift).
fn key_of(seq: u64, keys: u64) -> u64 {
    ((splitmix(seq) as u128 * keys as u128) >> 64) as u64
}

/// Writes `a,b,c` in decimal into `buf`; returns the length.
/// Writes `fields` as `a,b,...` into `buf`; returns the length.
fn encode_fields(buf: &mut [u8; 128], fields: &[u64]) -> usize {
    debug_assert!(fields.len() <= 5, "five u64 and their commas fit in 128 bytes");
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    for (i, f) in fields.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        std::io::Write::write_fmt(&mut cursor, format_args!("{sep}{f}")).expect("fits in 128 bytes");
    }
    cursor.position() as usize
}

/// Parses an unsigned decimal field.
fn field(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((c - b'0') as u64)?;
    }
    Some(v)
}

/// Splits `a,b,...` into exactly `N` numbers.
fn split<const N: usize>(v: &[u8]) -> Option<[u64; N]> {
    let mut it = v.split(|&c| c == b',');
    let mut out = [0u64; N];
    for o in &mut out {
        *o = field(it.next()?)?;
    }
    it.next().is_none().then_some(out)
}

/// An input record: `key,value,stamp` with `stamp` the scheduled send time
/// on [`clock`] (open loop) or 0 (closed loop). The event carries the
/// source's poll as its emission (the job's own latency starts there) and
/// the stamp as its `seq`; `parts` sees its way to the source.
fn parse_input(value: &[u8], info: &KafkaRecordInfo<'_>, parts: &mut InputParts) -> Result<Event, ParseError> {
    let [key, v, stamp] = split::<3>(value).ok_or_else(|| ParseError::new("expected `key,value,stamp`"))?;
    parts.see(stamp, info.timestamp_ms, info.emitted_ns);
    Ok(Event {
        key,
        value: v,
        emitted_ns: info.emitted_ns,
        seq: stamp,
    })
}

/// An output record: key = the key; value = `key,count,stamp,polled,written`
/// (`stamp`: the input's scheduled send time, 0 in the closed loop;
/// `polled`: the source's poll; `written`: now, the sink's write; both on
/// [`clock`]).
fn encode_output(e: &Event, out: &mut Vec<u8>) {
    let mut k = [0u8; 64];
    let mut cursor = std::io::Cursor::new(&mut k[..]);
    std::io::Write::write_fmt(&mut cursor, format_args!("{}", e.key)).expect("a u64 fits");
    let klen = cursor.position() as usize;
    let mut v = [0u8; 128];
    let vlen = encode_fields(&mut v, &[e.key, e.value, e.seq, e.emitted_ns, clock::now_ns()]);
    framing::encode(&k[..klen], &v[..vlen], out);
}

fn client(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    c
}

/// Creates `topic` with `partitions` partitions; false if it existed.
fn create_topic(brokers: &str, topic: &str, partitions: i32) -> Result<bool, CliError> {
    let admin: AdminClient<DefaultClientContext> =
        client(brokers).create().map_err(|e| kafka_err("an admin client", e))?;
    // The broker stamps each record's append: the parts of a record's
    // latency (crate::lab::kafka_parts) start and end there.
    let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1)).set("message.timestamp.type", "LogAppendTime");
    let opts = AdminOptions::new().operation_timeout(Some(CLIENT_TIMEOUT));
    let results =
        futures_executor::block_on(admin.create_topics([&t], &opts)).map_err(|e| kafka_err("create topics", e))?;
    for r in results {
        match r {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => return Ok(false),
            Err((t, code)) => return Err(kafka_err(format!("create topic {t}"), KafkaError::AdminOp(code))),
        }
    }
    Ok(true)
}

pub(crate) fn delete_topics(brokers: &str, topics: &[&str]) {
    if let Ok(admin) = client(brokers).create::<AdminClient<DefaultClientContext>>() {
        let opts = AdminOptions::new().operation_timeout(Some(CLIENT_TIMEOUT));
        let _ = futures_executor::block_on(admin.delete_topics(topics, &opts));
    }
}

/// Records in `topic` (high minus low watermarks over its partitions).
fn records_in(brokers: &str, topic: &str, partitions: i32) -> Result<u64, CliError> {
    let c: BaseConsumer = client(brokers).create().map_err(|e| kafka_err("a consumer", e))?;
    let mut n = 0;
    for p in 0..partitions {
        let (lo, hi) = c
            .fetch_watermarks(topic, p, CLIENT_TIMEOUT)
            .map_err(|e| kafka_err(format!("watermarks of {topic}/{p}"), e))?;
        n += (hi - lo).max(0) as u64;
    }
    Ok(n)
}

/// The benchmark's producer: idempotent, acks from all replicas, batches of
/// up to 1 MB after `linger_ms`.
fn producer(brokers: &str, linger_ms: &str) -> Result<BaseProducer, CliError> {
    client(brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", linger_ms)
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .map_err(|e| kafka_err("a producer", e))
}

/// Sends one record of `seq` to partition `seq mod partitions`, serving the
/// delivery queue while it is full.
fn send(p: &BaseProducer, topic: &str, partitions: i32, seq: u64, keys: u64, stamp: u64) -> Result<(), CliError> {
    let mut v = [0u8; 128];
    let len = encode_fields(&mut v, &[key_of(seq, keys), seq, stamp]);
    let mut rec = BaseRecord::<(), [u8]>::to(topic)
        .partition((seq % partitions as u64) as i32)
        .payload(&v[..len]);
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) if Instant::now() < deadline => {
                rec = back;
                p.poll(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(kafka_err(format!("produce to {topic}"), e)),
        }
    }
}

/// Fills `topic` with records `0..events` as fast as the broker takes them;
/// returns records per second.
fn fill(brokers: &str, topic: &str, partitions: i32, events: u64, keys: u64) -> Result<f64, CliError> {
    let p = producer(brokers, "5")?;
    let t0 = Instant::now();
    for seq in 0..events {
        send(&p, topic, partitions, seq, keys, 0)?;
        if seq % 1024 == 0 {
            p.poll(Duration::ZERO);
        }
    }
    p.flush(CLIENT_TIMEOUT)
        .map_err(|e| kafka_err(format!("flush the producer of {topic}"), e))?;
    Ok(events as f64 / t0.elapsed().as_secs_f64())
}

/// What the output reader saw.
struct Seen {
    records: u64,
    /// Per key: records, largest count, sum of counts.
    per_key: Vec<(u64, u64, u128)>,
    latency_ns: Histogram<u64>,
    /// The parts of the recorded records' latency after the source.
    parts: OutputParts,
    /// [`clock`] time the last awaited record was seen.
    last_ns: u64,
    bad: u64,
}

/// The output reader: what it reads, what it waits for, and the flags it
/// shares with the run.
struct Reader {
    brokers: String,
    topic: String,
    partitions: i32,
    /// Per key, the final count.
    expected: Vec<u64>,
    /// Records scheduled at or after this are recorded.
    record_from_ns: Arc<AtomicU64>,
    wall: WallClock,
    /// The start of unstamped records (`stamp == 0`).
    zero_ns: Arc<AtomicU64>,
    /// The run is done: drain for at most [`DRAIN_TIMEOUT`].
    stop: Arc<AtomicBool>,
    /// Set at the first output record.
    seen_any: Arc<AtomicBool>,
}

impl Reader {
    /// Reads on a thread of its own.
    fn spawn(self) -> Result<std::thread::JoinHandle<Result<Seen, CliError>>, CliError> {
        std::thread::Builder::new()
            .name("bench-reader".into())
            .spawn(move || read_output(&self))
            .map_err(|e| io_err("the reader thread", e))
    }
}

/// Reads `r.topic` read_committed from the start until it has seen, per
/// key, the final count or `r.stop` is set and [`DRAIN_TIMEOUT`] passed;
/// records visibility latency of stamped records scheduled at or after
/// `r.record_from_ns` (`stamp == 0`: from `r.zero_ns`).
fn read_output(r: &Reader) -> Result<Seen, CliError> {
    let (brokers, topic, partitions, expected) = (r.brokers.as_str(), r.topic.as_str(), r.partitions, &r.expected);
    let (record_from_ns, wall, zero_ns, stop, seen_any) =
        (&*r.record_from_ns, r.wall, &*r.zero_ns, &*r.stop, &*r.seen_any);
    let consumer: BaseConsumer = client(brokers)
        .set("group.id", "weir-bench-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "5")
        .set("fetch.queue.backoff.ms", "1")
        .create()
        .map_err(|e| kafka_err("the output reader", e))?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .map_err(|e| kafka_err("assign", e))?;
    }
    consumer.assign(&tpl).map_err(|e| kafka_err("assign", e))?;
    let mut seen = Seen {
        records: 0,
        per_key: vec![(0, 0, 0); expected.len()],
        latency_ns: kafka_parts::histogram(),
        parts: OutputParts::new(wall),
        last_ns: 0,
        bad: 0,
    };
    let mut incomplete = expected.iter().filter(|&&c| c > 0).count();
    let mut stop_seen: Option<Instant> = None;
    let mut errors = 0u64;
    while incomplete > 0 {
        if stop.load(Ordering::Acquire) {
            let at = *stop_seen.get_or_insert_with(Instant::now);
            if at.elapsed() > DRAIN_TIMEOUT {
                break;
            }
        }
        let m = match consumer.poll(Duration::from_millis(100)) {
            None => continue,
            Some(Ok(m)) => m,
            // Transient (a connection lost, all brokers down for a while: a
            // stalled broker): the client reconnects on its own; the wait is
            // bounded by the drain timeout once the job or producer is done.
            Some(Err(e)) if weir_io::kafka::is_transient(&e) => {
                errors += 1;
                continue;
            }
            Some(Err(e)) => return Err(kafka_err(format!("read {topic}"), e)),
        };
        let now = clock::now_ns();
        let Some([key, count, stamp, polled, written]) = m.payload().and_then(output_fields) else {
            seen.bad += 1;
            continue;
        };
        let Some(k) = seen.per_key.get_mut(key as usize) else {
            seen.bad += 1;
            continue;
        };
        seen.records += 1;
        if seen.records == 1 {
            seen_any.store(true, Ordering::Release);
        }
        k.0 += 1;
        k.2 += count as u128;
        if count > k.1 {
            k.1 = count;
            if count == expected[key as usize] {
                incomplete -= 1;
                seen.last_ns = now;
            }
        }
        let from = if stamp == 0 {
            zero_ns.load(Ordering::Acquire)
        } else {
            stamp
        };
        if stamp >= record_from_ns.load(Ordering::Acquire) && from > 0 {
            kafka_parts::record(&mut seen.latency_ns, from, now);
            if stamp > 0 && polled > 0 {
                seen.parts.see(polled, written, m.timestamp().to_millis(), now);
            }
        }
    }
    if errors > 0 {
        eprintln!("weir bench: the output reader saw {errors} transient client errors (reconnected)");
    }
    Ok(seen)
}

/// An output value's fields `key,count,stamp,polled,written`: weir's, or
/// another engine's `key,count,stamp` with `polled` and `written` 0 (no
/// parts).
fn output_fields(v: &[u8]) -> Option<[u64; 5]> {
    split::<5>(v).or_else(|| split::<3>(v).map(|[k, c, s]| [k, c, s, 0, 0]))
}

/// Final count per key of records `0..events`.
fn expected_counts(events: u64, keys: u64) -> Vec<u64> {
    let mut c = vec![0u64; keys as usize];
    for seq in 0..events {
        c[key_of(seq, keys) as usize] += 1;
    }
    c
}

struct Run<'a> {
    brokers: &'a str,
    args: &'a BenchArgs,
    parallelism: usize,
    events: u64,
    exactly_once: bool,
}

impl Run<'_> {
    fn go(&self) -> Result<KafkaBenchResult, CliError> {
        let args = self.args;
        let (brokers, partitions, events, keys) = (self.brokers, args.partitions, self.events, args.keys);
        let tag = format!("{}-{}", std::process::id(), clock::now_ns() % 1_000_000_000);
        let open = args.rate.is_some();
        // The input: the given topic (filled once, reused while it holds
        // exactly `events` records), else a fresh one.
        let (input, own_input) =
            match (&args.topic, open) {
                (Some(t), false) => (t.clone(), false),
                (Some(_), true) => return Err(CliError::Usage(
                    "--topic names a pre-filled input for the closed loop; the open loop (--rate) writes a fresh topic"
                        .into(),
                )),
                (None, _) => (format!("weir-bench-in-{tag}"), true),
            };
        let output = format!("weir-bench-out-{tag}");
        create_topic(brokers, &input, partitions)?;
        let mut fill_per_sec = None;
        if !open {
            let have = records_in(brokers, &input, partitions)?;
            if have == 0 {
                let r = fill(brokers, &input, partitions, events, keys)?;
                eprintln!("weir bench: filled {input} with {events} records at {r:.0} records/s");
                fill_per_sec = Some(r);
            } else if have != events {
                return Err(CliError::Usage(format!(
                    "--topic {input} holds {have} records, not --events {events}: give a fresh topic name"
                )));
            }
        }
        create_topic(brokers, &output, partitions)?;
        let expected = expected_counts(events, keys);
        let dir = temp_checkpoint_dir();
        let result = self.measure(&input, &output, &expected, fill_per_sec, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        let markers = format!("{output}.weir-markers");
        let mut topics = vec![output.as_str(), markers.as_str()];
        if own_input {
            topics.push(&input);
        }
        delete_topics(brokers, &topics);
        result
    }

    fn measure(
        &self,
        input: &str,
        output: &str,
        expected: &[u64],
        fill_per_sec: Option<f64>,
        dir: &std::path::Path,
    ) -> Result<KafkaBenchResult, CliError> {
        let args = self.args;
        let (brokers, partitions, events, keys, p) =
            (self.brokers, args.partitions, self.events, args.keys, self.parallelism);
        let open = args.rate.is_some();

        let mut source = KafkaSourceConfig::new(brokers, input);
        if !open {
            source = source.bounded();
        }
        for (k, v) in &args.kafka_set {
            source = source.set(k, v);
        }
        // Open loop: records scheduled at or after this are recorded; set
        // once the job is up (nothing is recorded before).
        let record_from = Arc::new(AtomicU64::new(if open { u64::MAX } else { 0 }));
        let wall = WallClock::now();
        let input_parts = InputParts::total();
        let pipeline = Pipeline::new("kafka-keyed");
        let (source_parts, source_record_from) = (input_parts.clone(), record_from.clone());
        let counted = pipeline
            .source("kafka", p, move |i, n| {
                let mut parts = InputParts::new(wall, source_record_from.clone(), source_parts.clone());
                KafkaSource::new(source.clone(), i, n, move |v: &[u8], info: &KafkaRecordInfo<'_>| {
                    parse_input(v, info, &mut parts)
                })
            })
            .key_by(|e: &Event| e.key)
            .parallelism(p)
            .process(|_key: &u64, st: &mut u64, e: Event, out: &mut Output<Event>| {
                *st += 1;
                out.emit(Event { value: *st, ..e });
            })
            .name("count");
        let mut sink = KafkaSinkConfig::new(brokers, output);
        sink.partitions = partitions;
        sink.properties.extend(args.kafka_set.iter().cloned());
        let sink_stats = sink.stats.clone();
        let sink = Arc::new(sink);
        let emitted = |e: &Event| e.emitted_ns;
        if self.exactly_once {
            let wal = WalSinkConfig::new(dir.join("kafka-wal"), dir.join("unused"));
            counted.sink("kafka", move |i| {
                weir_io::kafka::exactly_once(sink.clone(), wal.clone(), i, encode_output, emitted)
            });
        } else {
            counted.sink("kafka", move |i| {
                weir_io::kafka::at_least_once(sink.clone(), i, encode_output, emitted)
            });
        }
        let cores = weir_core::available_cores();
        // Open loop: a core left over for the broker on the same machine,
        // librdkafka's threads and weir's helpers. With every core running
        // a worker, the broker waited for one: at-least-once visible p99
        // 104-191 ms against 31-32 ms with one worker on two cores
        // (docs/notebook/benchmarks-2026-12.md, "Kafka to Kafka with a
        // core left for the broker").
        let default_workers = if open { cores.saturating_sub(1).max(1) } else { cores };
        let config = runtime_config(
            args.workers.unwrap_or(default_workers),
            args.ring_capacity,
            args.batch_size,
            args.mode,
            args.checkpoint_interval_ms,
            dir,
        );

        let stop = Arc::new(AtomicBool::new(false));
        let zero = Arc::new(AtomicU64::new(0));
        let reader = Reader {
            brokers: brokers.to_string(),
            topic: output.to_string(),
            partitions,
            expected: expected.to_vec(),
            record_from_ns: record_from.clone(),
            wall,
            zero_ns: zero.clone(),
            stop: stop.clone(),
            seen_any: Arc::new(AtomicBool::new(false)),
        }
        .spawn()?;
        zero.store(clock::now_ns(), Ordering::Release);
        let job_started = clock::now_ns();
        // Worker w runs on core w: the probe covers the workers' cores.
        let probe = args.platform_probe.for_run(open).start(config.workers.min(cores));
        let workers = config.workers;
        let job = pipeline.run(config);
        // Open loop: records scheduled from `start` on, one every 1/rate s,
        // once the job is up.
        let start_ns = match (&job, open) {
            (Ok(job), true) => {
                wait_until_up(job)?;
                let start = clock::now_ns() + 200_000_000;
                record_from.store(start + WARMUP_NS, Ordering::Release);
                start
            }
            _ => 0,
        };
        let producer = match (&job, args.rate) {
            (Ok(_), Some(rate)) => {
                let (brokers, input) = (brokers.to_string(), input.to_string());
                let stop = stop.clone();
                Some(
                    std::thread::Builder::new()
                        .name("bench-producer".into())
                        .spawn(move || open_loop(&brokers, &input, partitions, events, keys, rate, start_ns, &stop))
                        .map_err(|e| io_err("the producer thread", e))?,
                )
            }
            _ => None,
        };
        let joined = job.and_then(|job| {
            if open {
                // Runs until the reader has everything (or gave up).
                while !reader.is_finished() && !job.is_finished() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                job.cancel();
            }
            job.join()
        });
        stop.store(true, Ordering::Release);
        let platform = probe.finish();
        let produced = producer.map(|t| {
            t.join()
                .unwrap_or_else(|_| Err(CliError::Wrong("producer panicked".into())))
        });
        let seen = reader
            .join()
            .unwrap_or_else(|_| Err(CliError::Wrong("the reader panicked".into())))?;
        let result = joined?;
        if let Some(produced) = produced {
            produced?;
        }
        judge(&seen, expected, events, self.exactly_once)?;
        let begin = if open { start_ns } else { job_started };
        let seconds = seen.last_ns.saturating_sub(begin) as f64 / 1e9;
        Ok(KafkaBenchResult {
            run: KafkaRun::of(args, events, &seen),
            sink: if self.exactly_once {
                "kafka-exactly-once"
            } else {
                "kafka-at-least-once"
            },
            parallelism: p,
            workers,
            rate: args.rate,
            fill_per_sec,
            seconds,
            events_per_sec: events as f64 / seconds,
            job_seconds: result.elapsed.as_secs_f64(),
            visible_latency_us: Percentiles::from_ns(&seen.latency_ns),
            latency_us: Percentiles::from_ns(&result.metrics.latency_ns),
            parts: open.then(|| {
                let input = input_parts.lock().unwrap_or_else(|p| p.into_inner());
                KafkaParts::of(&input, &seen.parts, self.exactly_once.then_some(&*sink_stats))
            }),
            platform_us: platform.as_ref().map(|p| Percentiles::from_ns(&p.latency_ns)),
            platform_probe: platform.as_ref().map(crate::lab::report::ProbeInfo::of),
            checkpoints: CheckpointSummary::from_stats(&result.metrics.checkpoints),
            machine: Machine::here(),
        })
    }
}

/// The output, judged from the running counts: every key's final count
/// seen (nothing lost), every value well formed, and with `exactly_once`
/// each count exactly once.
fn judge(seen: &Seen, expected: &[u64], events: u64, exactly_once: bool) -> Result<(), CliError> {
    let mut final_sum = 0u64;
    let mut exact = true;
    for (k, &(n, max, sum)) in seen.per_key.iter().enumerate() {
        final_sum += max;
        let want = expected[k];
        if max != want {
            return Err(CliError::Wrong(format!(
                "key {k}: the reader saw counts up to {max}, expected {want} (records lost)"
            )));
        }
        exact &= n == max && sum == max as u128 * (max as u128 + 1) / 2;
    }
    if seen.bad > 0 {
        return Err(CliError::Wrong(format!(
            "{} output records were not `key,count,stamp`",
            seen.bad
        )));
    }
    if exactly_once && !(exact && seen.records == events) {
        return Err(CliError::Wrong(format!(
            "exactly-once: the reader saw {} records for {events} inputs (counts summing to {final_sum})",
            seen.records
        )));
    }
    Ok(())
}

/// Waits until `job` completed its first checkpoint, at most
/// [`READY_TIMEOUT`]; an error if it ended or did not get there.
fn wait_until_up(job: &weir_core::JobHandle) -> Result<(), CliError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while job.metrics().checkpoints.completed == 0 {
        if job.is_finished() {
            // Its error, if any, comes from `join`.
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CliError::Wrong(format!(
                "the job completed no checkpoint within {READY_TIMEOUT:?} of its start: is the broker up?"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// `linger.ms` of the open-loop producer that feeds the input topic: 5 ms,
/// librdkafka's default, so the load generator batches as a producer with
/// default settings would. Each record may wait that long in the producer,
/// and the visibility latency counts it (it starts at the scheduled send).
/// With 0, the producer sent a request per record: at 20,000 records/s its
/// broker thread took 50% of a core in `poll` on this 2-core machine, and
/// the broker as much again, so every figure measured the load generator;
/// with 5 that thread takes about 10%, and the visible p50 fell 2-5x
/// (docs/notebook/benchmarks-2026-12.md, "The benchmark's own producer").
const OPEN_LOOP_LINGER_MS: &str = "5";

/// Sends records `0..events` at `rate` per second from `start_ns` on, each
/// stamped with its scheduled time.
#[allow(clippy::too_many_arguments)]
fn open_loop(
    brokers: &str,
    topic: &str,
    partitions: i32,
    events: u64,
    keys: u64,
    rate: f64,
    start_ns: u64,
    stop: &AtomicBool,
) -> Result<(), CliError> {
    let p = producer(brokers, OPEN_LOOP_LINGER_MS)?;
    let load = Load {
        p: &p,
        topic,
        partitions,
        events,
        keys,
    };
    load.schedule(0, rate, start_ns, stop)?;
    load.flush()
}

/// The load generator's producer and what it sends: records `0..events`
/// of `keys` keys into `topic`.
struct Load<'a> {
    p: &'a BaseProducer,
    topic: &'a str,
    partitions: i32,
    events: u64,
    keys: u64,
}

impl Load<'_> {
    /// Sends records `first..events` at `rate` per second, record `first`
    /// at `start_ns`, each stamped with its scheduled time.
    fn schedule(&self, first: u64, rate: f64, start_ns: u64, stop: &AtomicBool) -> Result<(), CliError> {
        let gap = 1e9 / rate;
        let due = |seq: u64| start_ns + ((seq - first) as f64 * gap) as u64;
        let mut seq = first;
        while seq < self.events && !stop.load(Ordering::Relaxed) {
            let now = clock::now_ns();
            // Every record due by now, then a short sleep.
            while seq < self.events && due(seq) <= now {
                send(self.p, self.topic, self.partitions, seq, self.keys, due(seq))?;
                seq += 1;
            }
            self.p.poll(Duration::ZERO);
            if seq < self.events {
                let wait = due(seq).saturating_sub(clock::now_ns());
                if wait > 0 {
                    std::thread::sleep(Duration::from_nanos(wait.min(1_000_000)));
                }
            }
        }
        Ok(())
    }

    /// Sends records from 0 on, one every [`TRICKLE_GAP`] stamped with its
    /// send time, until `up` is set (the first output seen); the next
    /// record's number. An error if that takes [`READY_TIMEOUT`] or uses
    /// up the records.
    fn trickle(&self, up: &AtomicBool, stop: &AtomicBool) -> Result<u64, CliError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut seq = 0u64;
        while !up.load(Ordering::Acquire) {
            if stop.load(Ordering::Relaxed) {
                return Err(CliError::Wrong("stopped before the external job's first output".into()));
            }
            if Instant::now() >= deadline || seq == self.events {
                return Err(CliError::Wrong(format!(
                    "no output on the external job's topic for {seq} records sent into {} over {READY_TIMEOUT:?}: \
                     is the job running, reading {} and writing `key,count,stamp` values?",
                    self.topic, self.topic
                )));
            }
            send(self.p, self.topic, self.partitions, seq, self.keys, clock::now_ns())?;
            seq += 1;
            self.p.poll(Duration::ZERO);
            std::thread::sleep(TRICKLE_GAP);
        }
        Ok(seq)
    }

    fn flush(&self) -> Result<(), CliError> {
        self.p
            .flush(CLIENT_TIMEOUT)
            .map_err(|e| kafka_err(format!("flush the producer of {}", self.topic), e))
    }
}

/// External job: records of the first this-many nanoseconds of the
/// schedule are not recorded: 5 s, five times weir's [`WARMUP_NS`], for a
/// JVM engine's just-in-time compiler to reach its steady state (a longer
/// warm-up can only flatter the peer).
const EXTERNAL_WARMUP_NS: u64 = 5_000_000_000;

/// External job: the gap between the records sent until its first output
/// shows (a start-up trickle, not measured): 10 ms.
const TRICKLE_GAP: Duration = Duration::from_millis(10);

/// `--external-job IN:OUT`, checked: the two topics.
fn external_topics<'a>(spec: &'a str, args: &BenchArgs) -> Result<(&'a str, &'a str), CliError> {
    let usage = |why: &str| Err(CliError::Usage(format!("--external-job {spec}: {why}")));
    let Some((input, output)) = spec.split_once(':') else {
        return usage("give the input and output topics as IN:OUT");
    };
    if input.is_empty() || output.is_empty() || input == output || output.contains(':') {
        return usage("give two different topic names as IN:OUT");
    }
    if args.rate.is_none() {
        return usage("an external job is measured in open loop: give --rate");
    }
    if args.topic.is_some() {
        return usage("--topic names weir's closed-loop input; the external job's input is IN");
    }
    Ok((input, output))
}

/// One run of `--external-job`: another engine's job between the load and
/// the reader, as printed and written to JSON.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExternalKafkaResult {
    /// Always `external`: not weir's job.
    pub engine: &'static str,
    /// What ran and what the reader saw of it.
    #[serde(flatten)]
    pub run: KafkaRun,
    /// The input topic.
    pub input: String,
    /// The output topic.
    pub output: String,
    /// Records per second offered.
    pub rate: f64,
    /// Records sent in the start-up trickle, before the schedule.
    pub trickle: u64,
    /// Scheduled send to the reader, microseconds, after the warm-up.
    pub visible_latency_us: Percentiles,
    /// Where and when.
    pub machine: Machine,
}

impl ExternalKafkaResult {
    fn print(&self) {
        let v = &self.visible_latency_us;
        println!(
            "kafka-keyed  external job  {:<13} interval {:>4} ms  {} -> {}  open loop {:.0}/s  ({} events, {} in the start-up trickle)  \
             visible p50 {:.1} ms p99 {:.1} ms p99.9 {:.1} ms max {:.1} ms  output {} (+{} dup)",
            self.run.mode,
            self.run.checkpoint_interval_ms,
            self.input,
            self.output,
            self.rate,
            self.run.events,
            self.trickle,
            v.p50 / 1e3,
            v.p99 / 1e3,
            v.p999 / 1e3,
            v.max / 1e3,
            self.run.output_records,
            self.run.duplicates,
        );
    }
}

/// Measures an external job from `input` to `output`: the reader starts
/// first, the load trickles until the reader sees the job's first output,
/// then the schedule runs at `--rate` from 200 ms later, its first
/// [`EXTERNAL_WARMUP_NS`] not recorded, until the reader has every key's final
/// count (or gives up [`DRAIN_TIMEOUT`] after the last send).
fn external(
    args: &BenchArgs,
    brokers: &str,
    input: &str,
    output: &str,
    events: u64,
    exactly_once: bool,
) -> Result<ExternalKafkaResult, CliError> {
    let (partitions, keys) = (args.partitions, args.keys);
    let rate = args.rate.expect("checked by external_topics");
    create_topic(brokers, input, partitions)?;
    create_topic(brokers, output, partitions)?;
    let expected = expected_counts(events, keys);
    let record_from = Arc::new(AtomicU64::new(u64::MAX));
    let (stop, up) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let reader = Reader {
        brokers: brokers.to_string(),
        topic: output.to_string(),
        partitions,
        expected: expected.clone(),
        record_from_ns: record_from.clone(),
        wall: WallClock::now(),
        zero_ns: Arc::new(AtomicU64::new(0)),
        stop: stop.clone(),
        seen_any: up.clone(),
    }
    .spawn()?;
    let p = producer(brokers, OPEN_LOOP_LINGER_MS)?;
    let load = Load {
        p: &p,
        topic: input,
        partitions,
        events,
        keys,
    };
    let sent = load.trickle(&up, &stop).and_then(|trickle| {
        let start = clock::now_ns() + 200_000_000;
        record_from.store(start + EXTERNAL_WARMUP_NS, Ordering::Release);
        load.schedule(trickle, rate, start, &stop)?;
        load.flush()?;
        Ok(trickle)
    });
    // The reader drains for at most DRAIN_TIMEOUT from here.
    stop.store(true, Ordering::Release);
    let trickle = sent?;
    let seen = reader
        .join()
        .unwrap_or_else(|_| Err(CliError::Wrong("the reader panicked".into())))?;
    judge(&seen, &expected, events, exactly_once)?;
    if seen.latency_ns.is_empty() {
        return Err(CliError::Usage(format!(
            "--events {events} at --rate {rate} ends within the external job's {} s of warm-up: \
             nothing was measured; give more --events",
            EXTERNAL_WARMUP_NS / 1_000_000_000
        )));
    }
    Ok(ExternalKafkaResult {
        engine: "external",
        run: KafkaRun::of(args, events, &seen),
        input: input.to_string(),
        output: output.to_string(),
        rate,
        trickle,
        visible_latency_us: Percentiles::from_ns(&seen.latency_ns),
        machine: Machine::here(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_and_output_values_round_trip() {
        let mut v = [0u8; 128];
        let len = encode_fields(&mut v, &[7, u64::MAX, 0]);
        assert_eq!(split::<3>(&v[..len]), Some([7, u64::MAX, 0]));
        for bad in [&b"1,2"[..], b"1,2,3,4", b"a,2,3", b"1,,3", b"1,2,99999999999999999999"] {
            assert_eq!(split::<3>(bad), None, "{:?}", std::str::from_utf8(bad));
        }
        let mut out = Vec::new();
        encode_output(
            &Event {
                key: 12,
                value: 3,
                emitted_ns: 5,
                seq: 99,
            },
            &mut out,
        );
        let (k, v) = framing::Records::new(&out).next().unwrap().unwrap();
        assert_eq!(k, &b"12"[..]);
        let [key, count, stamp, polled, written] = split::<5>(v).unwrap();
        assert_eq!([key, count, stamp, polled], [12, 3, 99, 5]);
        assert!(written > 0 && written <= clock::now_ns());
    }

    #[test]
    fn keys_cover_the_range() {
        let c = expected_counts(10_000, 10);
        assert_eq!(c.iter().sum::<u64>(), 10_000);
        assert!(c.iter().all(|&n| n > 800), "{c:?}");
    }
}
