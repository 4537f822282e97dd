//! `weir compare --kafka`: what exactly-once costs through Kafka, beside the
//! generator rows: the keyed count from topic to topic
//! ([`crate::lab::kafka_bench`]), open loop, at-least-once at the first
//! checkpoint interval and exactly-once (aligned) at each, on one broker,
//! printed as a table of its own with the sentence its figures support and
//! written to `compare.json` as `kafka-open-loop` lines.
//!
//! Why a module of its own: the Kafka rows need a broker (started here
//! through the project's script unless one is given), run after the
//! generator rows so that the broker's JVM disturbs none of them, and are
//! measured from outside the job; nothing of `compare`'s own runs fits them.

use serde::Serialize;

use crate::cli::CliError;
use crate::lab::bench::BenchArgs;
use crate::lab::kafka_bench::{broker, delete_topics, run_on, KafkaBenchResult, SCRIPT};

/// What `weir compare --kafka` runs through Kafka.
#[derive(Debug, Clone)]
pub struct CompareKafka {
    /// A running broker; `None`: one started through the project's script.
    pub brokers: Option<String>,
    /// Records per second offered.
    pub rate: f64,
    /// Records per run.
    pub events: u64,
    /// Checkpoint intervals: at-least-once runs at the first, exactly-once
    /// (aligned) at each.
    pub intervals: Vec<u64>,
    /// Distinct keys.
    pub keys: u64,
}

/// `weir compare --kafka`: the keyed count from topic to topic, open loop,
/// at-least-once at the first interval and exactly-once (aligned) at each,
/// on one broker (started here unless given), after one warm-up run of
/// each sink that is not reported (a fresh broker's first runs are slower:
/// its JIT, its first transactional ids). Each run is printed as `weir
/// bench` prints it.
pub fn compare_rows(c: &CompareKafka) -> Result<(Vec<KafkaBenchResult>, Result<BrokerFloor, String>), CliError> {
    let (_own, brokers) = broker(c.brokers.as_deref())?;
    let args_of = |mode: &str, interval: u64, events: u64| -> Result<BenchArgs, CliError> {
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let argv = [
            "weir-bench".to_string(),
            "--source=kafka".into(),
            "--sink=kafka".into(),
            format!("--brokers={brokers}"),
            "--partitions=2".into(),
            format!("--rate={}", c.rate),
            format!("--events={events}"),
            format!("--keys={}", c.keys),
            format!("--mode={mode}"),
            format!("--checkpoint-interval-ms={interval}"),
        ];
        <Wrap as clap::Parser>::try_parse_from(argv)
            .map(|w| w.bench)
            .map_err(|e| CliError::Usage(format!("the Kafka rows' arguments: {e}")))
    };
    let base = c.intervals[0];
    let warmup = (c.events / 4).max(1_000);
    eprintln!("weir compare: Kafka warm-up runs (not reported)");
    for mode in ["at-least-once", "aligned"] {
        let args = args_of(mode, base, warmup)?;
        run_on(&args, &brokers, warmup, mode != "at-least-once")?;
    }
    eprintln!("weir compare: the broker's own round trip (Kafka's EndToEndLatency)");
    let floor = broker_floor(&brokers);
    let mut out = Vec::new();
    let mut rows = vec![("at-least-once", base)];
    rows.extend(c.intervals.iter().map(|&i| ("aligned", i)));
    for (mode, interval) in rows {
        let args = args_of(mode, interval, c.events)?;
        out.extend(run_on(&args, &brokers, c.events, mode != "at-least-once")?);
    }
    Ok((out, floor))
}

/// The broker's own end-to-end latency, as Kafka's `EndToEndLatency`
/// measures it: one record at a time produced (`acks=all`) and consumed,
/// [`FLOOR_RECORDS`] of them; milliseconds (the tool's resolution).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BrokerFloor {
    /// Median round trip.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
}

/// Records of the broker floor's run: 3,000 (about 5 s here).
pub const FLOOR_RECORDS: u32 = 3_000;

/// Runs Kafka's `EndToEndLatency` on `brokers` with the tools' jars from
/// the project's script (`kafka.sh tools-classpath`, fetched once);
/// why it could not be measured otherwise.
fn broker_floor(brokers: &str) -> Result<BrokerFloor, String> {
    let cp = std::process::Command::new("bash")
        .args([SCRIPT, "tools-classpath"])
        .output()
        .map_err(|e| format!("{SCRIPT} tools-classpath: {e}"))?;
    if !cp.status.success() {
        return Err(format!(
            "{SCRIPT} tools-classpath exited with {}: {}",
            cp.status,
            String::from_utf8_lossy(&cp.stderr).trim()
        ));
    }
    let classpath = String::from_utf8_lossy(&cp.stdout).trim().to_string();
    let log4j = std::path::Path::new(SCRIPT).with_file_name("log4j2.properties");
    let topic = format!(
        "weir-floor-{}-{}",
        std::process::id(),
        weir_core::clock::now_ns() % 1_000_000_000
    );
    let out = std::process::Command::new("java")
        .arg("-Xmx256m")
        .arg(format!("-Dlog4j2.configurationFile={}", log4j.display()))
        .args([
            "-cp",
            &classpath,
            "org.apache.kafka.tools.EndToEndLatency",
            brokers,
            &topic,
        ])
        .args([&FLOOR_RECORDS.to_string(), "all", "30"])
        .output()
        .map_err(|e| format!("java EndToEndLatency: {e}"));
    // The tool's topic is not left on a broker that outlives the run.
    delete_topics(brokers, &[&topic]);
    let out = out?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "EndToEndLatency exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse_floor(&text).ok_or_else(|| format!("EndToEndLatency printed no percentiles: {}", text.trim()))
}

/// Parses `EndToEndLatency`'s `Percentiles: 50th = 1, 99th = 5, 99.9th = 14`.
fn parse_floor(text: &str) -> Option<BrokerFloor> {
    let line = text.lines().find(|l| l.starts_with("Percentiles:"))?;
    let mut v = line
        .trim_start_matches("Percentiles:")
        .split(',')
        .map(|part| part.split('=').nth(1).and_then(|x| x.trim().parse::<f64>().ok()));
    Some(BrokerFloor {
        p50_ms: v.next()??,
        p99_ms: v.next()??,
        p999_ms: v.next()??,
    })
}

/// Records a Kafka run at `rate` needs at least: its warm-up
/// ([`crate::lab::kafka_bench::WARMUP_NS`], not recorded) and 2 s measured.
pub fn least_events(rate: f64) -> u64 {
    let seconds = crate::lab::kafka_bench::WARMUP_NS as f64 / 1e9 + 2.0;
    ((rate * seconds).ceil() as u64).max(1_000)
}

/// Prints the Kafka rows' table and the sentence they support.
pub fn print_table(rows: &[KafkaBenchResult], floor: &Result<BrokerFloor, String>, c: &CompareKafka) {
    let Some(first) = rows.first() else {
        return;
    };
    println!(
        "\nThrough Kafka: the keyed count from topic to topic (weir bench --source kafka --sink kafka), open loop at \
         {:.0} records/s, {} partitions, {} worker{}, one broker on the same machine{}; visible: from the load \
         generator's scheduled send to a read_committed reader",
        c.rate,
        first.run.partitions,
        first.workers,
        if first.workers == 1 { "" } else { "s" },
        c.brokers.as_deref().map_or(String::new(), |b| format!(" ({b})")),
    );
    println!(
        "  {:<22} {:>9}  {:>22}  {:>26}  {:>22}  {:>20}",
        "row",
        "interval",
        "visible p50 / p99 / p99.9",
        "sink→output append p50/p99",
        "append→visible p50/p99",
        "transaction p50/p99"
    );
    let ms = |us: f64| format!("{:.1}", us / 1e3);
    for r in rows {
        let v = &r.visible_latency_us;
        let parts = r.parts.as_ref();
        let pair = |p: Option<&crate::lab::report::Percentiles>| {
            p.map_or("-".to_string(), |p| format!("{} / {} ms", ms(p.p50), ms(p.p99)))
        };
        println!(
            "  {:<22} {:>6} ms  {:>22}  {:>26}  {:>22}  {:>20}",
            format!("{}·kafka", r.run.mode),
            r.run.checkpoint_interval_ms,
            format!("{} / {} / {} ms", ms(v.p50), ms(v.p99), ms(v.p999)),
            pair(parts.map(|p| &p.sink_to_append_us)),
            pair(parts.map(|p| &p.append_to_visible_us)),
            pair(parts.and_then(|p| p.transaction_us.as_ref())),
        );
    }
    match floor {
        Ok(f) => println!(
            "  the broker's own round trip, one record at a time (Kafka's EndToEndLatency, {FLOOR_RECORDS} records, \
             acks=all), in the same run: p50 {} / p99 {} / p99.9 {} ms; a record here crosses the broker twice",
            f.p50_ms, f.p99_ms, f.p999_ms
        ),
        Err(why) => println!("  the broker's own round trip: not measured ({why})"),
    }
    let two = floor.as_ref().ok().map(|f| 2.0 * f.p99_ms);
    if let (Some(alo), Some(two)) = (rows.iter().find(|r| r.run.mode == "at-least-once"), two) {
        println!(
            "- through Kafka, at-least-once's visible p99 {:.1} ms was {:.1}x the broker's two crossings at p99 ({two:.0} ms)",
            alo.visible_latency_us.p99 / 1e3,
            alo.visible_latency_us.p99 / 1e3 / two
        );
    }
    if let Some(alo) = rows.iter().find(|r| r.run.mode == "at-least-once") {
        for r in rows.iter().filter(|r| r.run.mode != "at-least-once") {
            let p99 = r.visible_latency_us.p99 / 1e3;
            let beyond = p99 - r.run.checkpoint_interval_ms as f64 - two.unwrap_or(0.0);
            println!(
                "- through Kafka, exactly-once at {} ms showed visible p99 {:.1} ms against at-least-once's {:.1} ms: \
                 {:.1} ms beyond its interval{}{}",
                r.run.checkpoint_interval_ms,
                p99,
                alo.visible_latency_us.p99 / 1e3,
                beyond,
                if two.is_some() {
                    " and the broker's two crossings"
                } else {
                    ""
                },
                r.parts.as_ref().map_or(String::new(), |p| format!(
                    "; at the median a record waited {:.1} ms for its checkpoint and its transaction's produce, \
                     then {:.1} ms for the commit and the reader",
                    p.sink_to_append_us.p50 / 1e3,
                    p.append_to_visible_us.p50 / 1e3
                )),
            );
        }
    }
}

/// One `compare.json` line of a Kafka row.
#[derive(Serialize)]
struct JsonLine<'a> {
    run: &'static str,
    row: String,
    interval_ms: u64,
    #[serde(flatten)]
    result: &'a KafkaBenchResult,
}

/// The Kafka rows as `compare.json` lines (`run: "kafka-open-loop"`),
/// after the broker floor's (`run: "kafka-broker-floor"`, its percentiles
/// or why it was not measured).
pub fn json_lines(rows: &[KafkaBenchResult], floor: &Result<BrokerFloor, String>) -> Vec<serde_json::Value> {
    #[derive(Serialize)]
    struct FloorLine<'a> {
        run: &'static str,
        #[serde(flatten)]
        floor: Option<&'a BrokerFloor>,
        #[serde(skip_serializing_if = "Option::is_none")]
        not_measured: Option<&'a str>,
    }
    let floor_line = serde_json::to_value(FloorLine {
        run: "kafka-broker-floor",
        floor: floor.as_ref().ok(),
        not_measured: floor.as_ref().err().map(String::as_str),
    })
    .expect("a floor always serialises");
    std::iter::once(floor_line)
        .chain(rows.iter().map(|r| {
            serde_json::to_value(JsonLine {
                run: "kafka-open-loop",
                row: format!("{}·kafka", r.run.mode),
                interval_ms: r.run.checkpoint_interval_ms,
                result: r,
            })
            .expect("a result always serialises")
        }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tools_percentiles_are_read() {
        let f =
            parse_floor("3000\t0.8\nAvg latency: 1.2812 ms\nPercentiles: 50th = 1, 99th = 5, 99.9th = 14\n").unwrap();
        assert_eq!((f.p50_ms, f.p99_ms, f.p999_ms), (1.0, 5.0, 14.0));
        assert!(parse_floor("Avg latency: 1 ms").is_none());
        assert!(parse_floor("Percentiles: 50th = x").is_none());
    }
}
