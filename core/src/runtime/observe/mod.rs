//! The job's observability endpoint: Prometheus metrics, a JSON view of
//! the job and a live page, served while a job runs when
//! [`crate::RuntimeConfig::metrics_addr`] is set.
//!
//! Three threads of its own, none of them a worker: a sampler that reads
//! the job's counters once a second ([`SAMPLE_PERIOD`]) and keeps rates and
//! a short history ([`registry`]), and the bounded HTTP server ([`http`]).
//! Tasks pay nothing for it beyond the counters they publish anyway, once
//! per batch. Paths:
//!
//! - `/metrics`: Prometheus text exposition;
//! - `/api/job`: the same and more as JSON, with the job graph;
//! - `/`: the live page (`page.html`, no external assets).
//!
//! The endpoint lives as long as the [`crate::JobHandle`]: after the job
//! ends it still answers (with the final figures) until the handle is
//! joined or dropped.
//!
//! The sampler can be paused ([`crate::JobHandle::pause_metrics_sampler`])
//! so that `weir bench --metrics-ab` can measure what the endpoint costs by
//! turning it off and on within one run: paused, it does not wake at all
//! ([`crate::threads::periodic`]).

pub(crate) mod cpu;
pub(crate) mod http;
pub(crate) mod registry;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock;
use crate::error::{Error, Result};
use crate::runtime::metrics::JobMetrics;
use crate::threads::periodic::Periodic;
use cpu::CpuMeter;
use http::{Handler, Response, Server};
use registry::Registry;
pub(crate) use registry::{ChainInfo, GraphInfo};

/// How often the sampler reads the job's counters.
pub(crate) const SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// The live page.
const PAGE: &str = include_str!("page.html");

/// Reads the job's metrics and whether it has ended.
pub(crate) type ReadJob = Arc<dyn Fn() -> (JobMetrics, bool) + Send + Sync>;

/// What the endpoint has done so far ([`crate::JobHandle::metrics_endpoint_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// CPU time its threads (sampler, accept, handlers) spent.
    pub cpu: Duration,
    /// Samples the sampler has taken (one a second while not paused).
    pub samples: u64,
    /// Requests for a path (`/`, `/metrics`, `/api/job`, or an unknown
    /// one), counted when the request head has been read, before the
    /// answer is written.
    pub requests: u64,
}

/// A running endpoint; dropping it stops its threads.
pub(crate) struct Observer {
    server: Option<Server>,
    sampler: Option<Periodic>,
    cpu: CpuMeter,
    samples: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
}

impl Observer {
    /// Starts the sampler and the server on `addr`.
    pub(crate) fn start(addr: SocketAddr, graph: GraphInfo, read: ReadJob) -> Result<Observer> {
        let registry = Arc::new(Mutex::new(Registry::new(graph, clock::now_ns())));
        let cpu = CpuMeter::default();
        let requests = Arc::new(AtomicU64::new(0));
        let handler: Handler = {
            let registry = Arc::clone(&registry);
            let read = Arc::clone(&read);
            let cpu = cpu.clone();
            let requests = Arc::clone(&requests);
            Arc::new(move |path: &str| {
                requests.fetch_add(1, Ordering::Relaxed);
                route(path, &registry, &read, &cpu)
            })
        };
        let server = Server::start(addr, handler, cpu.clone()).map_err(|source| Error::Metrics { addr, source })?;
        let samples = Arc::new(AtomicU64::new(0));
        let (meter, count) = (cpu.clone(), Arc::clone(&samples));
        let sampler = Periodic::spawn("weir-metrics-sampler", SAMPLE_PERIOD, false, move || {
            count.fetch_add(1, Ordering::Relaxed);
            meter.track(|| {
                let (m, _) = read();
                lock(&registry).sample(&m, clock::now_ns());
            });
        })
        .map_err(|source| Error::SpawnHelper {
            what: "metrics sampler",
            source,
        })?;
        tracing::info!(addr = %server.addr(), "serving metrics");
        Ok(Observer {
            server: Some(server),
            sampler: Some(sampler),
            cpu,
            samples,
            requests,
        })
    }

    /// Pauses or resumes the sampler; returns once a sample in progress
    /// has ended.
    pub(crate) fn pause_sampler(&self, paused: bool) {
        if let Some(s) = &self.sampler {
            s.pause(paused);
        }
    }

    /// What the endpoint has done so far.
    pub(crate) fn stats(&self) -> EndpointStats {
        EndpointStats {
            cpu: self.cpu(),
            samples: self.samples.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
        }
    }

    /// CPU time the endpoint's threads (sampler, accept, handlers) spent
    /// so far.
    pub(crate) fn cpu(&self) -> Duration {
        Duration::from_nanos(self.cpu.total_ns())
    }

    /// The address the endpoint listens on.
    pub(crate) fn addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(Server::addr)
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        // The sampler first: it ends (joined) before the server goes.
        drop(self.sampler.take());
        drop(self.server.take());
    }
}

fn lock(r: &Mutex<Registry>) -> std::sync::MutexGuard<'_, Registry> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

fn route(path: &str, registry: &Mutex<Registry>, read: &ReadJob, cpu: &CpuMeter) -> Response {
    // As of the start of this request: its own cost is counted in the next.
    let endpoint_cpu = cpu.total_ns() as f64 / 1e9;
    match path {
        "/metrics" => render(
            registry,
            read,
            "text/plain; version=0.0.4; charset=utf-8",
            |r, m, ended, now| {
                let mut text = r.prometheus(m, ended, now);
                registry::endpoint_cpu(&mut text, &r.graph.job, endpoint_cpu);
                text.into_bytes()
            },
        ),
        "/api/job" => render(registry, read, "application/json", |r, m, ended, now| {
            let mut v = r.json(m, ended, now);
            v["endpoint_cpu_seconds"] = endpoint_cpu.into();
            v.to_string().into_bytes()
        }),
        "/" | "/index.html" => Response {
            status: 200,
            content_type: "text/html; charset=utf-8",
            body: PAGE.as_bytes().to_vec(),
        },
        _ => Response::text(404, "not found: the paths are /, /metrics and /api/job\n"),
    }
}

/// Reads the job's metrics afresh (a scrape at the end of a job sees its
/// final figures) and renders them with the registry's rates.
fn render(
    registry: &Mutex<Registry>,
    read: &ReadJob,
    content_type: &'static str,
    write: impl FnOnce(&Registry, &JobMetrics, bool, u64) -> Vec<u8>,
) -> Response {
    let (m, ended) = read();
    let mut r = lock(registry);
    r.absorb_checkpoints(&m.checkpoints);
    Response {
        status: 200,
        content_type,
        body: write(&r, &m, ended, clock::now_ns()),
    }
}
