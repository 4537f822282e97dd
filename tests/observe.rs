//! The metrics endpoint (`RuntimeConfig::metrics_addr`) of a running job:
//! its Prometheus text parses and matches `JobMetrics`, bad requests do not
//! disturb the job, its checkpoint figures agree with the checkpoint folder
//! and with `weir checkpoints list`, and the live page shows the job in
//! headless Chromium (Debian's `chromium`; tests/support/chromium.sh installs it
//! when missing).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use weir_core::checkpoint::storage;
use weir_core::{
    BoxError, CheckpointConfig, CheckpointMode, JobHandle, Outcome, Pipeline, RuntimeConfig, Sink, SinkContext, Source,
    SourceContext, SourcePoll,
};

/// A replayable source of `(sequence number, emission time)` pairs: at
/// most `per_ms` records per millisecond per subtask, `limit` in all
/// (`None`: until cancelled).
struct Paced {
    next: u64,
    stride: u64,
    limit: Option<u64>,
    per_ms: u64,
    last_ns: u64,
}

impl Source<(u64, u64)> for Paced {
    fn poll(
        &mut self,
        out: &mut Vec<(u64, u64)>,
        max: usize,
        ctx: &mut SourceContext<'_>,
    ) -> Result<SourcePoll, BoxError> {
        let now = ctx.now_ns();
        if now.saturating_sub(self.last_ns) < 1_000_000 {
            return Ok(SourcePoll::Ready);
        }
        self.last_ns = now;
        let n = (max as u64).min(self.per_ms);
        for _ in 0..n {
            if self.limit.is_some_and(|l| self.next >= l) {
                break;
            }
            out.push((self.next, now));
            self.next += self.stride;
        }
        Ok(if self.limit.is_some_and(|l| self.next >= l) {
            SourcePoll::Done
        } else {
            SourcePoll::Ready
        })
    }
    fn offset(&self) -> Vec<u8> {
        self.next.to_le_bytes().to_vec()
    }
    fn seek(&mut self, offset: &[u8]) -> Result<(), BoxError> {
        self.next = u64::from_le_bytes(offset.try_into()?);
        Ok(())
    }
    fn is_replayable(&self) -> bool {
        true
    }
    fn backlog(&self) -> Option<u64> {
        self.limit.map(|l| l.saturating_sub(self.next).div_ceil(self.stride))
    }
}

/// Counts what it receives and records processing latency.
struct Latency;

impl Sink<(u64, u64)> for Latency {
    fn write(&mut self, batch: &mut Vec<(u64, u64)>, ctx: &mut SinkContext<'_>) -> Result<(), BoxError> {
        for (_, emitted) in batch.drain(..) {
            ctx.record_latency(emitted);
        }
        Ok(())
    }
}

/// Source (2) -> key_by + count (2) -> sink (1): three chains, five tasks.
fn start(limit: Option<u64>, per_ms: u64, dir: &Path, interval_ms: u64) -> JobHandle {
    let p = Pipeline::new("observed");
    p.source("numbers", 2, move |i, n| Paced {
        next: i as u64,
        stride: n as u64,
        limit,
        per_ms,
        last_ns: 0,
    })
    .map(|(v, t): (u64, u64)| (v % 64, t))
    .key_by(|r: &(u64, u64)| r.0)
    .process(|_k: &u64, count: &mut u64, r: (u64, u64), out| {
        *count += 1;
        out.emit((*count, r.1));
    })
    .rebalance(1)
    .sink("latency", |_| Latency);
    let config = RuntimeConfig {
        workers: 2,
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(interval_ms),
            retained: 1000,
            ..CheckpointConfig::new(CheckpointMode::Aligned, dir)
        }),
        metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
        ..RuntimeConfig::default()
    };
    p.run(config).unwrap()
}

/// GET `path`; returns the status code and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

fn wait_finished(job: &JobHandle, within: Duration) {
    let t0 = Instant::now();
    while !job.is_finished() {
        assert!(t0.elapsed() < within, "the job did not finish within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sample<'a>(
    scrape: &'a prometheus_parse::Scrape,
    metric: &str,
    task: Option<(&str, usize)>,
) -> &'a prometheus_parse::Sample {
    scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == metric
                && task.is_none_or(|(t, i)| {
                    s.labels.get("task") == Some(t) && s.labels.get("subtask") == Some(i.to_string().as_str())
                })
        })
        .unwrap_or_else(|| panic!("no sample {metric} {task:?}"))
}

fn value(s: &prometheus_parse::Sample) -> f64 {
    match &s.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => *v,
        other => panic!("{}: not a number: {other:?}", s.metric),
    }
}

#[test]
fn metrics_parse_and_match_job_metrics_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let job = start(Some(60_000), 200, dir.path(), 20);
    let addr = job.metrics_addr().expect("metrics on");
    assert!(addr.ip().is_loopback());
    wait_finished(&job, Duration::from_secs(120));
    let (status, text) = get(addr, "/metrics");
    assert_eq!(status, 200);
    let m = job.metrics();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid exposition");
    assert_eq!(m.tasks.len(), 5);
    for t in &m.tasks {
        let key = Some((t.name.as_str(), t.subtask));
        for (metric, want) in [
            ("weir_task_records_in_total", t.records_in),
            ("weir_task_records_out_total", t.records_out),
            ("weir_task_bytes_in_total", t.bytes_in),
            ("weir_task_bytes_out_total", t.bytes_out),
        ] {
            assert_eq!(
                value(sample(&scrape, metric, key)),
                want as f64,
                "{metric} of {}",
                t.name
            );
        }
        // Every ring and the sink carry (u64, u64): 16 bytes a record.
        assert_eq!(t.bytes_in, t.records_in * 16, "{}", t.name);
        assert_eq!(t.bytes_out, t.records_out * 16, "{}", t.name);
        let busy = value(sample(&scrape, "weir_task_busy_seconds_total", key));
        let bp = value(sample(&scrape, "weir_task_backpressured_seconds_total", key));
        let idle = value(sample(&scrape, "weir_task_idle_seconds_total", key));
        assert_eq!(busy, t.busy_ns as f64 / 1e9);
        assert_eq!(bp, t.backpressured_ns as f64 / 1e9);
        assert!(busy > 0.0, "{} did work", t.name);
        assert!(
            busy + bp + idle > 0.1,
            "{}: time accounted: {}",
            t.name,
            busy + bp + idle
        );
    }
    let sources: u64 = m
        .tasks
        .iter()
        .filter(|t| t.name.starts_with("numbers"))
        .map(|t| t.records_in)
        .sum();
    assert_eq!(sources, 60_000);
    for t in m.tasks.iter().filter(|t| t.name.starts_with("numbers")) {
        assert_eq!(t.backlog, Some(0), "a finished source has nothing left");
        assert_eq!(
            value(sample(&scrape, "weir_source_backlog", Some((&t.name, t.subtask)))),
            0.0
        );
    }
    let c = &m.checkpoints;
    assert!(c.completed >= 2, "checkpoints: {}", c.completed);
    let job_value = |name: &str| value(sample(&scrape, name, None));
    assert_eq!(job_value("weir_checkpoints_completed_total"), c.completed as f64);
    assert_eq!(job_value("weir_checkpoints_failed_total"), c.failed as f64);
    assert_eq!(job_value("weir_checkpoints_in_progress"), 0.0);
    assert_eq!(
        job_value("weir_checkpoint_latest_completed_id"),
        c.latest_completed().unwrap() as f64
    );
    assert_eq!(job_value("weir_job_restarts_total"), 0.0);
    // Process-wide: at most what the process counted by now.
    assert!(job_value("weir_corruptions_detected_total") <= weir_core::corruption::detected() as f64);
    assert_eq!(job_value("weir_up"), 0.0, "the job has ended");
    let histogram_count = |name: &str| match &sample(&scrape, name, None).value {
        prometheus_parse::Value::Histogram(buckets) => buckets.last().expect("+Inf bucket").count,
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(histogram_count("weir_checkpoint_duration_seconds"), c.completed as f64);
    assert_eq!(histogram_count("weir_checkpoint_state_bytes"), c.completed as f64);
    assert_eq!(
        histogram_count("weir_processing_latency_seconds"),
        m.latency_ns.len() as f64
    );
    assert!(!m.latency_ns.is_empty());
    // The endpoint reports its own cost: at least the sampler's work of
    // the seconds the job ran, as of the start of this scrape, and the
    // join's figure counts everything up to it.
    let served_cpu = job_value("weir_metrics_endpoint_cpu_seconds_total");
    assert!(served_cpu > 0.0, "endpoint CPU {served_cpu}");
    let result = job.join().unwrap();
    assert_eq!(result.outcome, Outcome::Finished);
    let cpu = result.metrics_endpoint_cpu.expect("the endpoint was on").as_secs_f64();
    assert!(cpu >= served_cpu, "{cpu} < {served_cpu}");
    assert!(
        cpu < result.elapsed.as_secs_f64(),
        "{cpu} s of CPU in {:?}",
        result.elapsed
    );
}

#[test]
fn bad_requests_never_stall_nor_fail_the_job() {
    let dir = tempfile::tempdir().unwrap();
    // About 2 s of input at 20,000 records/s.
    let job = start(Some(40_000), 10, dir.path(), 50);
    let addr = job.metrics_addr().unwrap();
    // Slow clients: connections that send half a request head and hold it.
    let mut slow: Vec<TcpStream> = (0..6)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ").unwrap();
            s
        })
        .collect();
    assert_eq!(get(addr, "/no/such/path").0, 404);
    // An oversized header: refused (or the connection cut), never read whole.
    let mut big = TcpStream::connect(addr).unwrap();
    big.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
    head.resize(1 << 20, b'x');
    let _ = big.write_all(&head);
    let mut answer = String::new();
    let _ = big.read_to_string(&mut answer);
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431 "), "{answer}");
    // Garbage and a wrong method.
    let mut g = TcpStream::connect(addr).unwrap();
    g.write_all(b"\x00\x01\x02\r\n\r\n").unwrap();
    // While the slow ones still hold their connections, scrapes go on.
    for s in &mut slow {
        let _ = s.write_all(b"a");
    }
    assert_eq!(get(addr, "/metrics").0, 200);
    let before = Instant::now();
    wait_finished(&job, Duration::from_secs(120));
    let result = job.join().unwrap();
    assert_eq!(result.outcome, Outcome::Finished);
    let emitted: u64 = result
        .metrics
        .tasks
        .iter()
        .filter(|t| t.name.starts_with("numbers"))
        .map(|t| t.records_in)
        .sum();
    let sunk: u64 = result
        .metrics
        .tasks
        .iter()
        .filter(|t| t.name.contains("latency"))
        .map(|t| t.records_out)
        .sum();
    assert_eq!((emitted, sunk), (40_000, 40_000));
    assert!(
        result.metrics.checkpoints.failed == 0,
        "{:?}",
        result.metrics.checkpoints.failures
    );
    drop(slow);
    eprintln!("finished {:?} after the bad requests", before.elapsed());
}

/// Parses `weir checkpoints list` lines of complete checkpoints: id ->
/// (duration text, state bytes, channel bytes).
fn cli_list(dir: &Path) -> std::collections::HashMap<u64, (String, u64, u64)> {
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["checkpoints", "list"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .filter(|l| l.contains(" complete "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // id status final mode date time duration "ms" tasks state channel
            let n = f.len();
            (
                f[0].parse().unwrap(),
                (
                    f[n - 5].to_string(),
                    f[n - 2].parse().unwrap(),
                    f[n - 1].parse().unwrap(),
                ),
            )
        })
        .collect()
}

#[test]
fn checkpoint_figures_agree_with_the_folder_and_weir_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let job = start(Some(30_000), 100, dir.path(), 30);
    let addr = job.metrics_addr().unwrap();
    wait_finished(&job, Duration::from_secs(120));
    let (status, body) = get(addr, "/api/job");
    assert_eq!(status, 200);
    let api: serde_json::Value = serde_json::from_str(&body).unwrap();
    job.join().unwrap();
    let history = api["checkpoints"]["history"].as_array().unwrap();
    assert!(history.len() >= 2, "{history:?}");
    let listed = cli_list(dir.path());
    for h in history {
        let id = h["id"].as_u64().unwrap();
        let m = storage::read_manifest(dir.path(), id)
            .unwrap()
            .expect("a manifest per completed checkpoint");
        let u = |k: &str| h[k].as_u64().unwrap();
        assert_eq!(u("trigger_unix_ms"), m.trigger_unix_ms, "checkpoint {id}");
        assert_eq!(u("acked_us"), m.duration_us, "checkpoint {id}");
        assert!(u("duration_us") >= m.duration_us, "durable after the last ack");
        assert_eq!(u("state_bytes"), m.tasks.iter().map(|t| t.state_bytes).sum::<u64>());
        assert_eq!(
            u("channel_state_bytes"),
            m.tasks.iter().map(|t| t.channel_state_bytes).sum::<u64>()
        );
        assert_eq!(h["is_final"].as_bool().unwrap(), m.is_final);
        assert_eq!(u("alignment_us"), m.tasks.iter().map(|t| t.alignment_us).max().unwrap());
        let (duration, state, channel) = listed.get(&id).unwrap_or_else(|| panic!("weir checkpoints lists {id}"));
        let us = u("acked_us");
        assert_eq!(duration, &format!("{}.{:03}", us / 1000, us % 1000), "checkpoint {id}");
        assert_eq!(
            (*state, *channel),
            (u("state_bytes"), u("channel_state_bytes")),
            "checkpoint {id}"
        );
    }
    let ids: Vec<u64> = history.iter().map(|h| h["id"].as_u64().unwrap()).collect();
    let on_disk = storage::list_ids(dir.path()).unwrap();
    assert_eq!(
        ids, on_disk,
        "every completed checkpoint, and only those, on both sides"
    );
    assert_eq!(api["checkpoints"]["completed"].as_u64().unwrap(), ids.len() as u64);
}

/// The path of a Chromium: tests/support/chromium.sh finds one on the PATH
/// or installs Debian's package (once per test binary).
fn chromium_path() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/support/chromium.sh");
        let out = Command::new("bash")
            .arg(script)
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run tests/support/chromium.sh");
        assert!(
            out.status.success(),
            "tests/support/chromium.sh found no Chromium and could not install one ({}); \
             install Debian's chromium package by hand",
            out.status
        );
        String::from_utf8(out.stdout).expect("a UTF-8 path").trim().to_owned()
    })
}

/// Runs headless Chromium on `url` with `args`; returns its stdout.
fn chromium(args: &[&str], url: &str) -> String {
    let out = Command::new(chromium_path())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .args(args)
        .arg(url)
        .output()
        .expect("run the Chromium that tests/support/chromium.sh found");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn live_page_shows_checkpoints_and_every_task_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("observe");
    std::fs::create_dir_all(&out_dir).unwrap();
    let job = start(None, 20, dir.path(), 200);
    let addr = job.metrics_addr().unwrap();
    let url = format!("http://{addr}/");
    let t0 = Instant::now();
    let mut dom = String::new();
    let mut ready = false;
    while t0.elapsed() < Duration::from_secs(180) {
        dom = chromium(&["--dump-dom", "--virtual-time-budget=3000"], &url);
        let completed = dom.matches("data-status=\"completed\"").count();
        let tasks = dom.matches("class=\"task\"").count();
        if completed >= 2 && tasks == 5 && dom.contains("running") {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        ready,
        "the page never showed 2 completed checkpoints and 5 tasks; last DOM:\n{dom}"
    );
    for t in job.metrics().tasks {
        let attrs = format!(
            "data-task=\"{}\" data-subtask=\"{}\"",
            t.name.replace('>', "&gt;"),
            t.subtask
        );
        assert!(dom.contains(&attrs), "the graph shows task {} #{}", t.name, t.subtask);
    }
    // The task table shows bytes in and out (the sources' are above 1 KiB
    // by the time two checkpoints have completed).
    assert!(dom.contains("<th>bytes in</th>"), "a bytes column");
    assert!(dom.contains("iB</td>"), "bytes in KiB or more; last DOM:\n{dom}");
    let shot = out_dir.join("live-page.png");
    let _ = std::fs::remove_file(&shot);
    chromium(
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1000,1000",
            "--virtual-time-budget=3000",
        ],
        &url,
    );
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    eprintln!("screenshot: {}", shot.display());
    job.cancel();
    assert_eq!(job.join().unwrap().outcome, Outcome::Cancelled);
}
