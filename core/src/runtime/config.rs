//! Runtime settings: how many workers, where they run, how big the rings are.
//!
//! Every setting has a default that suits this machine class (one worker per
//! core, 2048-slot rings, 1024-record batches) and is checked by
//! [`RuntimeConfig::validate`] before any thread starts.

use crate::checkpoint::{CheckpointConfig, RestartStrategy};
use crate::state::StateBackend;
use crate::threads::idle::IdleStrategy;
use crate::threads::placement::HelperPlacement;
use crate::{Error, Result};

/// Smallest accepted ring capacity: below this, chunked transfers degrade to
/// per-record handoffs and backpressure oscillates.
pub const MIN_RING_CAPACITY: usize = 16;
/// Largest accepted ring capacity (2^24 slots): bounds memory per channel.
pub const MAX_RING_CAPACITY: usize = 1 << 24;
/// Largest accepted batch size: a batch is the scheduling quantum, and one
/// task must not monopolise a shared worker for long.
pub const MAX_BATCH_SIZE: usize = 1 << 16;
/// Most workers a job may start.
pub const MAX_WORKERS: usize = 1024;

/// Settings of the runtime that executes a [`crate::Pipeline`].
///
/// ```
/// use weir_core::RuntimeConfig;
/// let cfg = RuntimeConfig { workers: 2, ring_capacity: 4096, ..RuntimeConfig::default() };
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Number of worker threads. Default: one per available core.
    pub workers: usize,
    /// Pin worker `i` to core `i mod cores` with `core_affinity`. Default: true.
    pub pin_workers: bool,
    /// Where weir's other threads run (the job thread with the checkpoint
    /// coordinator, the snapshot pool, sinks' I/O threads). Default:
    /// [`HelperPlacement::SpareCores`], the cores no worker runs on when
    /// there are any: with `workers` below the core count, the workers'
    /// cores run nothing but workers, which keeps checkpoints and sink I/O
    /// out of processing latency (see
    /// `docs/design/architecture.md#where-weirs-own-threads-run`).
    pub helpers: HelperPlacement,
    /// Slots per SPSC ring (one ring per producer/consumer subtask pair).
    /// Default 2048: two batches in flight per ring. Every queued record is
    /// one an aligned barrier waits behind and an unaligned one persists as
    /// channel state; against 8192 slots, on the 10,000-key job, 2048 cut
    /// processing latency p99 from about 1 ms to 0.25 ms and the aligned
    /// checkpoint behind a slow operator from 102 to 32 ms, with the same
    /// or better throughput (the rings stay in the cores' caches).
    pub ring_capacity: usize,
    /// Most records a task handles per scheduling turn (its batch budget).
    pub batch_size: usize,
    /// How idle workers (and producers facing a full ring) wait.
    pub idle: IdleStrategy,
    /// Checkpointing; `None` (the default) runs without checkpoints
    /// (at-most-once: nothing is replayed after a failure).
    pub checkpointing: Option<CheckpointConfig>,
    /// What happens when a task fails. Default: the job fails.
    pub restart: RestartStrategy,
    /// Where keyed state's memory-mapped working files live (each attempt
    /// uses a fresh subfolder, removed when it ends). Default (`None`):
    /// [`default_state_dir`], a memory file system where there is one.
    ///
    /// The working files are scratch (checkpoints are what is durable), so
    /// on a disk their only effect is the kernel writing dirty state pages
    /// back every few seconds: workers then stall at their next write to
    /// those pages, and on a virtual machine the hypervisor's disk work
    /// steals milliseconds from the cores. Set a disk folder here for a
    /// state larger than memory (the kernel then pages cold state out);
    /// mind that a store outgrowing its file system fails the process
    /// (SIGBUS), on a disk as in memory.
    pub state_dir: Option<std::path::PathBuf>,
    /// Where [`crate::KeyedStream::process`] keeps per-key state: memory-mapped
    /// pages (default) or a hash map on the heap ([`StateBackend`]).
    pub state_backend: StateBackend,
    /// Serve the job's metrics while it runs: Prometheus text at
    /// `/metrics`, JSON with the job graph at `/api/job` and a live page at
    /// `/` (see `docs/guide/observability.md`). Default `None`: no endpoint.
    ///
    /// Use a loopback address (`127.0.0.1:9464`; port 0 picks a free port,
    /// see [`crate::JobHandle::metrics_addr`]). The endpoint has no
    /// authentication: binding another interface (`0.0.0.0:9464`) shows the
    /// job's metrics, names and checkpoint history to the network, so do it
    /// only where that network is trusted.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            workers: available_cores(),
            pin_workers: true,
            helpers: HelperPlacement::SpareCores,
            ring_capacity: 2048,
            batch_size: 1024,
            idle: IdleStrategy::default(),
            checkpointing: None,
            restart: RestartStrategy::None,
            state_dir: None,
            state_backend: StateBackend::Mapped,
            metrics_addr: None,
        }
    }
}

/// The folder for keyed state's working files when
/// [`RuntimeConfig::state_dir`] is not set: `/dev/shm` where it is a
/// writable folder (a memory file system on Linux), else the system's
/// temporary folder.
///
/// On a disk the kernel writes dirty mapped pages back every few seconds:
/// the worker then faults at its next write to each, and on a virtual
/// machine the host's disk work stalls the vCPUs too: processing latency's
/// p99.9 is several times what it is with `/dev/shm`
/// (docs/design/state.md#working-files).
pub fn default_state_dir() -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    let writable =
        shm.is_dir() && std::fs::metadata(shm).is_ok_and(|m| !m.permissions().readonly()) && tempfile_probe(shm);
    if writable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Whether a folder can be created (and removed) in `dir`.
fn tempfile_probe(dir: &std::path::Path) -> bool {
    let probe = dir.join(format!("weir-probe-{}-{}", std::process::id(), crate::clock::now_ns()));
    let ok = std::fs::create_dir(&probe).is_ok();
    let _ = std::fs::remove_dir(&probe);
    ok
}

/// Number of cores this process may run on (at least 1).
pub fn available_cores() -> usize {
    core_affinity::get_core_ids()
        .map(|ids| ids.len())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

impl RuntimeConfig {
    /// Checks every setting against its documented bounds.
    pub fn validate(&self) -> Result<()> {
        if self.workers == 0 || self.workers > MAX_WORKERS {
            return Err(Error::config(
                "workers",
                self.workers,
                "must be between 1 and 1024 (default: one per core)",
            ));
        }
        if !(MIN_RING_CAPACITY..=MAX_RING_CAPACITY).contains(&self.ring_capacity) {
            return Err(Error::config(
                "ring_capacity",
                self.ring_capacity,
                "must be between 16 and 16777216 slots",
            ));
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return Err(Error::config(
                "batch_size",
                self.batch_size,
                "must be between 1 and 65536 records",
            ));
        }
        self.idle.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        RuntimeConfig::default().validate().unwrap();
        assert!(RuntimeConfig::default().workers >= 1);
    }

    #[test]
    fn bad_values_name_the_setting() {
        let cases = [
            RuntimeConfig {
                workers: 0,
                ..Default::default()
            },
            RuntimeConfig {
                ring_capacity: 3,
                ..Default::default()
            },
            RuntimeConfig {
                batch_size: 0,
                ..Default::default()
            },
        ];
        let names = ["workers", "ring_capacity", "batch_size"];
        for (cfg, name) in cases.iter().zip(names) {
            let msg = cfg.validate().unwrap_err().to_string();
            assert!(msg.contains(name), "{msg}");
        }
    }
}
