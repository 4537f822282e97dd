//! Tasks: the unit a worker schedules. A task is one parallel instance of
//! a chain of fused operators, driven either by a source or by its input
//! rings.
//!
//! A task never blocks. One call of [`Task::poll`] does at most one batch
//! budget of work and returns; when its output is backpressured or its
//! input is empty it returns [`TaskPoll::Idle`] and the worker runs other
//! tasks or backs off. That is what lets several tasks share one worker
//! without deadlock, even when producer and consumer share it.

use rtrb::Consumer;

use crate::collector::Collector;
use crate::context::{SourceContext, TaskContext};
use crate::error::BoxError;
use crate::message::Message;
use crate::source::{Source, SourcePoll};

/// What one scheduling turn of a task achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskPoll {
    /// Did some work; poll again soon.
    Progress,
    /// Could not do anything (no input, or output backpressured).
    Idle,
    /// Finished: end-of-stream was handed on; never poll again.
    Done,
}

pub(crate) trait Task: Send {
    fn poll(&mut self, ctx: &mut TaskContext) -> Result<TaskPoll, BoxError>;
}

/// Lifecycle of a task; shared by both drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// End-of-stream was handed to the chain; waiting for output to drain.
    Draining,
    Done,
}

/// Drains pending output; the common first step of every turn.
fn drain_phase<T>(
    phase: &mut Phase,
    chain: &mut dyn Collector<T>,
    ctx: &mut TaskContext,
) -> Result<Option<TaskPoll>, BoxError> {
    match *phase {
        Phase::Done => Ok(Some(TaskPoll::Done)),
        Phase::Draining => {
            if chain.flush(ctx)? {
                *phase = Phase::Done;
                Ok(Some(TaskPoll::Done))
            } else {
                Ok(Some(TaskPoll::Idle))
            }
        }
        Phase::Running => {
            if chain.flush(ctx)? {
                Ok(None)
            } else {
                Ok(Some(TaskPoll::Idle))
            }
        }
    }
}

/// A task whose chain starts at a source.
pub(crate) struct SourceTask<T, S> {
    source: S,
    chain: Box<dyn Collector<T>>,
    batch: Vec<T>,
    batch_size: usize,
    phase: Phase,
}

impl<T, S> SourceTask<T, S> {
    pub(crate) fn new(source: S, chain: Box<dyn Collector<T>>, batch_size: usize) -> Self {
        SourceTask {
            source,
            chain,
            batch: Vec::with_capacity(batch_size),
            batch_size,
            phase: Phase::Running,
        }
    }
}

impl<T: Send, S: Source<T>> Task for SourceTask<T, S> {
    fn poll(&mut self, ctx: &mut TaskContext) -> Result<TaskPoll, BoxError> {
        if let Some(p) = drain_phase(&mut self.phase, &mut *self.chain, ctx)? {
            return Ok(p);
        }
        ctx.current_op = 0;
        let status = self
            .source
            .poll(&mut self.batch, self.batch_size, &mut SourceContext { task: ctx })?;
        let emitted = self.batch.len();
        ctx.records_in += emitted as u64;
        if emitted > 0 {
            self.chain.collect(&mut self.batch, ctx)?;
            self.batch.clear();
        }
        match status {
            SourcePoll::Done => {
                self.chain.finish(ctx)?;
                self.phase = Phase::Draining;
                Ok(TaskPoll::Progress)
            }
            SourcePoll::Ready if emitted > 0 => Ok(TaskPoll::Progress),
            SourcePoll::Ready | SourcePoll::Idle => Ok(TaskPoll::Idle),
        }
    }
}

/// One input channel of a task.
pub(crate) struct Inbox<T> {
    ring: Consumer<Message<T>>,
    ended: bool,
}

impl<T> Inbox<T> {
    pub(crate) fn new(ring: Consumer<Message<T>>) -> Self {
        Inbox { ring, ended: false }
    }
}

/// A task whose chain starts at its input rings.
pub(crate) struct InputTask<T> {
    inputs: Vec<Inbox<T>>,
    chain: Box<dyn Collector<T>>,
    batch: Vec<T>,
    batch_size: usize,
    /// Input to read first next turn: rotates for fairness between inputs.
    next_input: usize,
    open_inputs: usize,
    phase: Phase,
}

impl<T> InputTask<T> {
    pub(crate) fn new(inputs: Vec<Inbox<T>>, chain: Box<dyn Collector<T>>, batch_size: usize) -> Self {
        assert!(!inputs.is_empty(), "an input task needs at least one input ring");
        let open_inputs = inputs.len();
        InputTask {
            inputs,
            chain,
            batch: Vec::with_capacity(batch_size),
            batch_size,
            next_input: 0,
            open_inputs,
            phase: Phase::Running,
        }
    }
}

impl<T: Send> Task for InputTask<T> {
    fn poll(&mut self, ctx: &mut TaskContext) -> Result<TaskPoll, BoxError> {
        if let Some(p) = drain_phase(&mut self.phase, &mut *self.chain, ctx)? {
            return Ok(p);
        }
        let mut budget = self.batch_size;
        let mut progressed = false;
        let mut queued = 0u64;
        let n_inputs = self.inputs.len();
        for k in 0..n_inputs {
            let i = (self.next_input + k) % n_inputs;
            let inbox = &mut self.inputs[i];
            if inbox.ended {
                continue;
            }
            let available = inbox.ring.slots();
            queued += available as u64;
            let n = available.min(budget);
            if n == 0 {
                continue;
            }
            budget -= n;
            progressed = true;
            let chunk = inbox
                .ring
                .read_chunk(n)
                .expect("slots() promised n readable slots and only this consumer reads");
            for message in chunk {
                match message {
                    Message::Data(record) => self.batch.push(record),
                    Message::End => {
                        inbox.ended = true;
                        self.open_inputs -= 1;
                    }
                    Message::Barrier(_) | Message::Watermark(_) => {
                        unreachable!("no producer emits barriers or watermarks without checkpointing/event time")
                    }
                }
            }
            ctx.records_in += self.batch.len() as u64;
            if !self.batch.is_empty() {
                self.chain.collect(&mut self.batch, ctx)?;
                self.batch.clear();
            }
            if budget == 0 {
                break;
            }
        }
        self.next_input = (self.next_input + 1) % n_inputs;
        ctx.counters
            .input_queued
            .store(queued, std::sync::atomic::Ordering::Relaxed);
        if self.open_inputs == 0 {
            self.chain.finish(ctx)?;
            self.phase = Phase::Draining;
            return Ok(TaskPoll::Progress);
        }
        Ok(if progressed { TaskPoll::Progress } else { TaskPoll::Idle })
    }
}
