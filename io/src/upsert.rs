//! The idempotent sink: upserts by key into a SQLite table.
//!
//! Each batch is written in one short transaction as
//! `INSERT ... ON CONFLICT (key) DO UPDATE SET value = excluded.value`, and
//! is visible as soon as that transaction commits: the latency of this sink
//! does not depend on the checkpoint interval. After a recovery, replayed
//! records write the same values again under the same keys, so the table
//! converges to exactly-once results: **effectively once**, for outputs
//! where the latest value per key is what matters. Between the failure and
//! the end of the replay a reader can see a key's value step back to an
//! earlier one and move forward again; use a transactional sink where that
//! matters.
//!
//! The connection and the user's `bind` live on the sink's own thread
//! ([`weir_core::io_thread::IoThread`]), which runs every database call;
//! the worker only moves records into a buffer (and reads their emission
//! stamps). One upsert transaction is in flight at a time, and batches are
//! handed over at most every [`SqliteUpsertSink::flush_interval`] (default
//! [`DEFAULT_FLUSH_INTERVAL`], 500 µs) unless [`FLUSH_RECORDS`] wait: while
//! the thread writes, the worker fills the next batch, so a slow database
//! gets larger transactions instead of more of them, and the thread wakes a
//! bounded number of times a second. After a transaction the thread naps
//! a little longer than the interval before it parks, so that the next
//! hand-over costs the worker no wake-up call (as the direct sink's,
//! [`crate::direct`]). A record is visible at most that interval, one
//! transaction and the nap's margin after it reached the sink.
//!
//! Write transactions are not fsynced one by one; at each barrier one
//! durable transaction (`sqlite.upsert.sync`) on that thread, in order
//! after the upserts, makes everything written so far durable, and the
//! checkpoint is acknowledged once it is done, so a completed checkpoint
//! never depends on rows a crash could lose. Fault point
//! `sqlite.upsert.write` precedes each upsert transaction.
//!
//! Bounded memory: when more than [`MAX_BUFFERED_RECORDS`] records wait for
//! the thread (or are in its transaction), [`Sink::ready`] says false and
//! the task stops reading input (backpressure, like a full ring) until the
//! thread catches up.

use std::marker::PhantomData;

use rusqlite::{Connection, TransactionBehavior};
use weir_core::io_thread::{IoHandler, IoThread};
use weir_core::{clock, BoxError, PreCommit, Sink, SinkContext};

use crate::fsutil::fault;
use crate::handover::Handover;
use crate::latency::StampRuns;
use crate::sql::{self, SqlRow, SqliteTable};
use crate::{Error, Result};

/// Fault point before a batch is upserted.
pub const FAULT_WRITE: &str = "sqlite.upsert.write";
/// Fault point before the durable transaction at a barrier or the end.
pub const FAULT_SYNC: &str = "sqlite.upsert.sync";

/// Every fault point of [`SqliteUpsertSink`].
pub const UPSERT_FAULT_POINTS: &[&str] = &[FAULT_WRITE, FAULT_SYNC];

/// Least time between two batches handed to the sink's thread, by default:
/// 500 µs, so that at most 2,000 wake-ups a second take a core from a
/// worker, while a record waits at most that long to be upserted.
pub const DEFAULT_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_micros(500);

/// Records waiting that are handed over at once, without waiting for the
/// flush interval: 1,024.
pub const FLUSH_RECORDS: usize = 1 << 10;

/// Records waiting for the sink's thread or in its transaction beyond which
/// the sink says it is not ready: 4,096. Memory stays below this plus one
/// scheduling turn's output. Small on purpose: a barrier's sync waits on
/// the thread for every upsert handed over before it, so this bound over
/// the database's throughput (some 50,000 rows a second for SQLite shared
/// by several subtasks on a loaded two-core machine) is what it adds to a
/// checkpoint.
pub const MAX_BUFFERED_RECORDS: usize = 4 << 10;

/// Requests to the sink's thread: at most one upsert, the upserts and syncs
/// of barriers and the end, and the open. 64 bounds the barriers that can
/// queue behind a stalled database before the worker waits.
const IO_QUEUE: usize = 64;

enum Request<T> {
    /// Open the connection (and set the table up).
    Open,
    /// Upsert `batch` in one transaction; `stamps` are its records'
    /// emission times.
    Upsert { batch: Vec<T>, stamps: StampRuns },
    /// Durably mark `epoch` pre-committed: every upsert before is durable.
    Sync { epoch: u64 },
}

enum Reply<T> {
    Opened,
    /// The batch, emptied for reuse, its length, and when its rows became
    /// visible.
    Upserted {
        batch: Vec<T>,
        stamps: StampRuns,
        visible_ns: u64,
        len: usize,
    },
    Synced,
}

/// The sink's thread: owns the connection and `bind`.
struct UpsertIo<T, B> {
    table: SqliteTable,
    subtask: usize,
    bind: B,
    conn: Option<Connection>,
    upsert_sql: String,
    _records: PhantomData<fn(&T)>,
}

impl<T, B> UpsertIo<T, B>
where
    B: Fn(&T, &mut SqlRow<'_, '_>),
{
    fn conn(&mut self) -> Result<&mut Connection> {
        if self.conn.is_none() {
            self.conn = Some(sql::open(&self.table, self.subtask)?);
        }
        Ok(self.conn.as_mut().expect("opened above"))
    }

    fn upsert(&mut self, batch: &[T]) -> Result<()> {
        fault(FAULT_WRITE, "upsert into", &self.table.db)?;
        self.conn()?;
        let (table, bind, sql) = (&self.table, &self.bind, &self.upsert_sql);
        let conn = self.conn.as_mut().expect("opened above");
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(table.err("begin an upsert batch"))?;
        {
            let mut stmt = tx.prepare_cached(sql).map_err(table.err("prepare the upsert"))?;
            for r in batch {
                let mut row = SqlRow::new(&mut stmt, 1);
                bind(r, &mut row);
                row.check(table.columns.len())
                    .and_then(|_| stmt.raw_execute())
                    .map_err(table.err("upsert a row"))?;
            }
        }
        tx.commit().map_err(table.err("commit an upsert batch"))
    }

    fn sync(&mut self, epoch: u64) -> Result<()> {
        fault(FAULT_SYNC, "make upserts durable in", &self.table.db)?;
        let subtask = self.subtask;
        self.conn()?;
        let conn = self.conn.as_ref().expect("opened above");
        sql::mark_precommitted(conn, &self.table, subtask, epoch)
    }
}

impl<T, B> IoHandler for UpsertIo<T, B>
where
    T: Send + 'static,
    B: Fn(&T, &mut SqlRow<'_, '_>) + Send + 'static,
{
    type Request = Request<T>;
    type Reply = Reply<T>;

    fn handle(&mut self, request: Request<T>) -> Result<Reply<T>, BoxError> {
        match request {
            Request::Open => {
                self.conn()?;
                Ok(Reply::Opened)
            }
            Request::Upsert { mut batch, stamps } => {
                self.upsert(&batch)?;
                // Visible now: the transaction committed.
                let visible_ns = clock::now_ns();
                let len = batch.len();
                batch.clear();
                Ok(Reply::Upserted {
                    batch,
                    stamps,
                    visible_ns,
                    len,
                })
            }
            Request::Sync { epoch } => {
                self.sync(epoch)?;
                Ok(Reply::Synced)
            }
        }
    }
}

/// One subtask of the idempotent upsert sink; see the module docs.
///
/// The [`SqliteTable`] needs [`SqliteTable::key`] columns with a primary
/// key or unique index on them. `bind(record, row)` pushes the values of
/// all columns in order (on the sink's thread); `emitted_ns(record)` gives
/// the emission time (0: unknown).
///
/// ```
/// use weir_core::harness::Harness;
/// use weir_io::{SqlRow, SqliteTable, SqliteUpsertSink};
///
/// let dir = tempfile::tempdir().unwrap();
/// let table = SqliteTable::new(dir.path().join("db.sqlite"), "latest", &["k", "v"])
///     .key(&["k"])
///     .create("CREATE TABLE IF NOT EXISTS latest (k TEXT PRIMARY KEY, v INTEGER)");
/// let bind = |r: &(&'static str, i64), row: &mut SqlRow<'_, '_>| {
///     row.push(r.0).push(r.1);
/// };
/// let mut sink = SqliteUpsertSink::new(table, 0, bind, |_: &(&str, i64)| 0);
/// let mut h = Harness::new(0, 1);
/// h.write_sink(&mut sink, &mut vec![("a", 1), ("b", 2), ("a", 3)]).unwrap();
/// h.finish_sink(&mut sink).unwrap();
/// let conn = weir_io::rusqlite::Connection::open(dir.path().join("db.sqlite")).unwrap();
/// let a: i64 = conn.query_row("SELECT v FROM latest WHERE k = 'a'", [], |r| r.get(0)).unwrap();
/// assert_eq!(a, 3);
/// ```
pub struct SqliteUpsertSink<T, B, E>
where
    T: Send + 'static,
    B: Fn(&T, &mut SqlRow<'_, '_>) + Send + 'static,
{
    /// What the thread will own, until it starts.
    handler: Option<UpsertIo<T, B>>,
    /// For error messages once the thread took the handler.
    db: std::path::PathBuf,
    emitted_ns: E,
    io: Option<IoThread<UpsertIo<T, B>>>,
    /// Records on their way to the thread (see [`crate::handover`]).
    hand: Handover<Vec<T>>,
    /// Epoch of the last barrier (for the durable mark).
    last_barrier: u64,
    /// `finish` was called: ready once everything is done.
    finishing: bool,
    /// The waker was handed to the thread.
    waker_set: bool,
}

impl<T, B, E> SqliteUpsertSink<T, B, E>
where
    T: Send + 'static,
    B: Fn(&T, &mut SqlRow<'_, '_>) + Send + 'static,
    E: Fn(&T) -> u64,
{
    /// The sink instance of `subtask`. The database is opened at the first
    /// call, on the sink's thread.
    pub fn new(table: SqliteTable, subtask: usize, bind: B, emitted_ns: E) -> Self {
        let params: Vec<String> = (1..=table.columns.len()).map(|i| format!("?{i}")).collect();
        let updates: Vec<String> = table
            .columns
            .iter()
            .filter(|c| !table.key.contains(c))
            .map(|c| format!("\"{c}\" = excluded.\"{c}\""))
            .collect();
        let on_conflict = if updates.is_empty() {
            "DO NOTHING".to_string()
        } else {
            format!("DO UPDATE SET {}", updates.join(", "))
        };
        let upsert_sql = format!(
            "INSERT INTO \"{}\" ({}) VALUES ({}) ON CONFLICT ({}) {on_conflict}",
            table.table,
            sql::column_list(&table.columns),
            params.join(", "),
            sql::column_list(&table.key),
        );
        SqliteUpsertSink {
            db: table.db.clone(),
            handler: Some(UpsertIo {
                table,
                subtask,
                bind,
                conn: None,
                upsert_sql,
                _records: PhantomData,
            }),
            emitted_ns,
            io: None,
            hand: Handover::new(DEFAULT_FLUSH_INTERVAL.as_nanos() as u64, FLUSH_RECORDS),
            last_barrier: 0,
            finishing: false,
            waker_set: false,
        }
    }

    /// Sets the least time between two batches handed to the sink's thread
    /// (default [`DEFAULT_FLUSH_INTERVAL`]): shorter makes records visible
    /// sooner and wakes the thread more often.
    pub fn flush_interval(mut self, interval: std::time::Duration) -> Self {
        self.hand
            .set_interval_ns(interval.as_nanos().min(u128::from(u64::MAX)) as u64);
        self
    }

    /// Records handed to the sink and not yet upserted by its thread
    /// (waiting, or in the transaction in flight).
    pub fn buffered_records(&self) -> usize {
        self.hand.buffered()
    }

    /// Waits (blocking) until the thread upserted and synced everything
    /// handed to it, and takes its replies: for tests and tools, never on a
    /// worker.
    pub fn wait_idle(&mut self) -> Result<(), BoxError> {
        self.send(None)?;
        if let Some(io) = &self.io {
            io.wait_for(io.last_ticket())?;
        }
        self.take_replies()
    }

    /// The sink's thread, started (with the connection's opening as its
    /// first request) at the first call.
    fn io(&mut self) -> Result<&mut IoThread<UpsertIo<T, B>>, BoxError> {
        if self.io.is_none() {
            let handler = self.handler.take().ok_or_else(|| {
                format!(
                    "upsert sink into {}: its thread could not be started, and took the connection along",
                    self.db.display()
                )
            })?;
            if handler.table.key.is_empty() {
                let e = Error::InvalidConfig {
                    setting: "key",
                    value: "[]".into(),
                    reason: "the upsert sink needs key columns",
                };
                self.handler = Some(handler);
                return Err(e.into());
            }
            let name = format!("weir-upsert-{}", handler.table.table);
            let mut io = IoThread::spawn(&name, handler, IO_QUEUE)
                .map_err(|e| Error::io("start the I/O thread of", &self.db, e))?;
            io.set_nap(self.hand.thread_nap());
            io.submit(Request::Open)?;
            self.io = Some(io);
        }
        Ok(self.io.as_mut().expect("started above"))
    }

    /// Hands the pending records to the thread if due (see
    /// [`Handover::take`]; `None`: at once).
    fn send(&mut self, now: Option<u64>) -> Result<(), BoxError> {
        if let Some((batch, stamps)) = self.hand.take(now) {
            self.io()?.submit(Request::Upsert { batch, stamps })?;
        }
        Ok(())
    }

    /// Takes the thread's replies: recycles buffers, notes visibility.
    fn take_replies(&mut self) -> Result<(), BoxError> {
        let Some(io) = self.io.as_mut() else {
            return Ok(());
        };
        while let Some(reply) = io.try_reply()? {
            if let Reply::Upserted {
                batch,
                stamps,
                visible_ns,
                len,
            } = reply
            {
                self.hand.returned(batch, stamps, visible_ns, len);
            }
        }
        Ok(())
    }

    /// Hands this sink's worker to the thread for wake-ups, once.
    fn wake_me(&mut self, ctx: &SinkContext<'_>) -> Result<(), BoxError> {
        if !self.waker_set {
            self.io()?.set_waker(ctx.waker());
            self.waker_set = true;
        }
        Ok(())
    }
}

impl<T, B, E> Sink<T> for SqliteUpsertSink<T, B, E>
where
    T: Send + 'static,
    B: Fn(&T, &mut SqlRow<'_, '_>) + Send + 'static,
    E: Fn(&T) -> u64 + Send + 'static,
{
    fn write(&mut self, batch: &mut Vec<T>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.wake_me(ctx)?;
        crate::latency::record_arrival(ctx, batch, &self.emitted_ns);
        for r in batch.iter() {
            self.hand.pending_stamps.push((self.emitted_ns)(r));
        }
        self.hand.pending.append(batch);
        self.take_replies()?;
        self.hand.visible.flush(ctx);
        let now = ctx.now_ns();
        self.send(Some(now))
    }

    fn open(&mut self, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        // The thread, and the database's opening, before the first record.
        self.wake_me(ctx)
    }

    fn ready(&mut self, ctx: &mut SinkContext<'_>) -> Result<bool, BoxError> {
        if self.io.is_some() {
            self.wake_me(ctx)?;
        }
        self.take_replies()?;
        if self.finishing {
            self.hand.visible.flush_all(ctx);
        } else {
            self.hand.visible.flush(ctx);
        }
        let now = ctx.now_ns();
        self.send(Some(now))?;
        if self.finishing {
            return Ok(self.hand.idle() && self.io.as_ref().is_none_or(|io| io.in_flight() == 0));
        }
        Ok(self.buffered_records() < MAX_BUFFERED_RECORDS)
    }

    fn finish(&mut self, _ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        self.send(None)?;
        let epoch = self.last_barrier;
        let io = self.io()?;
        io.submit(Request::Sync { epoch })?;
        // Off the flush cadence: not worth the nap's wait.
        io.wake();
        self.finishing = true;
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        self.pre_commit_detached(checkpoint)?.wait()
    }

    fn pre_commit_detached(&mut self, checkpoint: u64) -> Result<PreCommit, BoxError> {
        // Everything upserted before the barrier, then its sync, in order.
        self.send(None)?;
        let io = self.io()?;
        let ticket = io.submit(Request::Sync { epoch: checkpoint })?;
        // Off the flush cadence: the thread handles it now, not at the end
        // of its nap.
        io.wake();
        let job = io.completion(ticket);
        self.last_barrier = checkpoint;
        Ok(PreCommit::with_sync(Vec::new(), job))
    }

    fn commit(&mut self, _checkpoint: u64) -> Result<(), BoxError> {
        // Visible already; a failure of the thread fails the task here too.
        self.io.as_ref().map_or(Ok(()), |io| io.check())
    }

    fn abort(&mut self, _checkpoint: u64) -> Result<(), BoxError> {
        self.io.as_ref().map_or(Ok(()), |io| io.check())
    }

    fn restore(&mut self, checkpoint: u64, _state: &[u8]) -> Result<(), BoxError> {
        // Nothing to undo: the replay upserts the same values again. Open
        // the connection now, on the sink's thread; this thread (the one
        // that starts the job) waits for it.
        self.last_barrier = checkpoint;
        self.hand.reset();
        self.finishing = false;
        let io = self.io()?;
        io.wait_for(io.last_ticket())?;
        self.take_replies()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use weir_core::harness::Harness;

    fn table(dir: &std::path::Path) -> SqliteTable {
        SqliteTable::new(dir.join("db.sqlite"), "latest", &["k", "v"])
            .key(&["k"])
            .create("CREATE TABLE IF NOT EXISTS latest (k INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    }

    fn bind_kv(r: &(u64, u64), row: &mut SqlRow<'_, '_>) {
        row.push(r.0 as i64).push(r.1 as i64);
    }

    fn rows(dir: &std::path::Path) -> Vec<(i64, i64)> {
        let conn = Connection::open(dir.join("db.sqlite")).unwrap();
        let mut stmt = conn.prepare("SELECT k, v FROM latest ORDER BY k").unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        rows.map(|r| r.unwrap()).collect()
    }

    /// Batches of one scheduling turn each are gathered into a few
    /// transactions, visible once the thread committed them; latencies are
    /// recorded for every record, on arrival and at visibility.
    #[test]
    fn upserts_run_on_the_sinks_thread_in_gathered_batches() {
        let dir = tempfile::tempdir().unwrap();
        let caller = std::thread::current().id();
        let bind_threads = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        let seen = std::sync::Arc::clone(&bind_threads);
        let bind = move |r: &(u64, u64), row: &mut SqlRow<'_, '_>| {
            seen.lock().unwrap().insert(std::thread::current().id());
            bind_kv(r, row);
        };
        let mut sink = SqliteUpsertSink::new(table(dir.path()), 0, bind, |r: &(u64, u64)| r.1)
            .flush_interval(Duration::from_secs(3600));
        let mut h = Harness::new(0, 1);
        let emitted = clock::now_ns();
        for i in 0..100u64 {
            h.write_sink(&mut sink, &mut vec![(i % 10, emitted)]).unwrap();
            assert!(h.ready_sink(&mut sink).unwrap());
        }
        // The first batch went at once; the rest waits for the interval.
        sink.wait_idle().unwrap();
        assert_eq!(sink.buffered_records(), 0);
        assert_eq!(rows(dir.path()).len(), 10);
        let _ = sink.pre_commit(1).unwrap();
        sink.commit(1).unwrap();
        h.finish_sink(&mut sink).unwrap();
        assert_eq!(h.latency_ns().len(), 100);
        assert_eq!(h.visible_latency_ns().len(), 100);
        let threads = bind_threads.lock().unwrap();
        assert_eq!(threads.len(), 1, "one thread binds");
        assert!(!threads.contains(&caller), "bind ran on the caller's thread");
    }

    /// A sink without key columns is refused at its first call.
    #[test]
    fn a_table_without_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let table = SqliteTable::new(dir.path().join("db.sqlite"), "t", &["k"]);
        let mut sink = SqliteUpsertSink::new(
            table,
            0,
            |r: &u64, row: &mut SqlRow<'_, '_>| {
                row.push(*r as i64);
            },
            |_: &u64| 0,
        );
        let e = Harness::new(0, 1).write_sink(&mut sink, &mut vec![1]).unwrap_err();
        assert!(e.to_string().contains("needs key columns"), "{e}");
    }
}
