//! Drive a [`Source`] or [`Sink`] by hand, outside a running job: for unit
//! tests of sources and sinks, in this workspace and in users' crates.
//!
//! ```
//! use weir_core::harness::Harness;
//! use weir_core::{SourcePoll, VecSource};
//! use std::sync::Arc;
//!
//! let mut src = VecSource::new(Arc::new(vec![1, 2, 3]), 0, 1);
//! let mut h = Harness::new(0, 1);
//! let mut out = Vec::new();
//! assert_eq!(h.poll_source(&mut src, &mut out, 10).unwrap(), SourcePoll::Done);
//! assert_eq!(out, vec![1, 2, 3]);
//! ```

use std::sync::Arc;

use crate::context::{SinkContext, SourceContext, TaskContext};
use crate::error::BoxError;
use crate::metrics::{MetricsRegistry, TaskCounters};
use crate::sink::Sink;
use crate::source::{Source, SourcePoll};

/// A stand-alone task context for one subtask.
pub struct Harness {
    task: TaskContext,
}

impl Harness {
    /// A context for subtask `subtask` of `parallelism`.
    pub fn new(subtask: usize, parallelism: usize) -> Self {
        let counters = Arc::new(TaskCounters::new("harness".into(), subtask, parallelism, 0));
        let registry = Arc::new(MetricsRegistry::new(vec![counters.clone()]));
        Harness {
            task: TaskContext::new(
                subtask,
                parallelism,
                vec!["harness".to_string()].into(),
                counters,
                registry,
            ),
        }
    }

    /// One scheduling turn of a source: appends at most `max` records.
    pub fn poll_source<T, S: Source<T>>(
        &mut self,
        source: &mut S,
        out: &mut Vec<T>,
        max: usize,
    ) -> Result<SourcePoll, BoxError> {
        let r = source.poll(out, max, &mut SourceContext { task: &mut self.task });
        self.task.end_turn();
        r
    }

    /// One scheduling turn of a sink: writes `batch`.
    pub fn write_sink<T, S: Sink<T>>(&mut self, sink: &mut S, batch: &mut Vec<T>) -> Result<(), BoxError> {
        let r = sink.write(batch, &mut SinkContext { task: &mut self.task });
        self.task.end_turn();
        r
    }

    /// Ends a sink's stream.
    pub fn finish_sink<T, S: Sink<T>>(&mut self, sink: &mut S) -> Result<(), BoxError> {
        let r = sink.finish(&mut SinkContext { task: &mut self.task });
        self.task.publish_latency();
        r
    }

    /// Latencies recorded through this harness so far (published on finish).
    pub fn latency_ns(&self) -> hdrhistogram::Histogram<u64> {
        self.task.registry.snapshot().latency_ns
    }

    /// Visibility latencies recorded so far (published on finish).
    pub fn visible_latency_ns(&self) -> hdrhistogram::Histogram<u64> {
        self.task.registry.snapshot().visible_latency_ns
    }
}
