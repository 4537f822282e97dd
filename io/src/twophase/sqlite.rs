//! Two-phase commit into a SQLite table.
//!
//! SQLite has no prepared (XA) transactions, so an epoch's rows are kept
//! in a staging table until commit:
//!
//! - write: each batch is inserted into the staging table
//!   `weir_stage_<sink>(subtask, epoch, c0, c1, ...)` in one short write
//!   transaction, not fsynced (`2pc.sqlite.write`). Short transactions let
//!   parallel subtasks share the database without holding its write lock
//!   across barriers;
//! - pre-commit: one durable transaction marks the epoch pre-committed,
//!   which makes every staged row durable (`2pc.sqlite.precommit`);
//! - commit: one durable database transaction moves the epoch's rows into
//!   the target table, deletes them from staging and sets the subtask's
//!   committed epoch in `weir_sink_epochs` (`2pc.sqlite.commit`). If that
//!   fence is already at or past the epoch, the commit is a no-op: a
//!   repeated commit, after recovery or from a stale instance, never
//!   duplicates rows. If the staged rows are fewer than the transaction
//!   wrote, nothing is committed and the loss is reported;
//! - abort: the epoch's staged rows are deleted (`2pc.sqlite.abort`).
//!
//! Every step runs on the sink's own thread (see [`super`]): the
//! database transactions block there, never on a worker.
//!
//! On recovery, staged rows of epochs newer than the restored checkpoint
//! are deleted, and a fence newer than it (or any, for a start without a
//! checkpoint) makes the sink refuse to run.

use std::marker::PhantomData;

use rusqlite::{Connection, Transaction, TransactionBehavior};
use serde::{Deserialize, Serialize};
use weir_core::BoxError;

use super::TwoPhaseCommit;
use crate::fsutil::fault;
use crate::sql::{self, SqlRow, SqliteTable};
use crate::{Error, Result};

/// Fault point before a batch is staged.
pub const FAULT_WRITE: &str = "2pc.sqlite.write";
/// Fault point before the durable pre-commit transaction.
pub const FAULT_PRECOMMIT: &str = "2pc.sqlite.precommit";
/// Fault point before the commit transaction.
pub const FAULT_COMMIT: &str = "2pc.sqlite.commit";
/// Fault point before staged rows are deleted at abort.
pub const FAULT_ABORT: &str = "2pc.sqlite.abort";

/// Every fault point of [`SqliteTransactions`], in protocol order.
pub const SQLITE_FAULT_POINTS: &[&str] = &[FAULT_WRITE, FAULT_PRECOMMIT, FAULT_COMMIT, FAULT_ABORT];

/// The handle of a SQLite transaction, as a checkpoint records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SqliteTxn {
    /// The epoch whose rows it holds (their key in the staging table).
    pub epoch: u64,
    /// Rows staged.
    pub rows: u64,
}

/// [`TwoPhaseCommit`] into a SQLite table; see the module docs. Wrap it in
/// a [`super::TwoPhaseCommitSink`].
///
/// `bind(record, row)` pushes the record's values, one per column of the
/// [`SqliteTable`], in order; `emitted_ns(record)` gives its emission time
/// (0: unknown).
pub struct SqliteTransactions<T, B, E> {
    table: SqliteTable,
    subtask: usize,
    bind: B,
    emitted_ns: E,
    /// Opened by `recover`.
    conn: Option<Connection>,
    /// SQL: stage one row; move an epoch; delete an epoch's staged rows.
    stage_sql: String,
    move_sql: String,
    delete_sql: String,
    _records: PhantomData<fn(&T)>,
}

impl<T, B, E> SqliteTransactions<T, B, E>
where
    B: Fn(&T, &mut SqlRow<'_, '_>),
    E: Fn(&T) -> u64,
{
    /// Transactions of sink subtask `subtask` into `table`. The database is
    /// opened at the first call (recover).
    pub fn new(table: SqliteTable, subtask: usize, bind: B, emitted_ns: E) -> Self {
        let stage = format!("weir_stage_{}", table.sink_name);
        let cols: Vec<String> = (0..table.columns.len()).map(|i| format!("c{i}")).collect();
        let params: Vec<String> = (0..table.columns.len()).map(|i| format!("?{}", i + 3)).collect();
        SqliteTransactions {
            stage_sql: format!(
                "INSERT INTO \"{stage}\" (subtask, epoch, {}) VALUES (?1, ?2, {})",
                cols.join(", "),
                params.join(", ")
            ),
            move_sql: format!(
                "INSERT INTO \"{}\" ({}) SELECT {} FROM \"{stage}\" WHERE subtask = ?1 AND epoch = ?2 ORDER BY rowid",
                table.table,
                sql::column_list(&table.columns),
                cols.join(", ")
            ),
            delete_sql: format!("DELETE FROM \"{stage}\" WHERE subtask = ?1 AND epoch = ?2"),
            table,
            subtask,
            bind,
            emitted_ns,
            conn: None,
            _records: PhantomData,
        }
    }

    fn stage_table(&self) -> String {
        format!("weir_stage_{}", self.table.sink_name)
    }

    fn conn(&self) -> Result<&Connection> {
        self.conn.as_ref().ok_or_else(|| Error::Sqlite {
            db: self.table.db.clone(),
            context: "the sink was used before recover() opened the database".into(),
            source: rusqlite::Error::InvalidQuery,
        })
    }

    fn stage(&mut self, txn: &mut SqliteTxn, batch: &mut Vec<T>) -> Result<()> {
        fault(FAULT_WRITE, "stage rows in", &self.table.db)?;
        let (table, subtask, bind) = (&self.table, self.subtask, &self.bind);
        let conn = self.conn.as_mut().ok_or_else(|| Error::Sqlite {
            db: table.db.clone(),
            context: "the sink was used before recover() opened the database".into(),
            source: rusqlite::Error::InvalidQuery,
        })?;
        let columns = table.columns.len();
        let epoch = txn.epoch;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(table.err(format!("begin staging epoch {epoch}")))?;
        {
            let mut stmt = tx
                .prepare_cached(&self.stage_sql)
                .map_err(table.err("prepare the staging insert"))?;
            for r in batch.drain(..) {
                let staged = stmt
                    .raw_bind_parameter(1, subtask as i64)
                    .and_then(|_| stmt.raw_bind_parameter(2, epoch as i64))
                    .and_then(|_| {
                        let mut row = SqlRow::new(&mut stmt, 3);
                        bind(&r, &mut row);
                        row.check(columns)
                    })
                    .and_then(|_| stmt.raw_execute());
                staged.map_err(table.err(format!("stage a row of epoch {epoch}")))?;
                txn.rows += 1;
            }
        }
        tx.commit()
            .map_err(table.err(format!("commit staged rows of epoch {epoch}")))?;
        Ok(())
    }

    fn commit_txn(&mut self, txn: &SqliteTxn) -> Result<()> {
        fault(FAULT_COMMIT, "commit epoch in", &self.table.db)?;
        let (table, subtask) = (&self.table, self.subtask);
        let conn = self.conn.as_mut().ok_or_else(|| Error::Sqlite {
            db: table.db.clone(),
            context: "the sink was used before recover() opened the database".into(),
            source: rusqlite::Error::InvalidQuery,
        })?;
        let epoch = txn.epoch;
        let (move_sql, delete_sql) = (&self.move_sql, &self.delete_sql);
        let ctx = format!("commit epoch {epoch} of subtask {subtask}");
        let moved = sql::durably(conn, |c| {
            // IMMEDIATE: take the write lock before reading the fence.
            let tx = Transaction::new_unchecked(c, TransactionBehavior::Immediate)?;
            let committed: i64 = tx.query_row(
                "SELECT committed FROM weir_sink_epochs WHERE sink = ?1 AND subtask = ?2",
                (&table.sink_name, subtask as i64),
                |r| r.get(0),
            )?;
            if committed as u64 >= epoch {
                return Ok(None); // committed before: the fence makes this a no-op
            }
            let moved = tx.execute(move_sql, (subtask as i64, epoch as i64))?;
            if moved as u64 != txn.rows {
                return Ok(Some(moved)); // rolled back when `tx` drops
            }
            tx.execute(delete_sql, (subtask as i64, epoch as i64))?;
            tx.execute(
                "UPDATE weir_sink_epochs SET committed = ?3 WHERE sink = ?1 AND subtask = ?2",
                (&table.sink_name, subtask as i64, epoch as i64),
            )?;
            tx.commit()?;
            Ok(Some(moved))
        })
        .map_err(table.err(ctx))?;
        match moved {
            Some(n) if n as u64 != txn.rows => Err(Error::Sqlite {
                db: table.db.clone(),
                context: format!(
                    "commit epoch {epoch} of subtask {subtask}: {} rows were staged, {n} found: staged rows were lost",
                    txn.rows
                ),
                source: rusqlite::Error::QueryReturnedNoRows,
            }),
            _ => Ok(()),
        }
    }
}

impl<T, B, E> TwoPhaseCommit<T> for SqliteTransactions<T, B, E>
where
    T: Send + 'static,
    B: Fn(&T, &mut SqlRow<'_, '_>) + Send + 'static,
    E: Fn(&T) -> u64 + Send + 'static,
{
    type Txn = SqliteTxn;

    fn begin_transaction(&mut self, epoch: u64) -> Result<SqliteTxn, BoxError> {
        Ok(SqliteTxn { epoch, rows: 0 })
    }

    fn write(&mut self, txn: &mut SqliteTxn, batch: &mut Vec<T>) -> Result<(), BoxError> {
        Ok(self.stage(txn, batch)?)
    }

    fn pre_commit(&mut self, txn: &mut SqliteTxn) -> Result<(), BoxError> {
        if txn.rows == 0 {
            return Ok(());
        }
        fault(FAULT_PRECOMMIT, "pre-commit epoch in", &self.table.db)?;
        sql::mark_precommitted(self.conn()?, &self.table, self.subtask, txn.epoch)?;
        Ok(())
    }

    fn commit(&mut self, txn: &SqliteTxn) -> Result<(), BoxError> {
        if txn.rows == 0 {
            return Ok(());
        }
        Ok(self.commit_txn(txn)?)
    }

    fn abort(&mut self, txn: &SqliteTxn) -> Result<(), BoxError> {
        fault(FAULT_ABORT, "abort epoch in", &self.table.db)?;
        self.conn()?
            .execute(&self.delete_sql, (self.subtask as i64, txn.epoch as i64))
            .map_err(self.table.err(format!("abort epoch {}", txn.epoch)))?;
        Ok(())
    }

    fn recover(&mut self, restored: Option<u64>) -> Result<(), BoxError> {
        let conn = sql::open(&self.table, self.subtask)?;
        let cols: Vec<String> = (0..self.table.columns.len()).map(|i| format!("c{i}")).collect();
        let stage = self.stage_table();
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS \"{stage}\" (subtask INTEGER NOT NULL, epoch INTEGER NOT NULL, {});
             CREATE INDEX IF NOT EXISTS \"{stage}_epoch\" ON \"{stage}\" (subtask, epoch);",
            cols.join(", ")
        ))
        .map_err(self.table.err("create the staging table"))?;
        let committed = sql::committed_epoch(&conn, &self.table, self.subtask)?;
        let floor = restored.unwrap_or(0);
        if committed > floor {
            return Err(Error::TargetAhead {
                sink: "two-phase SQLite",
                subtask: self.subtask,
                target: format!("{} table {}", self.table.db.display(), self.table.table),
                committed,
                restored,
            }
            .into());
        }
        conn.execute(
            &format!("DELETE FROM \"{stage}\" WHERE subtask = ?1 AND epoch > ?2"),
            (self.subtask as i64, floor as i64),
        )
        .map_err(self.table.err("discard rows staged after the checkpoint"))?;
        self.conn = Some(conn);
        Ok(())
    }

    #[inline]
    fn emitted_ns(&self, record: &T) -> u64 {
        (self.emitted_ns)(record)
    }
}
