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
//! Write transactions are not fsynced one by one; at each barrier one
//! durable transaction (`sqlite.upsert.sync`) makes everything written so
//! far durable, so a completed checkpoint never depends on rows a crash
//! could lose. Fault point `sqlite.upsert.write` precedes each batch.

use std::marker::PhantomData;

use rusqlite::{Connection, TransactionBehavior};
use weir_core::{BoxError, Sink, SinkContext};

use crate::fsutil::fault;
use crate::sql::{self, SqlRow, SqliteTable};
use crate::{Error, Result};

/// Fault point before a batch is upserted.
pub const FAULT_WRITE: &str = "sqlite.upsert.write";
/// Fault point before the durable transaction at a barrier or the end.
pub const FAULT_SYNC: &str = "sqlite.upsert.sync";

/// Every fault point of [`SqliteUpsertSink`].
pub const UPSERT_FAULT_POINTS: &[&str] = &[FAULT_WRITE, FAULT_SYNC];

/// One subtask of the idempotent upsert sink; see the module docs.
///
/// The [`SqliteTable`] needs [`SqliteTable::key`] columns with a primary
/// key or unique index on them. `bind(record, row)` pushes the values of
/// all columns in order; `emitted_ns(record)` gives the emission time (0:
/// unknown).
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
pub struct SqliteUpsertSink<T, B, E> {
    table: SqliteTable,
    subtask: usize,
    bind: B,
    emitted_ns: E,
    conn: Option<Connection>,
    upsert_sql: String,
    /// Epoch of the last barrier (for the durable mark).
    last_barrier: u64,
    _records: PhantomData<fn(&T)>,
}

impl<T, B, E> SqliteUpsertSink<T, B, E>
where
    B: Fn(&T, &mut SqlRow<'_, '_>),
    E: Fn(&T) -> u64,
{
    /// The sink instance of `subtask`. The database is opened at the first
    /// call.
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
        SqliteUpsertSink {
            upsert_sql: format!(
                "INSERT INTO \"{}\" ({}) VALUES ({}) ON CONFLICT ({}) {on_conflict}",
                table.table,
                sql::column_list(&table.columns),
                params.join(", "),
                sql::column_list(&table.key),
            ),
            table,
            subtask,
            bind,
            emitted_ns,
            conn: None,
            last_barrier: 0,
            _records: PhantomData,
        }
    }

    fn conn(&mut self) -> Result<&mut Connection> {
        if self.conn.is_none() {
            if self.table.key.is_empty() {
                return Err(Error::InvalidConfig {
                    setting: "key",
                    value: "[]".into(),
                    reason: "the upsert sink needs key columns",
                });
            }
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
        self.upsert(batch)?;
        // Visible now.
        crate::latency::record_visible(ctx, batch, &self.emitted_ns);
        batch.clear();
        Ok(())
    }

    fn finish(&mut self, _ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        Ok(self.sync(self.last_barrier)?)
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<Vec<u8>, BoxError> {
        self.sync(checkpoint)?;
        self.last_barrier = checkpoint;
        Ok(Vec::new())
    }

    fn restore(&mut self, checkpoint: u64, _state: &[u8]) -> Result<(), BoxError> {
        // Nothing to undo: the replay upserts the same values again.
        self.last_barrier = checkpoint;
        self.conn()?;
        Ok(())
    }
}
