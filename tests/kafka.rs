//! The Kafka tests, against a real broker (`bench/peers/kafka/kafka.sh`,
//! started once for this binary by `common::kafka`). If the broker cannot
//! start, every test here fails.

mod common;

use std::time::{Duration, Instant};

use common::kafka::{broker, unique_topic, CLIENT_TIMEOUT};
use weir_io::rdkafka::consumer::{BaseConsumer, Consumer};
use weir_io::rdkafka::{Offset, TopicPartitionList};

/// The harness itself: the broker serves a produce and a fetch.
#[test]
fn the_test_broker_serves() {
    let b = broker();
    let topic = unique_topic("smoke");
    b.create_topic(&topic, 1);
    b.produce(&topic, [(0, "k", "1,1".to_string(), None)]);
    let consumer: BaseConsumer = b
        .client()
        .set("group.id", "smoke")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Beginning).unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    loop {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            assert_eq!(weir_io::rdkafka::Message::payload(&m), Some(&b"1,1"[..]));
            break;
        }
        assert!(Instant::now() < deadline, "nothing fetched from {}", b.addr);
    }
    eprintln!("the broker started in {:.1} s", b.started_in.as_secs_f64());
}
