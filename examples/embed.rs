//! Embedding weir: a sensor-average job built with the library API.
//!
//! A custom [`Source`] emits temperature readings from [`SENSORS`] sensors;
//! `key_by` sends every reading of one sensor to the same subtask, where
//! `process` keeps a running mean per sensor; a custom [`Sink`] keeps the
//! latest mean of each sensor, records end-to-end latency, and prints its
//! sensors when the stream ends. `main` then prints the job's metrics.
//!
//! ```text
//! sensors (source, p=2) --key_by(sensor)--> running-mean -> print (p=2)
//! ```
//!
//! Run it with `cargo run --release -p weir-bench --example embed`.

use weir_core::{BoxError, Output, Pipeline, RuntimeConfig, Sink, SinkContext, Source, SourceContext, SourcePoll};

/// Distinct sensors (keys).
const SENSORS: u64 = 16;
/// Readings emitted in total, over all source subtasks.
const READINGS: u64 = 2_000_000;
/// Parallelism of the source and of the keyed operator.
const PARALLELISM: usize = 2;

/// One temperature reading, stamped by the source.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Reading {
    sensor: u64,
    millicelsius: i64,
    /// When the source emitted it, on `weir_core::clock`.
    emitted_ns: u64,
}

/// The running mean of one sensor after one more reading.
#[derive(Debug, Clone, Copy)]
struct Mean {
    sensor: u64,
    readings: u64,
    celsius: f64,
    /// Carried over from the reading, for the latency measurement.
    emitted_ns: u64,
}

/// SplitMix64 finaliser: a deterministic pseudo-random word per sequence number.
fn mix(seq: u64) -> u64 {
    let mut z = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Sensor `s` reads around `15 + s` degrees, within half a degree.
fn reading(seq: u64) -> (u64, i64) {
    let r = mix(seq);
    let sensor = r % SENSORS;
    let noise = ((r >> 32) % 1001) as i64 - 500;
    (sensor, (15 + sensor as i64) * 1000 + noise)
}

/// Emits the readings `subtask, subtask + parallelism, ...` below [`READINGS`].
struct Sensors {
    next: u64,
    stride: u64,
}

impl Source<Reading> for Sensors {
    fn poll(
        &mut self,
        out: &mut Vec<Reading>,
        max: usize,
        ctx: &mut SourceContext<'_>,
    ) -> Result<SourcePoll, BoxError> {
        // One clock reading per call stamps the whole batch.
        let now = ctx.now_ns();
        while out.len() < max && self.next < READINGS {
            let (sensor, millicelsius) = reading(self.next);
            out.push(Reading {
                sensor,
                millicelsius,
                emitted_ns: now,
            });
            self.next += self.stride;
        }
        Ok(if self.next >= READINGS {
            SourcePoll::Done
        } else {
            SourcePoll::Ready
        })
    }
}

/// Per-sensor state of the keyed operator: plain data, kept inline in the
/// memory-mapped state backend.
#[derive(Default, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Sum {
    readings: u64,
    millicelsius: i64,
}

/// Keeps the latest mean per sensor and prints them at end of stream.
struct PrintSink {
    latest: Vec<Option<Mean>>,
}

impl Sink<Mean> for PrintSink {
    fn write(&mut self, batch: &mut Vec<Mean>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        for m in batch.drain(..) {
            ctx.record_latency(m.emitted_ns);
            self.latest[m.sensor as usize] = Some(m);
        }
        Ok(())
    }

    fn finish(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        // One print per subtask, so the two sinks' lines do not interleave.
        let mut text = String::new();
        for m in self.latest.iter().flatten() {
            text += &format!(
                "  sink {}: sensor {:2}: {:7} readings, mean {:.3} °C\n",
                ctx.subtask(),
                m.sensor,
                m.readings,
                m.celsius
            );
        }
        print!("{text}");
        Ok(())
    }
}

fn main() -> Result<(), BoxError> {
    let pipeline = Pipeline::new("sensor-mean");
    pipeline
        .source("sensors", PARALLELISM, |i, p| Sensors {
            next: i as u64,
            stride: p as u64,
        })
        .key_by(|r: &Reading| r.sensor)
        .parallelism(PARALLELISM)
        .process(|sensor: &u64, sum: &mut Sum, r: Reading, out: &mut Output<Mean>| {
            sum.readings += 1;
            sum.millicelsius += r.millicelsius;
            out.emit(Mean {
                sensor: *sensor,
                readings: sum.readings,
                celsius: sum.millicelsius as f64 / sum.readings as f64 / 1000.0,
                emitted_ns: r.emitted_ns,
            });
        })
        .name("running-mean")
        .sink("print", |_| PrintSink {
            latest: vec![None; SENSORS as usize],
        });

    println!("final means:");
    let result = pipeline.run(RuntimeConfig::default())?.join()?;

    let metrics = &result.metrics;
    let seconds = result.elapsed.as_secs_f64();
    println!(
        "\n{:?}: {READINGS} readings in {:.1} ms ({:.1} M readings/s)",
        result.outcome,
        seconds * 1e3,
        READINGS as f64 / seconds / 1e6
    );
    // Bytes are the records' in-memory size (records x size_of their type),
    // since nothing is serialized between tasks.
    println!("records (and bytes) per task:");
    for t in &metrics.tasks {
        println!(
            "  {:<30} {}/{}  in {:>9} ({:>10} B)  out {:>9} ({:>10} B)",
            t.name, t.subtask, t.parallelism, t.records_in, t.bytes_in, t.records_out, t.bytes_out
        );
    }
    // The source runs at full speed, so this latency is mostly time spent
    // waiting in full rings (backpressure), not processing time.
    let lat = &metrics.latency_ns;
    println!(
        "latency source -> sink: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs over {} records",
        lat.value_at_quantile(0.50) as f64 / 1e3,
        lat.value_at_quantile(0.99) as f64 / 1e3,
        lat.max() as f64 / 1e3,
        lat.len()
    );

    // Every reading reached a sink exactly once.
    let written: u64 = metrics
        .tasks
        .iter()
        .filter(|t| t.name.ends_with("print"))
        .map(|t| t.records_out)
        .sum();
    assert_eq!(written, READINGS, "every reading reaches the sink");
    assert_eq!(lat.len(), READINGS, "every reading's latency is recorded");
    Ok(())
}
