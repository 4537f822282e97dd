//! The stateless operators: `map`, `filter`, `flat_map`, and the sink at the
//! end of a chain. Each works on a whole batch in a tight loop.

use crate::checkpoint::snapshot::{AsyncOutput, TaskSnapshot};
use crate::collector::{forward_control, Collector, Notice, RestoreCtx};
use crate::context::{SinkContext, TaskContext};
use crate::error::BoxError;
use crate::message::Barrier;
use crate::sink::Sink;

pub(crate) struct Map<T, U, F> {
    pub(crate) f: F,
    pub(crate) out: Vec<U>,
    pub(crate) next: Box<dyn Collector<U>>,
    pub(crate) op: usize,
    pub(crate) _in: std::marker::PhantomData<fn(T)>,
}

impl<T, U: Send, F: FnMut(T) -> U + Send> Collector<T> for Map<T, U, F> {
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        self.out.extend(batch.drain(..).map(&mut self.f));
        self.next.collect(&mut self.out, ctx)
    }
    forward_control!();
}

pub(crate) struct Filter<T, F> {
    pub(crate) f: F,
    pub(crate) next: Box<dyn Collector<T>>,
    pub(crate) op: usize,
}

impl<T, F: FnMut(&T) -> bool + Send> Collector<T> for Filter<T, F> {
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        // In place: the surviving records are handed on in the same vector.
        batch.retain(|x| (self.f)(x));
        self.next.collect(batch, ctx)
    }
    forward_control!();
}

pub(crate) struct FlatMap<T, U, I, F> {
    pub(crate) f: F,
    pub(crate) out: Vec<U>,
    pub(crate) next: Box<dyn Collector<U>>,
    pub(crate) op: usize,
    pub(crate) _in: std::marker::PhantomData<fn(T) -> I>,
}

impl<T, U, I, F> Collector<T> for FlatMap<T, U, I, F>
where
    U: Send,
    I: IntoIterator<Item = U>,
    F: FnMut(T) -> I + Send,
{
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        // A plain loop: `extend` over a `flat_map` adapter re-checks the
        // adapter's inner iterators per record and kept the user function
        // out of line.
        for record in batch.drain(..) {
            for out in (self.f)(record) {
                self.out.push(out);
            }
        }
        self.next.collect(&mut self.out, ctx)
    }
    forward_control!();
}

/// The end of a chain that writes into a user [`Sink`].
pub(crate) struct SinkTail<S> {
    pub(crate) sink: S,
    pub(crate) op: usize,
}

impl<T, S: Sink<T>> Collector<T> for SinkTail<S> {
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        if batch.is_empty() {
            return Ok(());
        }
        ctx.current_op = self.op;
        ctx.count_out::<T>(batch.len());
        // Latency is measured when the sink receives the batch: drop the
        // turn's cached reading (taken before the chain ran) so the sink's
        // first `now_ns` reads the clock afresh, once per batch.
        ctx.turn_now_ns = None;
        self.sink.write(batch, &mut SinkContext { task: ctx })?;
        batch.clear();
        Ok(())
    }
    fn flush(&mut self, ctx: &mut TaskContext) -> Result<bool, BoxError> {
        // The sink's own backpressure: its thread has too much in flight
        // (or, after `finish`, is not done yet).
        ctx.current_op = self.op;
        self.sink.ready(&mut SinkContext { task: ctx })
    }
    fn finish(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        self.sink.finish(&mut SinkContext { task: ctx })?;
        ctx.publish_latency();
        Ok(())
    }
    fn open(&mut self, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        self.sink.open(&mut SinkContext { task: ctx })
    }
    fn barrier(&mut self, barrier: Barrier, snap: &mut TaskSnapshot, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        match self.sink.pre_commit_detached(barrier.id)?.into_job() {
            Ok(state) => snap.put_operator(self.op, state),
            // The waits run on the snapshot pool; the state joins the
            // task's when they are done, and the acknowledgement follows.
            Err(job) => snap.put_async(
                self.op,
                Box::new(move |_root| {
                    Ok(AsyncOutput {
                        state: job()?,
                        files: Vec::new(),
                        // Counted with the task's operator states already.
                        state_bytes: 0,
                        wrote_shared: false,
                    })
                }),
            ),
        }
        Ok(())
    }
    fn notify(&mut self, notice: Notice, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        match notice {
            Notice::Complete(id) => self.sink.commit(id),
            Notice::Abort(id) => self.sink.abort(id),
        }
    }
    fn restore(&mut self, r: &RestoreCtx<'_>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        let Some(own) = r.own else {
            return Err(format!(
                "sink state cannot be redistributed: restore with the parallelism of checkpoint {}",
                r.checkpoint
            )
            .into());
        };
        match own.operator(self.op) {
            Some(state) => self.sink.restore(r.checkpoint, state),
            None => Ok(()),
        }
    }
    fn watermark(&mut self, _wm: i64, _ctx: &mut TaskContext) -> Result<(), BoxError> {
        Ok(())
    }
    fn tick(&mut self, _ctx: &mut TaskContext) -> Result<(), BoxError> {
        Ok(())
    }
}
