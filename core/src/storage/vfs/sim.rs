//! A simulated disk: in memory, seeded, and as unkind as POSIX allows.
//!
//! What it models, after the storage fault models of TigerBeetle's VOPR
//! and FoundationDB's simulator (read, not copied):
//!
//! - A crash ([`SimFs::crash`]) keeps what was made durable and, for what
//!   was not, whatever the seed picks. A file's data written since its last
//!   `fsync`/`fdatasync` is kept whole, lost whole, or torn: each 512-byte
//!   sector old or new independently, the length old or new (a sector past
//!   the old length that is not kept reads as zeros).
//! - Folder entries (create, rename, remove) not yet made durable by an
//!   fsync of their folder may be undone: each folder keeps a prefix of its
//!   operations since its last sync, the seed picking its length. A rename
//!   inside one folder is one operation (it never leaves both names or
//!   neither); a rename across folders is a removal in one and a creation
//!   in the other, each undone on its own, as POSIX allows.
//! - Injected faults, each one in N operations as [`Faults`] says:
//!   `ENOSPC` and `EIO` on writes and syncs, and one flipped bit in the
//!   bytes a read returns (the disk keeps the right bytes: rot on the way).
//! - A crash point ([`SimFs::crash_after`]): the operation with that
//!   number and every later one fail as if the machine had stopped there;
//!   nothing reaches the disk after it. The test then stops the job and
//!   calls [`SimFs::crash`]. The threads that used the disk before a crash
//!   are the crashed machine's: every later operation of theirs fails (a
//!   thread of the stopped job still winding down must not write to the
//!   restarted disk, as no thread of a crashed process can).
//!
//! Every decision is a function of the seed and the operation's number, so
//! one thread doing the same operations gets the same faults. (A job's
//! threads can interleave their operations differently from run to run:
//! replaying a seed replays its faults and crash point, not its thread
//! schedule.)

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use super::{File, FileOps, Fs, Metadata, OpenOptions};
use crate::storage::corruption::Report;

/// Sector size: the unit a torn write keeps or loses.
pub const SECTOR: usize = 512;

/// How often each fault is injected: one in this many operations of its
/// kind; 0 never.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// `ENOSPC` on a write.
    pub write_enospc: u32,
    /// `EIO` on a write.
    pub write_eio: u32,
    /// `ENOSPC` on a sync (file or folder).
    pub sync_enospc: u32,
    /// `EIO` on a sync (file or folder).
    pub sync_eio: u32,
    /// One flipped bit in what a read returns.
    pub read_flip: u32,
}

/// What kind of fault was injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `ENOSPC`.
    NoSpace,
    /// `EIO`.
    Io,
    /// A bit flipped in what a read returned.
    BitFlip,
}

/// The call a fault was injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Creating a file (an open that creates it).
    CreateFile,
    /// Creating a folder.
    CreateDir,
    /// A write to an open file.
    Write,
    /// `fdatasync` of an open file.
    Sync,
    /// fsync of a folder.
    SyncDir,
    /// A read.
    Read,
}

/// One injected fault: what, at which operation and call, on which file,
/// and (for a bit flip) at which byte of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    /// The operation's number.
    pub op: u64,
    /// The call that failed (or whose result flipped).
    pub call: Call,
    /// What was injected.
    pub kind: FaultKind,
    /// The file or folder.
    pub path: PathBuf,
    /// The byte of the file whose bit flipped.
    pub offset: Option<u64>,
    /// The thread that made the call (its name, or its id): which part of
    /// weir read a flipped byte, when a test asks.
    pub thread: String,
}

/// The calling thread's name, or its id.
fn thread_name() -> String {
    let t = std::thread::current();
    t.name().map_or_else(|| format!("{:?}", t.id()), str::to_string)
}

/// The message of every operation at or after a crash point.
pub const CRASHED: &str = "simulated crash: the machine stopped here";

enum Node {
    File {
        cur: Vec<u8>,
        synced: Vec<u8>,
    },
    Dir {
        cur: BTreeMap<String, u64>,
        durable: BTreeMap<String, u64>,
        log: Vec<DirOp>,
    },
}

#[derive(Clone, Debug)]
enum DirOp {
    Link(String, u64),
    Unlink(String),
    Rename(String, String, u64),
}

impl DirOp {
    fn apply(&self, entries: &mut BTreeMap<String, u64>) {
        match self {
            DirOp::Link(n, ino) => {
                entries.insert(n.clone(), *ino);
            }
            DirOp::Unlink(n) => {
                entries.remove(n);
            }
            DirOp::Rename(from, to, ino) => {
                entries.remove(from);
                entries.insert(to.clone(), *ino);
            }
        }
    }
}

struct State {
    seed: u64,
    faults: Faults,
    ops: u64,
    crash_at: Option<u64>,
    down: bool,
    generation: u64,
    crashes: u64,
    next_ino: u64,
    nodes: HashMap<u64, Node>,
    injected: Vec<Injected>,
    /// Damaged bytes weir reported, since [`SimFs::take_detected`].
    detected: Vec<Report>,
    /// Threads that did operations since the last crash.
    active: HashSet<ThreadId>,
    /// Threads of a crashed machine: they never run again.
    dead: HashSet<ThreadId>,
    /// `WEIR_SIM_TRACE=1`: every operation printed to stderr.
    trace: bool,
}

const ROOT: u64 = 0;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small deterministic generator (splitmix64) for the crash model.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix64(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file or folder", path.display()),
    )
}

impl State {
    /// Counts one operation; fails it at or after the crash point.
    fn op(&mut self, what: &str, path: &Path) -> io::Result<u64> {
        let me = std::thread::current().id();
        if self.trace {
            let t = std::thread::current();
            eprintln!(
                "simfs op {} {} {what} {}{}",
                self.ops + 1,
                t.name().unwrap_or("?"),
                path.display(),
                if self.down || self.dead.contains(&me) {
                    " (refused: crashed)"
                } else {
                    ""
                }
            );
        }
        if self.down || self.dead.contains(&me) {
            return Err(io::Error::other(CRASHED));
        }
        self.active.insert(me);
        self.ops += 1;
        if self.crash_at.is_some_and(|at| self.ops >= at) {
            self.down = true;
            return Err(io::Error::other(CRASHED));
        }
        Ok(self.ops)
    }

    /// Every thread that used the disk, but the caller's, never runs again.
    fn retire_threads(&mut self) {
        let me = std::thread::current().id();
        let active = std::mem::take(&mut self.active);
        self.dead.extend(active.into_iter().filter(|t| *t != me));
    }

    fn roll(&self, op: u64, salt: u64, one_in: u32) -> bool {
        one_in > 0 && splitmix64(self.seed ^ splitmix64(op ^ salt.rotate_left(40))).is_multiple_of(u64::from(one_in))
    }

    /// Injects `ENOSPC` or `EIO` at operation `op`, a `call` that writes or syncs.
    fn inject(&mut self, op: u64, call: Call, path: &Path) -> io::Result<()> {
        let write = matches!(call, Call::CreateFile | Call::CreateDir | Call::Write);
        let (nospc, eio) = if write {
            (self.faults.write_enospc, self.faults.write_eio)
        } else {
            (self.faults.sync_enospc, self.faults.sync_eio)
        };
        let (kind, code) = if self.roll(op, 1, nospc) {
            (FaultKind::NoSpace, libc::ENOSPC)
        } else if self.roll(op, 2, eio) {
            (FaultKind::Io, libc::EIO)
        } else {
            return Ok(());
        };
        self.injected.push(Injected {
            op,
            call,
            kind,
            path: path.to_path_buf(),
            offset: None,
            thread: thread_name(),
        });
        Err(err(code))
    }

    /// Maybe flips one bit of `bytes`, read from `path` at `at`.
    fn flip(&mut self, op: u64, path: &Path, at: u64, bytes: &mut [u8]) {
        if bytes.is_empty() || !self.roll(op, 3, self.faults.read_flip) {
            return;
        }
        let r = splitmix64(self.seed ^ op ^ 0x5eed);
        let i = (r % bytes.len() as u64) as usize;
        bytes[i] ^= 1 << ((r >> 32) % 8);
        self.injected.push(Injected {
            op,
            call: Call::Read,
            kind: FaultKind::BitFlip,
            path: path.to_path_buf(),
            offset: Some(at + i as u64),
            thread: thread_name(),
        });
    }

    fn dir(&mut self, ino: u64) -> io::Result<&mut BTreeMap<String, u64>> {
        match self.nodes.get_mut(&ino) {
            Some(Node::Dir { cur, .. }) => Ok(cur),
            _ => Err(err(libc::ENOTDIR)),
        }
    }

    fn log(&mut self, dir: u64, op: DirOp) {
        if let Some(Node::Dir { cur, log, .. }) = self.nodes.get_mut(&dir) {
            op.apply(cur);
            log.push(op);
        }
    }

    fn new_node(&mut self, node: Node) -> u64 {
        self.next_ino += 1;
        self.nodes.insert(self.next_ino, node);
        self.next_ino
    }
}

/// The simulated disk; mount it with [`super::mount`] at its root.
#[derive(Clone)]
pub struct SimFs {
    root: PathBuf,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for SimFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimFs({})", self.root.display())
    }
}

impl SimFs {
    /// An empty disk whose root folder is `root`, deciding with `seed`.
    pub fn new(root: impl Into<PathBuf>, seed: u64, faults: Faults) -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node::Dir {
                cur: BTreeMap::new(),
                durable: BTreeMap::new(),
                log: Vec::new(),
            },
        );
        SimFs {
            root: root.into(),
            state: Arc::new(Mutex::new(State {
                seed,
                faults,
                ops: 0,
                crash_at: None,
                down: false,
                generation: 0,
                crashes: 0,
                next_ino: ROOT,
                nodes,
                injected: Vec::new(),
                detected: Vec::new(),
                active: HashSet::new(),
                dead: HashSet::new(),
                trace: std::env::var("WEIR_SIM_TRACE").is_ok_and(|v| v == "1"),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The faults injected from now on.
    pub fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    /// Operations so far.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Stops the machine at the `n`-th operation from now (that one and
    /// every later one fail); `None` removes the crash point.
    pub fn crash_after(&self, n: Option<u64>) {
        let mut s = self.lock();
        s.crash_at = n.map(|n| s.ops + n.max(1));
    }

    /// Whether the crash point was reached.
    pub fn is_down(&self) -> bool {
        self.lock().down
    }

    /// The process that used the disk ended (without a crash): its
    /// threads, all but the caller's, never run again, as none of a
    /// process that exited can. A test calls it between runs that stand
    /// for processes, so that a thread of a failed job still winding down
    /// does not act on the next run's disk.
    pub fn end_process(&self) {
        self.lock().retire_threads();
    }

    /// The faults injected since the last call.
    pub fn take_injected(&self) -> Vec<Injected> {
        std::mem::take(&mut self.lock().injected)
    }

    /// The damaged bytes weir reported on this disk since the last call.
    pub fn take_detected(&self) -> Vec<Report> {
        std::mem::take(&mut self.lock().detected)
    }

    /// The machine crashes and restarts: what was not durable is kept,
    /// lost or torn as the seed decides (see the module docs); open files
    /// become unusable. Returns how many files and folders lost or tore
    /// something.
    pub fn crash(&self) -> u64 {
        let mut s = self.lock();
        s.crashes += 1;
        let mut rng = Rng(s.seed ^ splitmix64(s.crashes));
        let mut changed = 0;
        let trace = s.trace;
        let mut inos: Vec<u64> = s.nodes.keys().copied().collect();
        inos.sort_unstable();
        // Folders: keep a prefix of the unsynced operations.
        for &ino in &inos {
            if let Some(Node::Dir { cur, durable, log }) = s.nodes.get_mut(&ino) {
                if log.is_empty() {
                    continue;
                }
                let keep = match rng.below(3) {
                    0 => log.len(),
                    1 => 0,
                    _ => rng.below(log.len() as u64 + 1) as usize,
                };
                if keep < log.len() {
                    changed += 1;
                    if trace {
                        eprintln!("simfs crash: folder #{ino} undoes {:?}", &log[keep..]);
                    }
                }
                for op in &log[..keep] {
                    op.apply(durable);
                }
                *cur = durable.clone();
                log.clear();
            }
        }
        // What the folders reach now.
        let mut reachable = HashSet::new();
        let mut stack = vec![ROOT];
        while let Some(ino) = stack.pop() {
            if !reachable.insert(ino) {
                continue;
            }
            if let Some(Node::Dir { cur, .. }) = s.nodes.get(&ino) {
                stack.extend(cur.values().copied());
            }
        }
        s.nodes.retain(|ino, _| reachable.contains(ino));
        // Files: unsynced data kept, lost or torn.
        for &ino in &inos {
            if let Some(Node::File { cur, synced }) = s.nodes.get_mut(&ino) {
                if cur == synced {
                    continue;
                }
                match rng.below(3) {
                    0 => *synced = cur.clone(),
                    1 => *cur = synced.clone(),
                    _ => {
                        let len = if rng.below(2) == 0 { cur.len() } else { synced.len() };
                        let mut torn = vec![0u8; len];
                        for (i, sector) in torn.chunks_mut(SECTOR).enumerate() {
                            let from = if rng.below(2) == 0 { &*cur } else { &*synced };
                            let start = i * SECTOR;
                            let have = from.len().saturating_sub(start).min(sector.len());
                            if have > 0 {
                                sector[..have].copy_from_slice(&from[start..start + have]);
                            }
                        }
                        *cur = torn.clone();
                        *synced = torn;
                    }
                }
                changed += 1;
            }
        }
        // The crashed machine's threads are gone with it: a thread of the
        // stopped job that is still winding down in this process must not
        // act on the restarted disk. The caller (the test, which restarts
        // the job) goes on.
        s.retire_threads();
        s.generation += 1;
        s.down = false;
        s.crash_at = None;
        changed
    }

    /// The components of `path` under the root.
    fn parts<'p>(&self, path: &'p Path) -> io::Result<Vec<&'p str>> {
        let rel = path.strip_prefix(&self.root).map_err(|_| not_found(path))?;
        let mut parts = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => parts.push(n.to_str().ok_or_else(|| not_found(path))?),
                Component::CurDir => {}
                _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "unsupported path")),
            }
        }
        Ok(parts)
    }

    fn lookup(&self, s: &State, path: &Path) -> io::Result<u64> {
        let mut ino = ROOT;
        for p in self.parts(path)? {
            ino = match s.nodes.get(&ino) {
                Some(Node::Dir { cur, .. }) => *cur.get(p).ok_or_else(|| not_found(path))?,
                _ => return Err(not_found(path)),
            };
        }
        Ok(ino)
    }

    /// The folder holding `path`, and `path`'s name in it.
    fn parent(&self, s: &State, path: &Path) -> io::Result<(u64, String)> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let dir = path.parent().ok_or_else(|| not_found(path))?;
        let ino = self.lookup(s, dir)?;
        match s.nodes.get(&ino) {
            Some(Node::Dir { .. }) => Ok((ino, name.to_string())),
            _ => Err(err(libc::ENOTDIR)),
        }
    }
}

/// An open file of a [`SimFs`].
struct SimFile {
    fs: SimFs,
    path: PathBuf,
    ino: u64,
    generation: u64,
    pos: u64,
    append: bool,
}

/// The machine's state, if a file opened in `generation` is still open on it.
fn state_of(fs: &SimFs, generation: u64) -> io::Result<MutexGuard<'_, State>> {
    let s = fs.lock();
    if s.generation != generation {
        return Err(io::Error::other("file opened before a simulated crash"));
    }
    Ok(s)
}

fn file_mut(s: &mut State, ino: u64) -> io::Result<(&mut Vec<u8>, &mut Vec<u8>)> {
    match s.nodes.get_mut(&ino) {
        Some(Node::File { cur, synced }) => Ok((cur, synced)),
        _ => Err(io::Error::other("simulated file vanished")),
    }
}

impl Read for SimFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = state_of(&self.fs, self.generation)?;
        let op = s.op("read", &self.path)?;
        let (cur, _) = file_mut(&mut s, self.ino)?;
        let start = (self.pos as usize).min(cur.len());
        let n = buf.len().min(cur.len() - start);
        buf[..n].copy_from_slice(&cur[start..start + n]);
        s.flip(op, &self.path, self.pos, &mut buf[..n]);
        drop(s);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for SimFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut s = state_of(&self.fs, self.generation)?;
        let op = s.op("write", &self.path)?;
        s.inject(op, Call::Write, &self.path)?;
        let (cur, _) = file_mut(&mut s, self.ino)?;
        if self.append {
            self.pos = cur.len() as u64;
        }
        let at = self.pos as usize;
        if cur.len() < at + buf.len() {
            cur.resize(at + buf.len(), 0);
        }
        cur[at..at + buf.len()].copy_from_slice(buf);
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for SimFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let mut s = state_of(&self.fs, self.generation)?;
        let len = file_mut(&mut s, self.ino)?.0.len() as i64;
        let to = match pos {
            SeekFrom::Start(n) => n as i64,
            SeekFrom::End(d) => len + d,
            SeekFrom::Current(d) => self.pos as i64 + d,
        };
        if to < 0 {
            return Err(err(libc::EINVAL));
        }
        self.pos = to as u64;
        Ok(self.pos)
    }
}

impl FileOps for SimFile {
    fn sync_data(&self) -> io::Result<()> {
        let mut s = state_of(&self.fs, self.generation)?;
        let op = s.op("sync_data", &self.path)?;
        s.inject(op, Call::Sync, &self.path)?;
        let (cur, synced) = file_mut(&mut s, self.ino)?;
        synced.clone_from(cur);
        Ok(())
    }
    fn sync_all(&self) -> io::Result<()> {
        self.sync_data()
    }
    fn metadata(&self) -> io::Result<Metadata> {
        let mut s = state_of(&self.fs, self.generation)?;
        Ok(Metadata::new(file_mut(&mut s, self.ino)?.0.len() as u64, false))
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = state_of(&self.fs, self.generation)?;
        s.op("set_len", &self.path)?;
        file_mut(&mut s, self.ino)?.0.resize(len as usize, 0);
        Ok(())
    }
}

impl Fs for SimFs {
    fn open(&self, path: &Path, o: &OpenOptions) -> io::Result<File> {
        let mut s = self.lock();
        let op = s.op("open", path)?;
        let (dir, name) = self.parent(&s, path)?;
        let existing = s.dir(dir)?.get(&name).copied();
        let ino = match existing {
            Some(_) if o.create_new => return Err(err(libc::EEXIST)),
            Some(ino) => {
                match s.nodes.get_mut(&ino) {
                    Some(Node::File { cur, .. }) => {
                        if o.truncate && (o.write || o.append) {
                            cur.clear();
                        }
                    }
                    _ => return Err(err(libc::EISDIR)),
                }
                ino
            }
            None if o.create || o.create_new => {
                if !(o.write || o.append) {
                    return Err(err(libc::EINVAL));
                }
                s.inject(op, Call::CreateFile, path)?;
                let ino = s.new_node(Node::File {
                    cur: Vec::new(),
                    synced: Vec::new(),
                });
                s.log(dir, DirOp::Link(name, ino));
                ino
            }
            None => return Err(not_found(path)),
        };
        let generation = s.generation;
        drop(s);
        Ok(File::from_ops(Box::new(SimFile {
            fs: self.clone(),
            path: path.to_path_buf(),
            ino,
            generation,
            pos: 0,
            append: o.append,
        })))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut s = self.lock();
        let op = s.op("read whole", path)?;
        let ino = self.lookup(&s, path)?;
        let mut bytes = match s.nodes.get(&ino) {
            Some(Node::File { cur, .. }) => cur.clone(),
            _ => return Err(err(libc::EISDIR)),
        };
        s.flip(op, path, 0, &mut bytes);
        Ok(bytes)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut s = self.lock();
        s.op("read_dir", path)?;
        let ino = self.lookup(&s, path)?;
        Ok(s.dir(ino)?.keys().cloned().collect())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        let op = s.op("create_dir", path)?;
        let (dir, name) = self.parent(&s, path)?;
        if s.dir(dir)?.contains_key(&name) {
            return Err(err(libc::EEXIST));
        }
        s.inject(op, Call::CreateDir, path)?;
        let ino = s.new_node(Node::Dir {
            cur: BTreeMap::new(),
            durable: BTreeMap::new(),
            log: Vec::new(),
        });
        s.log(dir, DirOp::Link(name, ino));
        Ok(())
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let parts: Vec<String> = self.parts(path)?.into_iter().map(str::to_string).collect();
        let mut at = self.root.clone();
        for p in parts {
            at.push(p);
            match self.create_dir(&at) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    if !self.metadata(&at)?.is_dir() {
                        return Err(err(libc::ENOTDIR));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.op(&format!("rename to {}:", to.display()), from)?;
        let (fd, fname) = self.parent(&s, from)?;
        let (td, tname) = self.parent(&s, to)?;
        let ino = *s.dir(fd)?.get(&fname).ok_or_else(|| not_found(from))?;
        if let Some(t) = s.dir(td)?.get(&tname).copied() {
            if matches!(s.nodes.get(&t), Some(Node::Dir { .. })) {
                return Err(err(libc::EISDIR));
            }
        }
        if fd == td {
            s.log(fd, DirOp::Rename(fname, tname, ino));
        } else {
            s.log(fd, DirOp::Unlink(fname));
            s.log(td, DirOp::Link(tname, ino));
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.op("remove_file", path)?;
        let (dir, name) = self.parent(&s, path)?;
        let ino = *s.dir(dir)?.get(&name).ok_or_else(|| not_found(path))?;
        if matches!(s.nodes.get(&ino), Some(Node::Dir { .. })) {
            return Err(err(libc::EISDIR));
        }
        s.log(dir, DirOp::Unlink(name));
        Ok(())
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.op("remove_dir_all", path)?;
        let (dir, name) = self.parent(&s, path)?;
        if !s.dir(dir)?.contains_key(&name) {
            return Err(not_found(path));
        }
        // The subtree becomes unreachable with its entry (a real removal
        // unlinks bottom-up; its undoing by a crash is the same prefix
        // rule, and an undone folder entry brings the subtree back).
        s.log(dir, DirOp::Unlink(name));
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        let op = s.op("sync_dir", path)?;
        let ino = self.lookup(&s, path)?;
        s.inject(op, Call::SyncDir, path)?;
        match s.nodes.get_mut(&ino) {
            Some(Node::Dir { cur, durable, log }) => {
                durable.clone_from(cur);
                log.clear();
                Ok(())
            }
            _ => Err(err(libc::ENOTDIR)),
        }
    }

    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        let s = self.lock();
        if s.down {
            return Err(io::Error::other(CRASHED));
        }
        let ino = self.lookup(&s, path)?;
        Ok(match s.nodes.get(&ino) {
            Some(Node::File { cur, .. }) => Metadata::new(cur.len() as u64, false),
            _ => Metadata::new(0, true),
        })
    }
    fn corruption_detected(&self, report: &Report) {
        self.lock().detected.push(report.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(seed: u64) -> SimFs {
        SimFs::new("/sim-unit", seed, Faults::default())
    }

    fn write(fs: &SimFs, path: &str, bytes: &[u8], sync: bool) {
        let mut f = fs
            .open(Path::new(path), OpenOptions::new().write(true).create(true))
            .unwrap();
        f.write_all(bytes).unwrap();
        if sync {
            f.sync_data().unwrap();
        }
    }

    #[test]
    fn durable_steps_survive_every_crash() {
        for seed in 0..64 {
            let fs = sim(seed);
            fs.create_dir(Path::new("/sim-unit/d")).unwrap();
            fs.sync_dir(Path::new("/sim-unit")).unwrap();
            write(&fs, "/sim-unit/d/.a.tmp", &[7; 2000], true);
            fs.rename(Path::new("/sim-unit/d/.a.tmp"), Path::new("/sim-unit/d/a"))
                .unwrap();
            fs.sync_dir(Path::new("/sim-unit/d")).unwrap();
            fs.crash();
            assert_eq!(
                fs.read(Path::new("/sim-unit/d/a")).unwrap(),
                vec![7; 2000],
                "seed {seed}"
            );
            assert_eq!(fs.read_dir(Path::new("/sim-unit/d")).unwrap(), vec!["a".to_string()]);
        }
    }

    #[test]
    fn a_crash_loses_keeps_or_tears_what_was_not_synced() {
        let (mut lost, mut kept, mut torn, mut undone) = (0, 0, 0, 0);
        for seed in 0..200 {
            let fs = sim(seed);
            write(&fs, "/sim-unit/f", &[1; 4 * SECTOR], true);
            fs.sync_dir(Path::new("/sim-unit")).unwrap();
            let mut f = fs
                .open(Path::new("/sim-unit/f"), OpenOptions::new().write(true))
                .unwrap();
            f.write_all(&[2; 5 * SECTOR]).unwrap();
            // A rename never synced: kept or undone, never half.
            write(&fs, "/sim-unit/g.tmp", b"g", true);
            fs.rename(Path::new("/sim-unit/g.tmp"), Path::new("/sim-unit/g"))
                .unwrap();
            fs.crash();
            let after = fs.read(Path::new("/sim-unit/f")).unwrap();
            assert!(after.len() == 4 * SECTOR || after.len() == 5 * SECTOR);
            let sectors: Vec<u8> = after.chunks(SECTOR).map(|c| c[0]).collect();
            for c in after.chunks(SECTOR) {
                assert!(c.iter().all(|&b| b == c[0]), "a sector is whole");
            }
            match sectors.as_slice() {
                [1, 1, 1, 1] => lost += 1,
                [2, 2, 2, 2, 2] => kept += 1,
                _ => torn += 1,
            }
            let names = fs.read_dir(Path::new("/sim-unit")).unwrap();
            let g = names.contains(&"g".to_string());
            let tmp = names.contains(&"g.tmp".to_string());
            assert!(g != tmp || (!g && !tmp), "seed {seed}: {names:?}");
            if !g {
                undone += 1;
            }
            // Open files do not outlive the crash.
            assert!(f.write_all(b"x").is_err());
        }
        assert!(
            lost > 0 && kept > 0 && torn > 0 && undone > 0,
            "{lost} {kept} {torn} {undone}"
        );
    }

    #[test]
    fn the_crash_point_stops_every_later_operation() {
        let fs = sim(1);
        fs.crash_after(Some(3));
        write(&fs, "/sim-unit/a", b"a", false); // open, write: ops 1, 2
        assert!(fs.create_dir(Path::new("/sim-unit/d")).is_err());
        assert!(fs.is_down());
        assert!(fs.read_dir(Path::new("/sim-unit")).is_err());
        fs.crash();
        assert!(!fs.is_down());
        assert!(fs.read_dir(Path::new("/sim-unit")).is_ok());
    }

    #[test]
    fn faults_are_injected_recorded_and_replayed_by_seed() {
        let run = |seed| {
            let fs = SimFs::new(
                "/sim-unit",
                seed,
                Faults {
                    write_enospc: 5,
                    sync_eio: 5,
                    read_flip: 3,
                    ..Faults::default()
                },
            );
            let mut results = Vec::new();
            for i in 0..50 {
                let p = PathBuf::from(format!("/sim-unit/f{i}"));
                let r = fs
                    .open(&p, OpenOptions::new().write(true).create(true))
                    .and_then(|mut f| {
                        f.write_all(&[i as u8; 100])?;
                        f.sync_data()
                    });
                let written = r.is_ok();
                results.push(r.map_err(|e| e.raw_os_error()));
                if written {
                    let b = fs.read(&p).unwrap();
                    results.push(if b == vec![i as u8; 100] { Ok(()) } else { Err(Some(-1)) });
                }
            }
            (results, fs.take_injected())
        };
        let (a, ia) = run(9);
        let (b, ib) = run(9);
        assert_eq!(a, b);
        assert_eq!(ia, ib);
        assert!(a.contains(&Err(Some(libc::ENOSPC))));
        assert!(a.contains(&Err(Some(libc::EIO))));
        let flips = ia.iter().filter(|i| i.kind == FaultKind::BitFlip).count();
        assert_eq!(flips, a.iter().filter(|r| **r == Err(Some(-1))).count());
        assert!(flips > 0);
        assert!(ia
            .iter()
            .all(|i| i.kind != FaultKind::BitFlip || i.offset.is_some_and(|o| o < 100)));
    }
}
