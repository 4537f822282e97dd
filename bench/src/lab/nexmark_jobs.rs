//! The in-process Nexmark jobs of `weir bench --pipeline nexmark-qN`:
//! the queries of `weir nexmark` ([`crate::cmd::nexmark::queries`]) over
//! the generator, their rows counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use weir_core::time::WatermarkStrategy;
use weir_core::{BoxError, Pipeline, Sink, SinkContext};
use weir_io::nexmark::{Event, NexmarkConfig, NexmarkSource};

use crate::cmd::nexmark::queries::{self, Query, Row};

/// Counts rows (the in-process benchmark's sink).
pub struct RowCount {
    count: u64,
    total: Arc<AtomicU64>,
}

impl RowCount {
    /// A sink adding its count into `total` when it finishes.
    pub fn new(total: Arc<AtomicU64>) -> Self {
        RowCount { count: 0, total }
    }
}

impl Sink<Row> for RowCount {
    fn write(&mut self, batch: &mut Vec<Row>, _: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.count += batch.len() as u64;
        batch.clear();
        Ok(())
    }
    fn finish(&mut self, _: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.total.fetch_add(self.count, Ordering::Relaxed);
        Ok(())
    }
}

/// Event-time rate of the in-process benchmark's events: the
/// nexmark-flink default (10 M events per second of event time).
pub const BENCH_EVENT_RATE: u64 = 10_000_000;

/// The in-process benchmark job of query `q`: `events` generated events
/// over `parallelism` generator subtasks, rows counted into `total`.
pub fn bench_pipeline(q: Query, events: u64, seed: u64, parallelism: usize, total: Arc<AtomicU64>) -> Pipeline {
    let cfg = NexmarkConfig {
        seed,
        events_per_second: BENCH_EVENT_RATE,
        ..NexmarkConfig::default()
    };
    let pipeline = Pipeline::new(&format!("bench-nexmark-{}", q.name()));
    let stream = pipeline
        .source("nexmark", parallelism, move |i, n| {
            NexmarkSource::new(cfg, Some(events), i, n).expect("the generator settings are valid")
        })
        .assign_watermarks(WatermarkStrategy::ascending(|e: &Event| e.date_time()).periodic_ms(10));
    queries::build(q, stream, parallelism).sink("count", move |_| RowCount::new(total.clone()));
    pipeline
}
