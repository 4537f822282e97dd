//! The stateless operators: `map`, `filter`, `flat_map`, and the sink at the
//! end of a chain. Each works on a whole batch in a tight loop.

use crate::checkpoint::snapshot::{AsyncOutput, TaskSnapshot};
use crate::error::BoxError;
use crate::runtime::collector::{forward_control, Collector, Notice, RestoreCtx};
use crate::runtime::context::{SinkContext, TaskContext};
use crate::runtime::message::Barrier;
use crate::runtime::sink::Sink;

pub(crate) struct Map<T, U, F> {
    pub(crate) f: F,
    pub(crate) out: Vec<U>,
    pub(crate) next: Box<dyn Collector<U>>,
    pub(crate) op: usize,
    pub(crate) _in: std::marker::PhantomData<fn(T)>,
}

/// True when a `U` fits exactly where a `T` was (same size and alignment,
/// not zero-sized): `Vec<T>` then becomes `Vec<U>` in its own buffer.
const fn same_layout<T, U>() -> bool {
    std::mem::size_of::<T>() == std::mem::size_of::<U>()
        && std::mem::align_of::<T>() == std::mem::align_of::<U>()
        && std::mem::size_of::<T>() > 0
}

impl<T, U: Send, F: FnMut(T) -> U + Send> Collector<T> for Map<T, U, F> {
    #[inline]
    fn collect(&mut self, batch: &mut Vec<T>, ctx: &mut TaskContext) -> Result<(), BoxError> {
        ctx.current_op = self.op;
        if same_layout::<T, U>() && self.out.is_empty() {
            // In place: each record becomes its output in the batch's own
            // buffer (the standard library's collect of a vector's
            // `into_iter().map(..)` reuses the allocation when the layouts
            // match), is handed on, and the emptied buffer goes back to the
            // batch the same way. One pass over one buffer instead of a
            // read of one and a write of another.
            let mut out: Vec<U> = std::mem::take(batch).into_iter().map(&mut self.f).collect();
            let handed = self.next.collect(&mut out, ctx);
            // What the rest of the chain left (it failed) waits in `out`,
            // as it would have on the copying path.
            self.out.append(&mut out);
            *batch = out
                .into_iter()
                .map(|_| unreachable!("the vector was emptied"))
                .collect();
            return handed;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A chain end that takes what it is handed, or fails leaving it.
    struct Take<U> {
        got: Arc<Mutex<Vec<U>>>,
        fail: bool,
    }

    impl<U: Send> Collector<U> for Take<U> {
        fn collect(&mut self, batch: &mut Vec<U>, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            if self.fail {
                return Err("the chain's end failed".into());
            }
            self.got.lock().unwrap().extend(batch.drain(..));
            Ok(())
        }
        fn flush(&mut self, _ctx: &mut TaskContext) -> Result<bool, BoxError> {
            Ok(true)
        }
        fn finish(&mut self, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            Ok(())
        }
        fn barrier(&mut self, _b: Barrier, _s: &mut TaskSnapshot, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            Ok(())
        }
        fn notify(&mut self, _n: Notice, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            Ok(())
        }
        fn restore(&mut self, _r: &RestoreCtx<'_>, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            Ok(())
        }
        fn watermark(&mut self, _wm: i64, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            Ok(())
        }
        fn tick(&mut self, _ctx: &mut TaskContext) -> Result<(), BoxError> {
            Ok(())
        }
    }

    fn ctx() -> TaskContext {
        TaskContext::for_test("map", 0, 0).0
    }

    /// What the chain's end took.
    type Got<U> = Arc<Mutex<Vec<U>>>;

    fn map<T, U: Send + 'static, F: FnMut(T) -> U + Send>(f: F, fail: bool) -> (Map<T, U, F>, Got<U>) {
        let got = Arc::new(Mutex::new(Vec::new()));
        let m = Map {
            f,
            out: Vec::new(),
            next: Box::new(Take { got: got.clone(), fail }),
            op: 0,
            _in: std::marker::PhantomData,
        };
        (m, got)
    }

    /// A map between types of one layout hands on every output in order
    /// and leaves the batch empty in its own buffer: no allocation per
    /// batch, round after round (the standard library's in-place collect
    /// reused the allocation both ways).
    #[test]
    fn a_map_in_place_keeps_the_batch_s_buffer() {
        let (mut m, got) = map(|x: u64| -(x as i64) - 1, false);
        let mut ctx = ctx();
        let mut batch: Vec<u64> = Vec::with_capacity(64);
        let (ptr, cap) = (batch.as_ptr(), batch.capacity());
        for round in 0..3u64 {
            batch.extend(round * 50..round * 50 + 50);
            m.collect(&mut batch, &mut ctx).unwrap();
            assert!(batch.is_empty());
            assert_eq!((batch.as_ptr(), batch.capacity()), (ptr, cap), "round {round}");
        }
        let expected: Vec<i64> = (0..150).map(|x| -x - 1).collect();
        assert_eq!(*got.lock().unwrap(), expected);
    }

    /// Values that own memory are moved, never dropped twice; a map to a
    /// type of another layout copies as before.
    #[test]
    fn a_map_of_owned_values_and_of_another_layout_hands_on_every_output() {
        let (mut m, got) = map(|s: String| format!("<{s}>"), false);
        let mut ctx = ctx();
        let mut batch: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        m.collect(&mut batch, &mut ctx).unwrap();
        let expected: Vec<String> = (0..10).map(|i| format!("<{i}>")).collect();
        assert_eq!(*got.lock().unwrap(), expected);

        let (mut narrow, got) = map(|x: u64| x as u32, false);
        let mut batch: Vec<u64> = (0..10).collect();
        narrow.collect(&mut batch, &mut ctx).unwrap();
        assert!(batch.is_empty());
        assert_eq!(*got.lock().unwrap(), (0..10).collect::<Vec<u32>>());
    }

    /// When the rest of the chain fails, what it did not take stays with
    /// the map (as on the copying path), and the batch is left empty.
    #[test]
    fn what_a_failed_chain_left_stays_with_the_map() {
        let (mut m, got) = map(|x: u64| x + 1, true);
        let mut ctx = ctx();
        let mut batch: Vec<u64> = (0..5).collect();
        assert!(m.collect(&mut batch, &mut ctx).is_err());
        assert!(batch.is_empty());
        assert!(got.lock().unwrap().is_empty());
        assert_eq!(m.out, vec![1, 2, 3, 4, 5]);
    }
}
