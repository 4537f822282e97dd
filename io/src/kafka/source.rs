//! [`KafkaSource`]: one subtask of a replayable source over a Kafka topic.
//!
//! - **Partitions**: subtask `i` of `p` reads the topic's partitions `q`
//!   with `q mod p == i`, assigned directly (`assign`, never `subscribe`:
//!   no group rebalancing can move a partition away from the subtask whose
//!   checkpoint holds its offset). With [`KafkaSourceConfig::shard`]
//!   (`s` of `S`), only the partitions `q mod S == s` are read, subtask `i`
//!   taking those with `(q / S) mod p == i`. A subtask may get several partitions or
//!   none; one with none is finished at once when bounded, and otherwise
//!   marks itself idle, so it never holds event time back. The partitions
//!   are listed once, at start: partitions added later are not read until
//!   the job restarts (they are then read from their start).
//! - **Offsets**: the checkpoint stores, per partition, the offset of the
//!   next record to read (and, bounded, its end offset); a restore assigns
//!   exactly those offsets. A partition not in the restored state starts
//!   as [`KafkaSourceConfig::start_from`] says. A checkpoint taken before
//!   the setup below finished holds no offsets, and a restore from it
//!   starts as a fresh start would.
//! - **Transactions**: `isolation.level=read_committed`: records of aborted
//!   transactions are never read, nor those of open ones (the consumer
//!   stops at the last stable offset until they are decided).
//! - **Bounded**: the end offset of each partition is its high watermark
//!   at start, under `read_committed` its last stable offset (librdkafka
//!   asks for offsets at the consumer's isolation level). A partition is
//!   done when its next offset reaches the end, or when the consumer
//!   reports its end of partition (the last offsets before the end may be
//!   transaction markers or aborted records, which are never delivered);
//!   records at or after the end are dropped. The source is done when every
//!   partition is.
//! - **Watermarks** ([`KafkaSourceConfig::watermarks`]): per partition, its
//!   largest record timestamp minus the bound, minus 1; the subtask emits
//!   the minimum over partitions that are neither done nor idle
//!   ([`weir_core::SourceContext::emit_watermark`]), and marks itself idle
//!   when all are idle.
//! - **Lag** ([`Source::backlog`], the `weir_source_backlog` metric):
//!   records behind the end, summed over the subtask's partitions: to the
//!   end offsets when bounded, else to the high watermarks librdkafka
//!   keeps from its fetch responses (read once a second on the worker, a
//!   lock per partition, no request to the broker).
//! - **Records**: the value goes to the user's parse function with a
//!   [`KafkaRecordInfo`] (topic, partition, offset, timestamp, key); a
//!   rejected value fails the job with an error naming topic, partition and
//!   offset, or is skipped and counted ([`KafkaSourceConfig::skip_bad_records`]).
//!   A record without a value is handed over as an empty slice.
//!
//! **What runs where.** The worker only polls the consumer with a zero
//! timeout: librdkafka fetches on its own threads into a bounded buffer
//! (`queued.max.messages.kbytes`), and a poll hands over what is there,
//! borrowed from that buffer, at most `max` records per call. The setup,
//! which waits for the cluster (creating the consumer, the topic's
//! metadata, offsets by time or committed offsets, end offsets), runs on a
//! thread of the source's own ([`weir_core::io_thread::IoThread`], on the
//! job's helper cores) at the first poll; until it is done the source
//! returns [`SourcePoll::Idle`]. Offset commits to the group are
//! asynchronous client calls. Dropping the source (a failed attempt, the
//! end of the job) closes the consumer (or waits out a setup in progress)
//! on a short-lived thread of its own (`kafka::drop_detached`), since
//! closing waits for librdkafka without a bound.
//!
//! **Allocation**: none per record on weir's side; `rdkafka` allocates a
//! reference count per message it hands out. The parse function may.

use std::collections::VecDeque;
use std::ffi::CString;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use weir_core::io_thread::{IoHandler, IoThread};
use weir_core::time::MIN_WATERMARK;
use weir_core::{BoxError, Source, SourceContext, SourcePoll};

use super::{KafkaBadRecords, KafkaSourceConfig, KafkaSourceStats, StartFrom};
use crate::lines::{ParseError, MAX_QUOTED_TEXT};
use crate::{Error, Result};

/// Version byte of the offset encoding.
const OFFSET_VERSION: u8 = 1;

/// How often an unbounded subtask refreshes the partitions' high
/// watermarks for its lag ([`Source::backlog`]), in clock nanoseconds.
const LAG_REFRESH_NS: u64 = 1_000_000_000;

/// Checkpoints whose offsets wait for their completion to be committed to
/// the group; older ones are dropped (a later completion covers them).
const MAX_PENDING_COMMITS: usize = 16;

/// Where a record comes from, passed to the parse function with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaRecordInfo<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
    /// The record's offset in its partition.
    pub offset: i64,
    /// The record's Kafka timestamp (create or log-append time), epoch ms.
    pub timestamp_ms: Option<i64>,
    /// The record's key.
    pub key: Option<&'a [u8]>,
    /// The clock reading of this poll on [`weir_core::clock`], to stamp
    /// records with for latency measurements.
    pub emitted_ns: u64,
}

/// The consumer's callbacks: librdkafka's log, into `tracing`.
///
/// librdkafka reports the outcome of an asynchronous commit only to a
/// commit callback, which rust-rdkafka's event-based consumer does not
/// install; without one it logs a failed commit as a `COMMITFAIL` warning,
/// which is counted here ([`KafkaSourceStats::commit_failures`]).
pub(crate) struct KafkaContext {
    stats: Arc<KafkaSourceStats>,
}

impl ClientContext for KafkaContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if fac == "COMMITFAIL" {
            self.stats.add_commit_failure();
        }
        super::log_to_tracing(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // The client retries what it can; fatal errors also reach the poll.
        tracing::warn!(target: "librdkafka", "{error}: {reason}");
    }
}

impl ConsumerContext for KafkaContext {}

type Consumer_ = BaseConsumer<KafkaContext>;

/// One partition of this subtask.
#[derive(Debug, Clone)]
struct Part {
    partition: i32,
    /// Offset of the next record to read.
    next: i64,
    /// Bounded: stop before this offset.
    end: Option<i64>,
    done: bool,
    /// Largest record timestamp seen (watermarks).
    max_ts: i64,
    /// Clock reading of the last record (idleness).
    last_record_ns: u64,
    /// The partition's high watermark as the client last saw it in a
    /// fetch response (unbounded lag); -1 until known.
    high: i64,
}

impl Part {
    fn new(partition: i32, next: i64, end: Option<i64>) -> Self {
        Part {
            partition,
            next,
            end,
            done: end.is_some_and(|e| next >= e),
            max_ts: i64::MIN,
            last_record_ns: 0,
            high: -1,
        }
    }
}

/// What the setup thread is asked to do.
struct SetupRequest {
    config: KafkaSourceConfig,
    subtask: usize,
    parallelism: usize,
    /// Offsets from a restored checkpoint: (partition, next, end).
    restored: Option<Vec<(i32, i64, Option<i64>)>>,
}

/// What it hands back: a consumer assigned to this subtask's partitions.
struct Setup {
    consumer: Consumer_,
    parts: Vec<Part>,
}

struct SetupHandler;

impl IoHandler for SetupHandler {
    type Request = SetupRequest;
    type Reply = Setup;

    fn handle(&mut self, r: SetupRequest) -> std::result::Result<Setup, BoxError> {
        Ok(setup(r)?)
    }
}

/// Creates the consumer, lists the partitions, resolves start and end
/// offsets and assigns this subtask's partitions. Blocking: runs on the
/// setup thread (or wherever no worker waits).
fn setup(r: SetupRequest) -> Result<Setup> {
    let c = &r.config;
    let timeout = c.setup_timeout;
    let err = |context: String| {
        let brokers = c.brokers.clone();
        let topic = c.topic.clone();
        move |source: KafkaError| Error::Kafka {
            brokers,
            topic,
            context,
            source: Box::new(source),
        }
    };
    let topic_err = |reason: String| Error::KafkaTopic {
        brokers: c.brokers.clone(),
        topic: c.topic.clone(),
        reason,
    };
    let consumer: Consumer_ = c
        .client_config(r.subtask)
        .create_with_context(KafkaContext {
            stats: Arc::clone(&c.stats),
        })
        .map_err(err("create the consumer".into()))?;
    let metadata = consumer
        .fetch_metadata(Some(&c.topic), timeout)
        .map_err(err(format!("read the topic's metadata (timeout {timeout:?})")))?;
    let topic = metadata
        .topics()
        .iter()
        .find(|t| t.name() == c.topic)
        .ok_or_else(|| topic_err("the cluster returned no metadata for the topic".into()))?;
    if let Some(e) = topic.error() {
        let code = RDKafkaErrorCode::from(e);
        return Err(topic_err(if code == RDKafkaErrorCode::UnknownTopicOrPartition {
            "the topic does not exist: create it, or check the name and the brokers".into()
        } else {
            format!("the topic's metadata has an error: {code}")
        }));
    }
    let n = topic.partitions().len();
    if n == 0 {
        return Err(topic_err("the topic has no partitions".into()));
    }
    let mine: Vec<i32> = (0..n as i32)
        .filter(|&p| c.reads(p, r.subtask, r.parallelism))
        .collect();
    if let Some(restored) = &r.restored {
        if let Some((p, _, _)) = restored.iter().find(|(p, _, _)| *p as usize >= n) {
            return Err(topic_err(format!(
                "the checkpoint holds an offset of partition {p}, but the topic has {n} partitions now: \
                 partitions are never removed from a topic, so this is another topic of the same name"
            )));
        }
    }
    let restored_of = |p: i32| {
        r.restored
            .as_ref()
            .and_then(|v| v.iter().find(|(q, _, _)| *q == p).copied())
    };
    // Partitions that need a start offset looked up.
    let fresh: Vec<i32> = mine.iter().copied().filter(|&p| restored_of(p).is_none()).collect();
    let watermarks = |p: i32| {
        consumer
            .fetch_watermarks(&c.topic, p, timeout)
            .map_err(err(format!("read the low and high offsets of partition {p}")))
    };
    let mut starts: Vec<(i32, i64)> = Vec::with_capacity(fresh.len());
    if !fresh.is_empty() {
        let looked_up: Option<TopicPartitionList> = match c.start {
            StartFrom::Timestamp(ts) => {
                let mut tpl = TopicPartitionList::with_capacity(fresh.len());
                for &p in &fresh {
                    tpl.add_partition_offset(&c.topic, p, Offset::Offset(ts))
                        .map_err(err(format!("build the time look-up of partition {p}")))?;
                }
                Some(
                    consumer
                        .offsets_for_times(tpl, timeout)
                        .map_err(err(format!("look up offsets for time {ts} ms")))?,
                )
            }
            StartFrom::CommittedOrEarliest | StartFrom::CommittedOrLatest => {
                let mut tpl = TopicPartitionList::with_capacity(fresh.len());
                for &p in &fresh {
                    tpl.add_partition(&c.topic, p);
                }
                Some(
                    consumer
                        .committed_offsets(tpl, timeout)
                        .map_err(err(format!("read the committed offsets of group {:?}", c.group)))?,
                )
            }
            StartFrom::Earliest | StartFrom::Latest => None,
        };
        for &p in &fresh {
            let found = looked_up
                .as_ref()
                .and_then(|l| l.find_partition(&c.topic, p).map(|e| (e.offset(), e.error())));
            if let Some((_, Err(e))) = &found {
                return Err(err(format!("look up the start offset of partition {p}"))(e.clone()));
            }
            let (low, high) = watermarks(p)?;
            let start = match (c.start, found.map(|f| f.0)) {
                (StartFrom::Earliest, _) => low,
                (StartFrom::Latest, _) => high,
                (StartFrom::Timestamp(_), Some(Offset::Offset(o))) => o,
                // No record at or after the time.
                (StartFrom::Timestamp(_), _) => high,
                (StartFrom::CommittedOrEarliest | StartFrom::CommittedOrLatest, Some(Offset::Offset(o))) => {
                    if o < low || o > high {
                        return Err(topic_err(format!(
                            "group {:?} committed offset {o} for partition {p}, outside the partition's \
                             offsets {low}..{high}: records were deleted by retention, or the topic was \
                             recreated; reset the group's offsets, or start from earliest or latest",
                            c.group.as_deref().unwrap_or("")
                        )));
                    }
                    o
                }
                (StartFrom::CommittedOrEarliest, _) => low,
                (StartFrom::CommittedOrLatest, _) => high,
            };
            starts.push((p, start));
        }
    }
    let mut parts = Vec::with_capacity(mine.len());
    for &p in &mine {
        let part = match restored_of(p) {
            Some((_, next, end)) => Part::new(p, next, if c.bounded { end } else { None }),
            None => {
                let start = starts.iter().find(|s| s.0 == p).expect("looked up above").1;
                let end = if c.bounded { Some(watermarks(p)?.1) } else { None };
                Part::new(p, start, end)
            }
        };
        parts.push(part);
    }
    // A restored bounded partition whose end was lost (a checkpoint of an
    // unbounded run): bounded now, to its current end.
    if c.bounded {
        for part in parts.iter_mut().filter(|q| q.end.is_none()) {
            part.end = Some(watermarks(part.partition)?.1);
            part.done = part.end.is_some_and(|e| part.next >= e);
        }
    }
    let mut tpl = TopicPartitionList::with_capacity(parts.len());
    for part in parts.iter().filter(|q| !q.done) {
        tpl.add_partition_offset(&c.topic, part.partition, Offset::Offset(part.next))
            .map_err(err(format!("assign partition {}", part.partition)))?;
    }
    consumer
        .assign(&tpl)
        .map_err(err(format!("assign partitions {:?}", mine)))?;
    Ok(Setup { consumer, parts })
}

/// The setup's progress.
enum State {
    /// Nothing asked yet.
    NotStarted,
    /// The setup thread is at work.
    SettingUp(IoThread<SetupHandler>),
    Running(Consumer_),
}

/// One subtask of a Kafka source; see the module docs.
///
/// `parse` turns a record's value into a `T`, or says why it cannot.
pub struct KafkaSource<T, P> {
    config: KafkaSourceConfig,
    subtask: usize,
    parallelism: usize,
    parse: P,
    state: State,
    /// This subtask's partitions, in order; empty until set up.
    parts: Vec<Part>,
    /// Offsets from a restored checkpoint, kept until the setup is done:
    /// a checkpoint taken before then holds them again (nothing was read
    /// since), never "not started", which would restart from the start
    /// position and read twice what the restored state already counted.
    restored: Option<Vec<(i32, i64, Option<i64>)>>,
    /// The last watermark emitted, and whether the subtask is marked idle.
    emitted_wm: i64,
    idle: bool,
    /// Offsets of checkpoints not yet known complete, for group commits.
    pending_commits: VecDeque<(u64, Vec<(i32, i64)>)>,
    /// The topic for librdkafka's C calls (made once set up), and when the
    /// high watermarks were last looked at.
    topic_c: Option<CString>,
    lag_checked_ns: u64,
    _records: PhantomData<fn() -> T>,
}

impl<T, P> KafkaSource<T, P> {
    /// The source instance of `subtask` out of `parallelism`, reading as
    /// `config` says and parsing record values with `parse`. Nothing is
    /// contacted until the first poll (a restore only records offsets).
    ///
    /// # Panics
    /// If `subtask >= parallelism`: the runtime never asks for that.
    pub fn new(config: KafkaSourceConfig, subtask: usize, parallelism: usize, parse: P) -> Self {
        assert!(subtask < parallelism, "subtask {subtask} out of range 0..{parallelism}");
        KafkaSource {
            config,
            subtask,
            parallelism,
            parse,
            state: State::NotStarted,
            parts: Vec::new(),
            restored: None,
            emitted_wm: MIN_WATERMARK,
            idle: false,
            pending_commits: VecDeque::new(),
            topic_c: None,
            lag_checked_ns: 0,
            _records: PhantomData,
        }
    }

    /// The partitions this subtask reads, once set up (empty before).
    pub fn partitions(&self) -> Vec<i32> {
        self.parts.iter().map(|p| p.partition).collect()
    }

    /// True once the setup is done and the source reads its partitions.
    pub fn is_set_up(&self) -> bool {
        self.is_started()
    }

    fn is_started(&self) -> bool {
        matches!(self.state, State::Running(_))
    }

    /// Starts the setup, or takes its result. True once running.
    fn advance_setup(&mut self) -> Result<bool, BoxError> {
        match &mut self.state {
            State::Running(_) => return Ok(true),
            State::NotStarted => {
                self.config.validate()?;
                let name = format!("weir-kafka-setup-{}", self.subtask);
                let mut thread =
                    IoThread::spawn(&name, SetupHandler, 1).map_err(|e| format!("cannot start thread {name}: {e}"))?;
                thread.submit(SetupRequest {
                    config: self.config.clone(),
                    subtask: self.subtask,
                    parallelism: self.parallelism,
                    restored: self.restored.clone(),
                })?;
                self.state = State::SettingUp(thread);
            }
            State::SettingUp(_) => {}
        }
        let State::SettingUp(thread) = &mut self.state else {
            unreachable!("set above")
        };
        let Some(setup) = thread.try_reply()? else {
            return Ok(false);
        };
        self.parts = setup.parts;
        // From here the offsets are the parts' own.
        self.restored = None;
        // A topic name has no NUL (the cluster listed it by this name).
        self.topic_c = CString::new(self.config.topic.as_str()).ok();
        // The setup thread is idle now: dropping it joins at once.
        self.state = State::Running(setup.consumer);
        Ok(true)
    }

    /// Looks up each partition's high watermark as the client last saw it
    /// (in its latest fetch response: no request to the broker), for the
    /// lag of an unbounded subtask.
    fn refresh_high_watermarks(&mut self) {
        let (State::Running(consumer), Some(topic)) = (&self.state, &self.topic_c) else {
            return;
        };
        let rk = consumer.client().native_ptr();
        for part in self.parts.iter_mut().filter(|q| !q.done) {
            let (mut low, mut high) = (-1i64, -1i64);
            // SAFETY: `rk` is the live client of `consumer`, borrowed for
            // the call; `topic` is a NUL-terminated string that outlives
            // it; `low` and `high` are valid for writes. The function only
            // reads the partition's cached offsets under its lock.
            let err = unsafe {
                rdkafka::bindings::rd_kafka_get_watermark_offsets(
                    rk,
                    topic.as_ptr(),
                    part.partition,
                    &mut low,
                    &mut high,
                )
            };
            // Before the first fetch response the offsets are invalid (< 0).
            if err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0 {
                part.high = high;
            }
        }
    }

    /// Records behind the end, summed over this subtask's partitions; see
    /// [`Source::backlog`] on [`KafkaSource`].
    fn lag(&self) -> Option<u64> {
        if !self.is_started() {
            return None;
        }
        let mut sum = 0u64;
        for q in self.parts.iter().filter(|q| !q.done) {
            let end = match q.end {
                Some(end) => end,
                None if q.high >= 0 => q.high,
                None => return None,
            };
            sum += end.saturating_sub(q.next).max(0) as u64;
        }
        Some(sum)
    }

    /// Stops fetching a partition that is read to its end.
    fn pause(consumer: &Consumer_, topic: &str, part: &mut Part) {
        part.done = true;
        let mut tpl = TopicPartitionList::with_capacity(1);
        tpl.add_partition(topic, part.partition);
        // Only saves fetches: records past the end are dropped anyway.
        let _ = consumer.pause(&tpl);
    }

    fn poll_records(&mut self, out: &mut Vec<T>, max: usize, now: u64) -> Result<SourcePoll>
    where
        P: FnMut(&[u8], &KafkaRecordInfo<'_>) -> Result<T, ParseError>,
    {
        let State::Running(consumer) = &self.state else {
            unreachable!("polled before set up")
        };
        let topic = self.config.topic.as_str();
        let bounded = self.config.bounded;
        let par = self.parallelism;
        // Skipped and dropped records count against the budget too.
        let mut budget = max + 64;
        while out.len() < max && budget > 0 {
            budget -= 1;
            let msg = match consumer.poll(Duration::ZERO) {
                None => break,
                Some(Ok(m)) => m,
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    // Bounded only (enable.partition.eof): every record
                    // before the end has been delivered.
                    if let Some(part) = self
                        .parts
                        .get_mut(self.config.local_index(p, par))
                        .filter(|q| q.partition == p)
                    {
                        if let Some(end) = part.end {
                            part.next = part.next.max(end);
                            Self::pause(consumer, topic, part);
                        }
                    }
                    continue;
                }
                Some(Err(e)) => {
                    if fatal(&e) {
                        return Err(Error::Kafka {
                            brokers: self.config.brokers.clone(),
                            topic: topic.to_string(),
                            context: format!(
                                "consume partitions {:?} (subtask {} of {par})",
                                self.parts.iter().map(|q| q.partition).collect::<Vec<_>>(),
                                self.subtask
                            ),
                            source: Box::new(e),
                        });
                    }
                    // Transient (a broker connection lost, a timeout): the
                    // client retries on its own, with bounded backoff.
                    continue;
                }
            };
            let p = msg.partition();
            let offset = msg.offset();
            let Some(part) = self
                .parts
                .get_mut(self.config.local_index(p, par))
                .filter(|q| q.partition == p)
            else {
                continue;
            };
            if part.done || part.end.is_some_and(|e| offset >= e) {
                if !part.done && bounded {
                    part.next = part.next.max(part.end.unwrap_or(offset));
                    Self::pause(consumer, topic, part);
                }
                continue;
            }
            let ts = msg.timestamp().to_millis();
            let info = KafkaRecordInfo {
                topic,
                partition: p,
                offset,
                timestamp_ms: ts,
                key: msg.key(),
                emitted_ns: now,
            };
            let value = msg.payload().unwrap_or(&[]);
            match (self.parse)(value, &info) {
                Ok(record) => out.push(record),
                Err(e) => match self.config.bad_records {
                    KafkaBadRecords::Fail => return Err(malformed(topic, p, offset, e, value)),
                    KafkaBadRecords::Skip => self.config.stats.add_skipped(),
                },
            }
            part.next = offset + 1;
            if let Some(ts) = ts {
                part.max_ts = part.max_ts.max(ts);
            }
            part.last_record_ns = now;
            if part.end.is_some_and(|e| part.next >= e) {
                Self::pause(consumer, topic, part);
            }
        }
        if bounded && self.parts.iter().all(|q| q.done) {
            return Ok(SourcePoll::Done);
        }
        Ok(if out.is_empty() {
            SourcePoll::Idle
        } else {
            SourcePoll::Ready
        })
    }

    /// Emits the subtask's watermark if it advanced, or idleness.
    fn watermark(&mut self, now: u64, ctx: &mut SourceContext<'_>) {
        let Some(w) = self.config.watermarks else { return };
        let idle_after_ns = w.idle_after_ms.map(|ms| ms.saturating_mul(1_000_000));
        let mut min: Option<i64> = None;
        for part in self.parts.iter().filter(|q| !q.done) {
            if idle_after_ns.is_some_and(|i| now.saturating_sub(part.last_record_ns) >= i) {
                continue;
            }
            let wm = if part.max_ts == i64::MIN {
                MIN_WATERMARK
            } else {
                part.max_ts.saturating_sub(w.out_of_orderness_ms).saturating_sub(1)
            };
            min = Some(min.map_or(wm, |m| m.min(wm)));
        }
        match min {
            // Done partitions only: the runtime sends the end-of-input watermark.
            None if self.parts.iter().all(|q| q.done) && !self.parts.is_empty() => {}
            None => {
                if !self.idle {
                    self.idle = true;
                    ctx.mark_idle();
                }
            }
            Some(wm) => {
                if wm > self.emitted_wm || self.idle {
                    self.emitted_wm = self.emitted_wm.max(wm);
                    self.idle = false;
                    ctx.emit_watermark(self.emitted_wm);
                }
            }
        }
    }

    /// The offsets a checkpoint holds: the parts' own once set up; before
    /// that, the restored ones if any (still exactly where reading starts),
    /// else "not started" (a restore starts from the configured position).
    fn encode_offset(&self) -> Vec<u8> {
        let parts: Vec<(i32, i64, Option<i64>)> = match &self.restored {
            Some(restored) if !self.is_started() => restored.clone(),
            _ => self.parts.iter().map(|q| (q.partition, q.next, q.end)).collect(),
        };
        encode_offsets(&self.config.topic, self.is_started() || self.restored.is_some(), &parts)
    }

    fn seek_to(&mut self, offset: &[u8]) -> Result<()> {
        let bad = |reason: String| Error::BadOffset {
            source_name: "kafka",
            reason,
        };
        if self.is_started() || matches!(self.state, State::SettingUp(_)) {
            return Err(bad(
                "seek after the source started: the runtime seeks only fresh sources".into(),
            ));
        }
        let mut r = Reader(offset);
        let version = r.u8().ok_or_else(|| bad("empty offset".into()))?;
        if version != OFFSET_VERSION {
            return Err(bad(format!("offset version {version}, expected {OFFSET_VERSION}")));
        }
        let damaged = || bad(format!("damaged offset of {} bytes", offset.len()));
        let started = r.u8().ok_or_else(damaged)? != 0;
        let len = r.u16().ok_or_else(damaged)? as usize;
        let topic = r.take(len).ok_or_else(damaged)?;
        if topic != self.config.topic.as_bytes() {
            return Err(bad(format!(
                "the checkpoint's offsets are of topic {:?}, this source reads {:?}: restore the job with its own topic",
                String::from_utf8_lossy(topic),
                self.config.topic
            )));
        }
        let n = r.u32().ok_or_else(damaged)? as usize;
        // 20 bytes a partition: a damaged count allocates no more than the
        // offset's own size says.
        let mut parts = Vec::with_capacity(n.min(r.0.len() / 20));
        for _ in 0..n {
            let p = r.i32().ok_or_else(damaged)?;
            let next = r.i64().ok_or_else(damaged)?;
            let end = r.i64().ok_or_else(damaged)?;
            if p < 0 || !self.config.reads(p, self.subtask, self.parallelism) || next < 0 {
                let (shards, shard) = self.config.shard;
                return Err(bad(format!(
                    "partition {p} (next offset {next}) is not subtask {}'s of {} (shard {shard} of {shards}): \
                     restore with the same parallelism and shards",
                    self.subtask, self.parallelism
                )));
            }
            if end < -1 {
                return Err(damaged());
            }
            parts.push((p, next, (end >= 0).then_some(end)));
        }
        if !r.0.is_empty() {
            return Err(damaged());
        }
        self.restored = started.then_some(parts);
        Ok(())
    }
}

/// A source's offsets as a checkpoint stores them: version, whether the
/// source had started (else a restore resolves the start position again),
/// the topic, then per partition its number, next offset and end (-1:
/// unbounded), little-endian.
pub(crate) fn encode_offsets(topic: &str, started: bool, parts: &[(i32, i64, Option<i64>)]) -> Vec<u8> {
    let topic = topic.as_bytes();
    let mut out = Vec::with_capacity(8 + topic.len() + 20 * parts.len());
    out.push(OFFSET_VERSION);
    out.push(u8::from(started));
    out.extend_from_slice(&(topic.len() as u16).to_le_bytes());
    out.extend_from_slice(topic);
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for &(partition, next, end) in parts {
        out.extend_from_slice(&partition.to_le_bytes());
        out.extend_from_slice(&next.to_le_bytes());
        out.extend_from_slice(&end.unwrap_or(-1).to_le_bytes());
    }
    out
}

/// Errors after which reading cannot go on correctly.
fn fatal(e: &KafkaError) -> bool {
    match e {
        KafkaError::MessageConsumptionFatal(_) => true,
        KafkaError::MessageConsumption(code) => matches!(
            code,
            // auto.offset.reset=error: the next offset is gone.
            RDKafkaErrorCode::AutoOffsetReset
                | RDKafkaErrorCode::OffsetOutOfRange
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::Fatal
        ),
        _ => false,
    }
}

/// An [`Error::KafkaMalformed`] quoting the start of `value`.
fn malformed(topic: &str, partition: i32, offset: i64, e: ParseError, value: &[u8]) -> Error {
    let quoted = &value[..value.len().min(MAX_QUOTED_TEXT)];
    let mut text = String::from_utf8_lossy(quoted).into_owned();
    if value.len() > MAX_QUOTED_TEXT {
        text.push_str("...");
    }
    Error::KafkaMalformed {
        topic: topic.to_string(),
        partition,
        offset,
        reason: e.reason().to_string(),
        text,
    }
}

/// Little-endian fields of an offset.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes(b.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn i32(&mut self) -> Option<i32> {
        self.take(4).map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn i64(&mut self) -> Option<i64> {
        self.take(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

impl<T, P> Source<T> for KafkaSource<T, P>
where
    T: Send + 'static,
    P: FnMut(&[u8], &KafkaRecordInfo<'_>) -> Result<T, ParseError> + Send + 'static,
{
    fn poll(&mut self, out: &mut Vec<T>, max: usize, ctx: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError> {
        if !self.advance_setup()? {
            return Ok(SourcePoll::Idle);
        }
        let now = ctx.now_ns();
        if self.parts.is_empty() {
            // More subtasks than partitions.
            if self.config.bounded {
                return Ok(SourcePoll::Done);
            }
            if !self.idle {
                self.idle = true;
                ctx.mark_idle();
            }
            return Ok(SourcePoll::Idle);
        }
        if self.parts.iter().all(|q| q.last_record_ns == 0) {
            // Idleness counts from the moment reading starts.
            for q in &mut self.parts {
                q.last_record_ns = now;
            }
        }
        let status = self.poll_records(out, max, now)?;
        if status != SourcePoll::Done {
            self.watermark(now, ctx);
        }
        if !self.config.bounded && now.saturating_sub(self.lag_checked_ns) >= LAG_REFRESH_NS {
            self.lag_checked_ns = now;
            self.refresh_high_watermarks();
        }
        Ok(status)
    }

    fn offset(&self) -> Vec<u8> {
        self.encode_offset()
    }

    fn checkpoint_offset(&mut self, checkpoint: u64) -> Vec<u8> {
        if self.config.commit_offsets && self.is_started() {
            if self.pending_commits.len() == MAX_PENDING_COMMITS {
                self.pending_commits.pop_front();
            }
            let offsets = self.parts.iter().map(|q| (q.partition, q.next)).collect();
            self.pending_commits.push_back((checkpoint, offsets));
        }
        self.encode_offset()
    }

    fn checkpoint_complete(&mut self, checkpoint: u64) -> Result<(), BoxError> {
        let mut newest = None;
        while self.pending_commits.front().is_some_and(|(id, _)| *id <= checkpoint) {
            newest = self.pending_commits.pop_front();
        }
        let (Some((_, offsets)), State::Running(consumer)) = (newest, &self.state) else {
            return Ok(());
        };
        let mut tpl = TopicPartitionList::with_capacity(offsets.len());
        for (p, next) in offsets {
            tpl.add_partition_offset(&self.config.topic, p, Offset::Offset(next))?;
        }
        if tpl.count() == 0 {
            return Ok(());
        }
        // Asynchronous: queued for the client's threads (see KafkaContext
        // for how a failure shows).
        match consumer.commit(&tpl, CommitMode::Async) {
            Ok(()) => self.config.stats.add_commit(),
            Err(e) => {
                self.config.stats.add_commit_failure();
                tracing::warn!(target: "weir_io::kafka", "commit of checkpoint {checkpoint}'s offsets of topic {} refused: {e}", self.config.topic);
            }
        }
        Ok(())
    }

    fn seek(&mut self, offset: &[u8]) -> Result<(), BoxError> {
        Ok(self.seek_to(offset)?)
    }

    fn is_replayable(&self) -> bool {
        true
    }

    /// The subtask's lag: records behind the end of its partitions, summed.
    /// Bounded, the end is each partition's end offset (so the lag reaches
    /// 0 when the source is done); unbounded, the high watermark the client
    /// saw in its latest fetch response, looked at once a second, never
    /// asked of the broker. Under
    /// `read_committed` the high watermark counts transaction markers and
    /// records of open transactions too, so a topic written
    /// transactionally shows a lag of at least 1 per partition read to its
    /// end (its last commit marker). `None` until set up and, unbounded,
    /// until every partition's high watermark is known.
    fn backlog(&self) -> Option<u64> {
        self.lag()
    }
}

impl<T, P> Drop for KafkaSource<T, P> {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut self.state, State::NotStarted);
        if matches!(state, State::NotStarted) {
            return;
        }
        // Closing the consumer polls until librdkafka reports it closed,
        // with no bound, then waits for its threads; dropping the setup
        // thread waits for a setup in progress (each of its calls at most
        // setup_timeout). Nobody waits for either: not a worker, nor a
        // program dropping a source.
        super::drop_detached(state, "consumer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[u8], _: &KafkaRecordInfo<'_>) -> Result<u64, ParseError> {
        std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ParseError::new("not a number"))
    }

    type Src = KafkaSource<u64, fn(&[u8], &KafkaRecordInfo<'_>) -> Result<u64, ParseError>>;

    fn source(topic: &str, i: usize, p: usize) -> Src {
        KafkaSource::new(KafkaSourceConfig::new("127.0.0.1:1", topic), i, p, parse as _)
    }

    #[test]
    fn offsets_round_trip_and_are_checked() {
        let mut a = source("t", 1, 2);
        a.parts = vec![Part::new(1, 10, Some(20)), Part::new(3, 5, None)];
        // Not started: a restore resolves the start again.
        let off = a.encode_offset();
        let mut b = source("t", 1, 2);
        b.seek_to(&off).unwrap();
        assert_eq!(b.restored, None);
        // Started.
        let mut off = off;
        off[1] = 1;
        let mut b = source("t", 1, 2);
        b.seek_to(&off).unwrap();
        assert_eq!(b.restored, Some(vec![(1, 10, Some(20)), (3, 5, None)]));
        // Another topic, another subtask, damage.
        let e = source("u", 1, 2).seek_to(&off).unwrap_err().to_string();
        assert!(e.contains("of topic \"t\""), "{e}");
        let e = source("t", 0, 2).seek_to(&off).unwrap_err().to_string();
        assert!(e.contains("partition 1"), "{e}");
        assert!(source("t", 1, 2).seek_to(&off[..off.len() - 1]).is_err());
        assert!(source("t", 1, 2).seek_to(&[]).is_err());
    }

    /// A restore hands its offsets to the setup thread; a checkpoint taken
    /// before the setup is done (the next one may come 10 ms later, the
    /// setup takes longer) must hold them again. It once held "not
    /// started", so a second failure restarted the subtask from its start
    /// position and counted again what the restored state had counted.
    #[test]
    fn a_checkpoint_before_the_setup_is_done_holds_the_restored_offsets() {
        let mut a = source("t", 1, 2);
        a.parts = vec![Part::new(1, 10, Some(20)), Part::new(3, 5, None)];
        let mut off = a.encode_offset();
        off[1] = 1;
        let config = KafkaSourceConfig::new("127.0.0.1:1", "t").setup_timeout(Duration::from_secs(60));
        let mut b: Src = KafkaSource::new(config, 1, 2, parse as _);
        b.seek_to(&off).unwrap();
        assert_eq!(b.checkpoint_offset(7), off, "restored, not yet polled");
        // The first poll starts the setup; no broker listens at port 1, so
        // it is still at work for the rest of this test.
        let mut h = weir_core::harness::Harness::new(1, 2);
        let mut out = Vec::new();
        assert_eq!(h.poll_source(&mut b, &mut out, 100).unwrap(), SourcePoll::Idle);
        assert!(matches!(b.state, State::SettingUp(_)), "the setup is at work");
        let during = b.checkpoint_offset(8);
        assert_eq!(during, off, "restored, setting up");
        let mut c = source("t", 1, 2);
        c.seek_to(&during).unwrap();
        assert_eq!(c.restored, Some(vec![(1, 10, Some(20)), (3, 5, None)]));
        // Never restored, not started: a restore starts afresh.
        let mut d = source("t", 1, 2);
        let fresh = d.checkpoint_offset(1);
        c = source("t", 1, 2);
        c.seek_to(&fresh).unwrap();
        assert_eq!(c.restored, None);
    }

    #[test]
    fn shards_split_the_partitions_and_their_offsets() {
        let c = KafkaSourceConfig::new("127.0.0.1:1", "t").shard(3, 1);
        // Shard 1 of 3 holds partitions 1, 4, 7, 10, ...; of those subtask 0
        // of 2 reads every other one, starting with the first.
        let of = |subtask| (0..14).filter(|&p| c.reads(p, subtask, 2)).collect::<Vec<i32>>();
        assert_eq!(of(0), vec![1, 7, 13]);
        assert_eq!(of(1), vec![4, 10]);
        assert_eq!(c.local_index(13, 2), 2);
        assert_eq!(c.local_index(10, 2), 1);
        // Every partition is read by exactly one (shard, subtask).
        for p in 0..30 {
            let readers = (0..3)
                .flat_map(|s| (0..2).map(move |i| (s, i)))
                .filter(|&(s, i)| KafkaSourceConfig::new("b:1", "t").shard(3, s).reads(p, i, 2))
                .count();
            assert_eq!(readers, 1, "partition {p}");
        }
        // A checkpoint of shard 1 restores into shard 1, not shard 2.
        let mut a: Src = KafkaSource::new(c.clone(), 0, 2, parse as _);
        a.parts = vec![Part::new(1, 10, None), Part::new(7, 3, None)];
        let mut off = a.encode_offset();
        off[1] = 1;
        let mut b: Src = KafkaSource::new(c, 0, 2, parse as _);
        b.seek_to(&off).unwrap();
        assert_eq!(b.restored, Some(vec![(1, 10, None), (7, 3, None)]));
        let other = KafkaSourceConfig::new("127.0.0.1:1", "t").shard(3, 2);
        let e = KafkaSource::<u64, _>::new(other, 0, 2, parse as fn(&[u8], &KafkaRecordInfo<'_>) -> _)
            .seek_to(&off)
            .unwrap_err()
            .to_string();
        assert!(e.contains("shard 2 of 3"), "{e}");
        let bad = KafkaSourceConfig::new("127.0.0.1:1", "t").shard(2, 2);
        assert!(bad.validate().unwrap_err().to_string().contains("shard"));
        assert!(KafkaSourceConfig::new("127.0.0.1:1", "t")
            .shard(0, 0)
            .validate()
            .is_err());
    }

    #[test]
    fn a_bad_configuration_fails_the_first_poll() {
        let c = KafkaSourceConfig::new("127.0.0.1:1", "t").commit_offsets_on_checkpoint();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("consumer group"), "{e}");
        let c = KafkaSourceConfig::new("127.0.0.1:1", "t").start_from(StartFrom::CommittedOrLatest);
        assert!(c.validate().is_err());
        let c = KafkaSourceConfig::new("127.0.0.1:1", "t").watermarks(-1, None);
        assert!(c.validate().is_err());
        assert!(KafkaSourceConfig::new(" ", "t").validate().is_err());
    }

    #[test]
    fn the_malformed_error_names_topic_partition_and_offset() {
        let e = malformed("events", 3, 1234, ParseError::new("expected key,value"), b"oops").to_string();
        assert!(e.contains("topic 'events', partition 3, offset 1234"), "{e}");
        assert!(e.contains("expected key,value") && e.contains("\"oops\""), "{e}");
    }
}
