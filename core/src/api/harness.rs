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

use crate::error::BoxError;
use crate::runtime::context::{SinkContext, SourceContext, TaskContext};
use crate::runtime::metrics::{MetricsRegistry, TaskCounters};
use crate::runtime::sink::Sink;
use crate::runtime::source::{Source, SourcePoll};

/// A stand-alone task context for one subtask.
pub struct Harness {
    task: TaskContext,
    /// Watermarks the polled sources emitted (`None`: idle), oldest first.
    watermarks: Vec<Option<i64>>,
}

impl Harness {
    /// A context for subtask `subtask` of `parallelism`.
    pub fn new(subtask: usize, parallelism: usize) -> Self {
        let counters = Arc::new(TaskCounters::new("harness".into(), subtask, parallelism, 0, 0));
        let registry = Arc::new(MetricsRegistry::new(vec![counters.clone()]));
        Harness {
            task: TaskContext::new(
                subtask,
                parallelism,
                vec!["harness".to_string()].into(),
                counters,
                registry,
            ),
            watermarks: Vec::new(),
        }
    }

    /// One scheduling turn of a source: appends at most `max` records.
    pub fn poll_source<T, S: Source<T>>(
        &mut self,
        source: &mut S,
        out: &mut Vec<T>,
        max: usize,
    ) -> Result<SourcePoll, BoxError> {
        let mut ctx = SourceContext::new(&mut self.task);
        let r = source.poll(out, max, &mut ctx);
        if let Some(wm) = ctx.watermark {
            self.watermarks.push((wm != crate::watermark::IDLE).then_some(wm));
        }
        self.task.end_turn();
        r
    }

    /// The watermarks sources emitted through this harness since the last
    /// call ([`SourceContext::emit_watermark`]), oldest first; `None` for
    /// [`SourceContext::mark_idle`].
    ///
    /// ```
    /// use weir_core::harness::Harness;
    /// use weir_core::{BoxError, Source, SourceContext, SourcePoll};
    ///
    /// /// Timestamps 10, 20, 30, then nothing: idle.
    /// struct Ticks(i64);
    /// impl Source<i64> for Ticks {
    ///     fn poll(&mut self, out: &mut Vec<i64>, _: usize, ctx: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError> {
    ///         if self.0 == 30 {
    ///             ctx.mark_idle();
    ///             return Ok(SourcePoll::Idle);
    ///         }
    ///         self.0 += 10;
    ///         out.push(self.0);
    ///         ctx.emit_watermark(self.0 - 1);
    ///         Ok(SourcePoll::Ready)
    ///     }
    /// }
    ///
    /// let (mut h, mut src) = (Harness::new(0, 1), Ticks(0));
    /// for _ in 0..4 {
    ///     h.poll_source(&mut src, &mut Vec::new(), 10).unwrap();
    /// }
    /// assert_eq!(h.take_watermarks(), vec![Some(9), Some(19), Some(29), None]);
    /// ```
    pub fn take_watermarks(&mut self) -> Vec<Option<i64>> {
        std::mem::take(&mut self.watermarks)
    }

    /// One scheduling turn of a sink: writes `batch`.
    pub fn write_sink<T, S: Sink<T>>(&mut self, sink: &mut S, batch: &mut Vec<T>) -> Result<(), BoxError> {
        let r = sink.write(batch, &mut SinkContext { task: &mut self.task });
        self.task.end_turn();
        r
    }

    /// Asks a sink whether it can take more ([`Sink::ready`]): it takes
    /// its thread's replies and records their latencies.
    pub fn ready_sink<T, S: Sink<T>>(&mut self, sink: &mut S) -> Result<bool, BoxError> {
        let r = sink.ready(&mut SinkContext { task: &mut self.task });
        self.task.end_turn();
        r
    }

    /// Asks a sink [`Sink::ready`] until it says true, as a worker would
    /// (at most [`Harness::SETTLE_LIMIT`]): after a write, until its thread
    /// took the data; after `finish`, until everything finished.
    pub fn settle_sink<T, S: Sink<T>>(&mut self, sink: &mut S) -> Result<(), BoxError> {
        let start = std::time::Instant::now();
        while !self.ready_sink(sink)? {
            if start.elapsed() > Self::SETTLE_LIMIT {
                return Err(format!("the sink was not ready within {:?}", Self::SETTLE_LIMIT).into());
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        Ok(())
    }

    /// How long [`Harness::settle_sink`] and [`Harness::finish_sink`] wait
    /// for a sink: 60 s, far beyond any disk wait of a working machine.
    pub const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

    /// Ends a sink's stream, as the runtime does: `finish`, then
    /// [`Sink::ready`] until everything finished.
    pub fn finish_sink<T, S: Sink<T>>(&mut self, sink: &mut S) -> Result<(), BoxError> {
        let r = sink
            .finish(&mut SinkContext { task: &mut self.task })
            .and_then(|_| self.settle_sink(sink));
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
