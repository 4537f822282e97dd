//! What the SQLite sinks share: the target table's description
//! ([`SqliteTable`]), the row binder handed to the user's function
//! ([`SqlRow`]), and the bookkeeping table `weir_sink_epochs`.
//!
//! Every sink subtask has its own connection. Connections use SQLite's WAL
//! journal with `synchronous=NORMAL` for ordinary writes (no fsync per
//! write transaction) and switch to `synchronous=FULL` for the transactions
//! that must be durable when they return (pre-commit, commit): in WAL mode
//! a FULL commit fsyncs the log, which makes every earlier transaction
//! durable too. That is the group commit: one fsync per checkpoint.
//!
//! `weir_sink_epochs(sink, subtask, committed, precommitted)` holds, per
//! sink name and subtask, the last committed epoch (the fence that makes a
//! repeated commit a no-op) and the last pre-committed one.

use std::path::PathBuf;
use std::time::Duration;

use rusqlite::types::ToSql;
use rusqlite::{Connection, Statement};

use crate::{Error, Result};

/// How long a connection waits for another subtask's write transaction:
/// 30 s. Write transactions here are short (one batch, one commit), so
/// waiting longer means something is stuck.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between two attempts to switch a database to the WAL journal
/// while another connection holds it (see `open`).
const JOURNAL_RETRY: Duration = Duration::from_millis(2);

/// A table the SQLite sinks write into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteTable {
    /// The database file (created if absent).
    pub db: PathBuf,
    /// The table's name.
    pub table: String,
    /// The columns the sink fills, in the order the bind function pushes.
    pub columns: Vec<String>,
    /// For the upsert sink: the columns (a subset of `columns`) of a
    /// primary key or unique index the upsert conflicts on.
    pub key: Vec<String>,
    /// SQL run on every connection before anything else, typically a
    /// `CREATE TABLE IF NOT EXISTS`.
    pub create_sql: Option<String>,
    /// Name of the sink in `weir_sink_epochs` (default: the table's name);
    /// distinct sinks into one database need distinct names.
    pub sink_name: String,
}

impl SqliteTable {
    /// Rows of `columns` in `table` of database `db`.
    pub fn new(db: impl Into<PathBuf>, table: &str, columns: &[&str]) -> Self {
        SqliteTable {
            db: db.into(),
            table: table.to_string(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            key: Vec::new(),
            create_sql: None,
            sink_name: table.to_string(),
        }
    }

    /// Sets the key columns of the upsert sink.
    pub fn key(mut self, key: &[&str]) -> Self {
        self.key = key.iter().map(|c| c.to_string()).collect();
        self
    }

    /// Sets SQL to run on every connection first (create the table).
    pub fn create(mut self, sql: &str) -> Self {
        self.create_sql = Some(sql.to_string());
        self
    }

    /// Sets the sink's name in `weir_sink_epochs`.
    pub fn sink_name(mut self, name: &str) -> Self {
        self.sink_name = name.to_string();
        self
    }

    /// Checks the names: identifiers of letters, digits and `_`, not
    /// starting with a digit (they are put into SQL text), at least one
    /// column, and the key a subset of the columns.
    pub fn validate(&self) -> Result<()> {
        let ident = |setting: &'static str, s: &str| {
            let ok = !s.is_empty()
                && !s.as_bytes()[0].is_ascii_digit()
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if ok {
                Ok(())
            } else {
                Err(Error::InvalidConfig {
                    setting,
                    value: s.to_string(),
                    reason: "must be an identifier: letters, digits and _, not starting with a digit",
                })
            }
        };
        ident("table", &self.table)?;
        ident("sink_name", &self.sink_name)?;
        if self.columns.is_empty() {
            return Err(Error::InvalidConfig {
                setting: "columns",
                value: "[]".into(),
                reason: "at least one column is needed",
            });
        }
        for c in self.columns.iter().chain(&self.key) {
            ident("columns", c)?;
        }
        if let Some(k) = self.key.iter().find(|k| !self.columns.contains(k)) {
            return Err(Error::InvalidConfig {
                setting: "key",
                value: k.clone(),
                reason: "a key column must be one of the columns",
            });
        }
        Ok(())
    }

    /// A [`Error::Sqlite`] on this database.
    pub(crate) fn err(&self, context: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> Error + '_ {
        let context = context.into();
        move |source| Error::Sqlite {
            db: self.db.clone(),
            context,
            source,
        }
    }
}

/// The values of one row, bound in column order by the user's function.
///
/// ```
/// # fn bind(row: &mut weir_io::SqlRow<'_, '_>) {
/// row.push("key-1").push(42i64).push(None::<String>);
/// # }
/// ```
pub struct SqlRow<'a, 'conn> {
    stmt: &'a mut Statement<'conn>,
    /// 1-based index of the first column's parameter.
    base: usize,
    pushed: usize,
    error: Option<rusqlite::Error>,
}

impl<'a, 'conn> SqlRow<'a, 'conn> {
    pub(crate) fn new(stmt: &'a mut Statement<'conn>, base: usize) -> Self {
        SqlRow {
            stmt,
            base,
            pushed: 0,
            error: None,
        }
    }

    /// Binds the next column's value: integers, floats, `&str`, `String`,
    /// byte slices, `Option` of those (`None` is NULL), anything
    /// [`ToSql`]. A `u64` above `i64::MAX` is an error.
    pub fn push(&mut self, value: impl ToSql) -> &mut Self {
        if self.error.is_none() {
            if let Err(e) = self.stmt.raw_bind_parameter(self.base + self.pushed, value) {
                self.error = Some(e);
            }
        }
        self.pushed += 1;
        self
    }

    /// Checks that exactly `columns` values were bound without error.
    pub(crate) fn check(self, columns: usize) -> std::result::Result<(), rusqlite::Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.pushed != columns {
            return Err(rusqlite::Error::InvalidParameterCount(self.pushed, columns));
        }
        Ok(())
    }
}

/// Opens a connection for a sink subtask: WAL journal, NORMAL sync, busy
/// timeout, the user's setup SQL and `weir_sink_epochs` with a row for
/// `(sink_name, subtask)`.
pub(crate) fn open(table: &SqliteTable, subtask: usize) -> Result<Connection> {
    table.validate()?;
    if let Some(dir) = table.db.parent().filter(|p| !p.as_os_str().is_empty()) {
        crate::fsutil::create_dir_durable(dir)?;
    }
    let conn = Connection::open(&table.db).map_err(table.err("open"))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(table.err("set the busy timeout"))?;
    // Switching the journal needs the database to itself, and SQLite
    // answers "busy" at once, without its busy handler, when another
    // connection (a sibling subtask opening at the same moment) holds a
    // lock: retry, within the same bound as every other wait here.
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    let mode: String = loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)) {
            Ok(mode) => break mode,
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(JOURNAL_RETRY);
            }
            Err(e) => return Err(table.err("switch to the WAL journal")(e)),
        }
    };
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Sqlite {
            db: table.db.clone(),
            context: format!("switch to the WAL journal (got journal mode {mode})"),
            source: rusqlite::Error::InvalidQuery,
        });
    }
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(table.err("set synchronous=NORMAL"))?;
    if let Some(sql) = &table.create_sql {
        conn.execute_batch(sql).map_err(table.err("run the setup SQL"))?;
    }
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS weir_sink_epochs (
            sink TEXT NOT NULL,
            subtask INTEGER NOT NULL,
            committed INTEGER NOT NULL,
            precommitted INTEGER NOT NULL,
            PRIMARY KEY (sink, subtask))",
    )
    .map_err(table.err("create weir_sink_epochs"))?;
    conn.execute(
        "INSERT OR IGNORE INTO weir_sink_epochs VALUES (?1, ?2, 0, 0)",
        (&table.sink_name, subtask as i64),
    )
    .map_err(table.err("add the sink's row to weir_sink_epochs"))?;
    Ok(conn)
}

/// Runs `f` with `synchronous=FULL`: the write transactions it commits are
/// durable when they return.
pub(crate) fn durably<R>(conn: &Connection, f: impl FnOnce(&Connection) -> rusqlite::Result<R>) -> rusqlite::Result<R> {
    conn.pragma_update(None, "synchronous", "FULL")?;
    let r = f(conn);
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    r
}

/// The last committed epoch of `(sink_name, subtask)`.
pub(crate) fn committed_epoch(conn: &Connection, table: &SqliteTable, subtask: usize) -> Result<u64> {
    let e: i64 = conn
        .query_row(
            "SELECT committed FROM weir_sink_epochs WHERE sink = ?1 AND subtask = ?2",
            (&table.sink_name, subtask as i64),
            |r| r.get(0),
        )
        .map_err(table.err("read the committed epoch"))?;
    Ok(e as u64)
}

/// Durably records that `(sink_name, subtask)` pre-committed `epoch`:
/// every earlier write transaction of the connection is durable after it.
pub(crate) fn mark_precommitted(conn: &Connection, table: &SqliteTable, subtask: usize, epoch: u64) -> Result<()> {
    durably(conn, |c| {
        c.execute(
            "UPDATE weir_sink_epochs SET precommitted = ?3 WHERE sink = ?1 AND subtask = ?2",
            (&table.sink_name, subtask as i64, epoch as i64),
        )
    })
    .map_err(table.err(format!("record the pre-commit of epoch {epoch}")))?;
    Ok(())
}

/// `"a", "b", "c"` quoted and joined for SQL text (names are validated).
pub(crate) fn column_list(columns: &[String]) -> String {
    columns
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ")
}
