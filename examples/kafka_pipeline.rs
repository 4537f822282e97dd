//! Embedding a Kafka → weir → Kafka job, exactly once.
//!
//! The job reads `key,value` records from an input topic with
//! [`KafkaSource`] (`read_committed`, partitions assigned to subtasks,
//! offsets in the checkpoints), keeps a running count and sum per key, and
//! writes `key,count,sum` to an output topic through the exactly-once Kafka
//! sink: each checkpoint's records go to a write-ahead log and are
//! published in one Kafka transaction when the checkpoint completes. A
//! `read_committed` reader of the output sees each count once, whatever
//! fails; run the example again and it resumes from its last checkpoint.
//!
//! ```text
//! kafka source (p=2) --key_by(key)--> count --> exactly-once kafka sink
//! ```
//!
//! It needs a running broker. Give its address in `WEIR_KAFKA_BROKERS` or
//! as the first argument; the repository's script starts one:
//!
//! ```sh
//! bench/peers/kafka/kafka.sh start            # 127.0.0.1:9092, state in target/kafka
//! cargo run --release -p weir-bench --example kafka_pipeline -- 127.0.0.1:9092
//! bench/peers/kafka/kafka.sh stop
//! ```
//!
//! To have something to count, the example first writes [`RECORDS`] sample
//! records to the input topic `weir-example-in` (creating it) if it is
//! empty; the job reads that topic to its end (bounded), and the example
//! then reads the output topic `weir-example-out` back and prints what a
//! `read_committed` consumer sees. Checkpoints and the sink's log go to
//! `target/kafka-example`.

use std::time::Duration;

use weir_core::{CheckpointConfig, CheckpointMode, Output, Pipeline, RestoreFrom, RuntimeConfig};
use weir_io::kafka::{framing, KafkaRecordInfo, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
use weir_io::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use weir_io::rdkafka::client::DefaultClientContext;
use weir_io::rdkafka::consumer::{BaseConsumer, Consumer};
use weir_io::rdkafka::message::Message;
use weir_io::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use weir_io::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use weir_io::text::Line;
use weir_io::{sinks, ParseError};

const INPUT: &str = "weir-example-in";
const OUTPUT: &str = "weir-example-out";
/// Sample records written to an empty input topic.
const RECORDS: u64 = 10_000;
const PARTITIONS: i32 = 2;
const PARALLELISM: usize = 2;
const TIMEOUT: Duration = Duration::from_secs(30);

/// One input record.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Rec {
    key: String,
    value: i64,
}

/// One output record.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Counted {
    key: String,
    count: u64,
    sum: i64,
}

/// `key,value` from a record's value; a bad record stops the job with the
/// topic, partition and offset named.
fn parse(value: &[u8], _: &KafkaRecordInfo<'_>) -> Result<Rec, ParseError> {
    let text = std::str::from_utf8(value).map_err(|_| ParseError::new("not UTF-8"))?;
    let (key, v) = text
        .split_once(',')
        .ok_or_else(|| ParseError::new("expected `key,value`"))?;
    let value = v.parse().map_err(|_| ParseError::new("the value is not an integer"))?;
    Ok(Rec {
        key: key.to_string(),
        value,
    })
}

/// The output record: key = the key, value = `key,count,sum`, written
/// straight into the sink's buffer (`text::Line`: no `core::fmt`, no
/// allocation per record).
fn encode(c: &Counted, out: &mut Vec<u8>) {
    framing::encode_with(c.key.as_bytes(), out, |out| {
        Line::new(out).str(&c.key).u64(c.count).i64(c.sum).done()
    });
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let brokers = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("WEIR_KAFKA_BROKERS").ok())
        .ok_or("give the broker as the first argument or in WEIR_KAFKA_BROKERS (bench/peers/kafka/kafka.sh start)")?;
    fill_input(&brokers)?;

    let pipeline = Pipeline::new("kafka-pipeline");
    let source = KafkaSourceConfig::new(&brokers, INPUT).bounded();
    let mut sink = KafkaSinkConfig::new(&brokers, OUTPUT);
    sink.partitions = PARTITIONS;
    let state = std::path::PathBuf::from("target/kafka-example");
    pipeline
        .source("kafka", PARALLELISM, move |i, n| {
            KafkaSource::new(source.clone(), i, n, parse)
        })
        .key_by(|r: &Rec| r.key.clone())
        .parallelism(PARALLELISM)
        .process(|key: &String, st: &mut [i64; 2], r: Rec, out: &mut Output<Counted>| {
            st[0] += 1;
            st[1] += r.value;
            out.emit(Counted {
                key: key.clone(),
                count: st[0] as u64,
                sum: st[1],
            });
        })
        .name("count")
        .sink(
            "kafka",
            sinks::kafka_exactly_once(sink, state.join("kafka-wal"), encode),
        );
    let config = RuntimeConfig {
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(100),
            restore: RestoreFrom::Latest,
            ..CheckpointConfig::new(CheckpointMode::Aligned, state.join("checkpoints"))
        }),
        ..RuntimeConfig::default()
    };
    let result = pipeline.run(config)?.join()?;
    println!(
        "job {:?} in {:.2} s: {} checkpoints completed, restored from {:?}",
        result.outcome,
        result.elapsed.as_secs_f64(),
        result.metrics.checkpoints.completed,
        result.metrics.checkpoints.restored_from
    );
    print_output(&brokers)?;
    Ok(())
}

/// Creates the input topic and writes sample records to it if it is empty.
fn fill_input(brokers: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", brokers);
    let admin: AdminClient<DefaultClientContext> = client.create()?;
    let topic = NewTopic::new(INPUT, PARTITIONS, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    // An error here is usually "already exists", which is fine.
    let _ = futures_executor::block_on(admin.create_topics([&topic], &opts))?;
    let probe: BaseConsumer = client.create()?;
    let mut present = 0;
    for p in 0..PARTITIONS {
        let (lo, hi) = probe.fetch_watermarks(INPUT, p, TIMEOUT)?;
        present += hi - lo;
    }
    if present > 0 {
        println!("{INPUT} holds {present} records: counting those");
        return Ok(());
    }
    let producer: BaseProducer = client.clone().set("enable.idempotence", "true").create()?;
    for i in 0..RECORDS {
        let line = format!("sensor-{},{}", i % 10, i % 7);
        let p = (i % 10 % PARTITIONS as u64) as i32; // one key, one partition
        let mut record = BaseRecord::<(), String>::to(INPUT).partition(p).payload(&line);
        while let Err((e, back)) = producer.send(record) {
            if !matches!(
                e.rdkafka_error_code(),
                Some(weir_io::rdkafka::error::RDKafkaErrorCode::QueueFull)
            ) {
                return Err(e.into());
            }
            producer.poll(Duration::from_millis(10));
            record = back;
        }
    }
    producer.flush(TIMEOUT)?;
    println!("wrote {RECORDS} sample records to {INPUT}");
    Ok(())
}

/// Reads the output topic as a `read_committed` consumer and prints the
/// last count of each key.
fn print_output(brokers: &str) -> Result<(), Box<dyn std::error::Error>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "weir-example-reader")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(OUTPUT, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let (mut records, mut at_end) = (0u64, 0);
    let mut last = std::collections::BTreeMap::new();
    let deadline = std::time::Instant::now() + TIMEOUT;
    while at_end < PARTITIONS && std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => {
                records += 1;
                let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                if let Some((key, rest)) = v.split_once(',') {
                    last.insert(key.to_string(), rest.to_string());
                }
            }
            Some(Err(weir_io::rdkafka::error::KafkaError::PartitionEOF(_))) => at_end += 1,
            Some(Err(e)) => return Err(e.into()),
        }
    }
    println!("{OUTPUT}: {records} committed records; last count,sum per key:");
    for (key, count_sum) in last {
        println!("  {key}: {count_sum}");
    }
    Ok(())
}
