//! `weir compare` with tiny event counts: the tables hold every row (each
//! exactly-once row once per interval) and the platform row, the sentences
//! are printed, the JSON lines parse with the documented fields, and the
//! SVG figure is written with its three panels. Structure only: the speeds
//! of a tiny run on a shared machine mean nothing.

use std::process::Command;

const ROWS: [&str; 8] = [
    "none·direct",
    "at-least-once·direct",
    "aligned·wal",
    "aligned·2pc-file",
    "unaligned·wal",
    "unaligned·2pc-file",
    "dedup·wal",
    "dedup·2pc-file",
];

fn exactly_once(row: &str) -> bool {
    row.starts_with("aligned") || row.starts_with("unaligned") || row.starts_with("dedup")
}

fn weir(args: &[&str], results: &std::path::Path) -> std::process::Output {
    weir_in(args, results, &std::env::temp_dir())
}

/// `weir` with its temporary folders (checkpoints, sink output) in `tmp`.
fn weir_in(args: &[&str], results: &std::path::Path, tmp: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .arg("--results")
        .arg(results)
        .env("WEIR_LOG", "warn")
        .env("TMPDIR", tmp)
        .output()
        .unwrap()
}

fn percentiles(v: &serde_json::Value, field: &str, qs: &[&str]) {
    for q in qs {
        assert!(v[field][q].is_number(), "{field}.{q} missing in {v}");
    }
}

#[test]
fn compare_writes_tables_json_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = weir_in(
        &[
            "compare",
            "--events",
            "200000",
            "--open-seconds",
            "0.3",
            "--intervals",
            "10,100",
            "--rounds",
            "2",
        ],
        &results,
        &tmp,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "weir compare failed: {stderr}\n{stdout}");

    // Every latency (open-loop) run comes before every closed-loop run, so
    // none follows a closed-loop run's large delete; their output is
    // removed between the two, and nothing is left behind.
    let progress: Vec<&str> = stderr.lines().filter(|l| l.contains(" loop")).collect();
    let last_open = progress.iter().rposition(|l| l.contains("open loop"));
    let first_closed = progress.iter().position(|l| l.contains("closed loop"));
    assert!(
        matches!((last_open, first_closed), (Some(o), Some(c)) if o < c),
        "open-loop runs must all come first:\n{stderr}"
    );
    // Open loop: 8 rows at the base interval, 6 at the second; one failure
    // per mode at one keyed stage (5) and at three (5); closed loop: 13
    // runs in each of 2 rounds, round 1 of every run first.
    assert_eq!(
        progress.len(),
        8 + 6 + 10 + 2 * 13,
        "one progress line per run:\n{stderr}"
    );
    // The counter counts to the number of runs announced, and no further.
    for (n, line) in progress.iter().enumerate() {
        let want = format!("[{:>2}/{}]", n + 1, progress.len());
        assert!(
            line.contains(&want),
            "progress line {} should read {want}: {line}",
            n + 1
        );
    }
    let rounds: Vec<&str> = progress
        .iter()
        .filter(|l| l.contains("closed loop"))
        .map(|l| if l.contains("round 1 of 2") { "1" } else { "2" })
        .collect();
    assert_eq!(rounds, [["1"; 13], ["2"; 13]].concat(), "interleaved rounds:\n{stderr}");
    let removed = stderr.find("removing the open-loop runs' output").expect(&stderr);
    assert!(
        stderr[..removed].contains("open loop") && !stderr[..removed].contains("closed loop"),
        "{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left behind in the temporary folder: {left:?}");

    // The tables: every row, each exactly-once row at both intervals, the platform row.
    assert!(stdout.contains("measured now on this machine"), "{stdout}");
    for title in ["latency, open loop", "throughput (closed loop"] {
        assert!(stdout.contains(title), "table {title} missing:\n{stdout}");
    }
    for col in [
        "proc p99.9",
        "vis p99.9",
        "plat p99",
        "excess p99.9",
        "ev/s sink",
        "ev/s count",
        "ckpt/s",
        "dur p50",
        "align p99",
        "channel B",
    ] {
        assert!(stdout.contains(col), "column {col} missing:\n{stdout}");
    }
    for row in ROWS {
        let lines: Vec<&str> = stdout
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(row))
            .collect();
        // One line in each table per interval the row ran at, and in the
        // failure table, for each mode's natural sink (the WAL sink for
        // exactly-once, the direct sink otherwise), one per keyed stage
        // count (1 and 3).
        let failure = match row {
            _ if row.ends_with("2pc-file") => 0,
            _ => 2,
        };
        let expected = if exactly_once(row) { 4 } else { 2 } + failure;
        assert_eq!(lines.len(), expected, "rows for {row}:\n{stdout}");
        if exactly_once(row) {
            assert!(lines.iter().any(|l| l.contains("100 ms")), "{row} at 100 ms:\n{stdout}");
        }
    }
    assert!(
        stdout.lines().any(|l| l.starts_with("platform ")),
        "no platform row:\n{stdout}"
    );
    // The sentences, computed from the figures.
    for s in [
        "exactly-once made output visible after",
        // "cost N% of throughput against none ..." or, when the machine's
        // speed drifts during the short runs, "ran N% faster against none ...".
        "against none with the counting sink",
        // Each cost is the median of the rounds' own, with their range.
        "(2 rounds: ",
        "fsyncs per checkpoint",
        "append + fdatasync",
        // The platform, measured apart from the runs (a thread spinning
        // alone on the workers' cores before each), and what each mode
        // costs in processing latency against none and at-least-once.
        "waited for a thread spinning alone on a worker core",
        "processing latency at 10 ms, p99 / p99.9: none",
        "against none, ",
        "against at-least-once)",
        "idle turns of 1 µs or more took",
        "weir compare ran in",
    ] {
        assert!(stdout.contains(s), "sentence {s:?} missing:\n{stdout}");
    }

    // What each row wrote per record, and the dedup state's size.
    assert!(
        stdout.contains("- bytes written per record, closed loop") && stdout.contains("dedup state per keyed task"),
        "{stdout}"
    );
    // What one failure costs, per mode, and its plot.
    for s in [
        "what one failure costs",
        "dedup's failed subtask processed again after",
        "the two ways to exactly-once with the wal sink",
        "- as the topology grows, keyed stages one after another, the failure in the first",
        "dedup's, of the failed subtask alone,",
    ] {
        assert!(stdout.contains(s), "{s:?} missing:\n{stdout}");
    }
    let failure_svg = std::fs::read_to_string(results.join("failure.svg")).unwrap();
    assert!(failure_svg.contains("recovers alone"), "failure.svg: the dedup panel");

    // JSON: 5 closed-loop-count, 8 closed-loop, 2 + 6 x 2 open-loop, 10
    // failure, 1 disk-probe.
    let json = std::fs::read_to_string(results.join("compare.json")).unwrap();
    let lines: Vec<serde_json::Value> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let of = |run: &str| lines.iter().filter(|r| r["run"] == run).count();
    assert_eq!(
        (
            of("closed-loop-count"),
            of("closed-loop"),
            of("open-loop"),
            of("failure"),
            of("disk-probe")
        ),
        (5, 8, 14, 10, 1),
        "{json}"
    );
    assert_eq!(lines.last().unwrap()["run"], "disk-probe", "the disk probe comes last");
    for r in lines.iter().filter(|r| r["run"] == "closed-loop") {
        let w = &r["disk_writes"];
        assert!(
            w["written_per_record"].is_number() && w["to_storage_per_record"].is_number(),
            "{r}"
        );
        if r["sink"] == "wal" {
            // At least the log's frame and the output line of each record.
            assert!(w["written_per_record"].as_f64().unwrap() >= 20.0, "{r}");
        }
    }
    for r in lines.iter().filter(|r| r["run"] == "failure") {
        let f = &r["failure"];
        assert!(
            f["processing_again_ms"].is_number(),
            "the failure happened and was recovered: {r}"
        );
        assert_eq!(f["reprocessed"].as_array().map(Vec::len), Some(2), "{r}");
        // Through each mode's natural sink, read back after the run.
        assert_eq!(f["output"]["missing"], 0, "{r}");
        if ["aligned", "unaligned", "dedup"].contains(&r["mode"].as_str().unwrap()) {
            assert_eq!(f["output"]["duplicated"], 0, "{r}");
        }
        assert_eq!(f["visible"]["gap_ms"].as_array().map(Vec::len), Some(2), "{r}");
        let stages = r["stages"].as_u64().unwrap();
        assert_eq!(r["row"].as_str().unwrap().ends_with(" ×3"), stages == 3, "{r}");
        if r["mode"] == "dedup" {
            let untouched = f["reprocessed"].as_array().unwrap().iter().filter(|v| *v == 0).count();
            assert!(untouched >= 1, "dedup: the other subtask reprocessed nothing: {r}");
        }
    }
    for r in lines
        .iter()
        .filter(|r| r["run"] != "disk-probe" && r["run"] != "failure")
    {
        for field in [
            "run",
            "scenario",
            "row",
            "interval_ms",
            "sink",
            "pipeline",
            "mode",
            "events",
            "seconds",
            "events_per_sec",
            "machine",
        ] {
            assert!(r.get(field).is_some(), "field {field} missing in {r}");
        }
        percentiles(r, "latency_us", &["p50", "p99", "p999", "max"]);
        // The platform is measured for the open-loop (latency) runs only.
        if r["run"] == "open-loop" {
            percentiles(r, "platform_us", &["p50", "p99", "p999", "max"]);
            percentiles(r, "excess_us", &["p99", "p999"]);
            for f in ["policy", "tick_us", "samples", "cores"] {
                assert!(r["platform_probe"].get(f).is_some(), "platform_probe.{f} in {r}");
            }
            // By default nothing preempts the workers: the platform is a
            // spin run of its own, and the workers' idle turns are beside it.
            assert_eq!(r["platform_probe"]["policy"], "spin", "{r}");
            for f in ["gaps", "lost_ms", "observed_s", "longest_us"] {
                assert!(r["worker_gaps"][f].as_f64().is_some(), "worker_gaps.{f} in {r}");
            }
            // Where the probed cores' time went (Linux: from /proc/stat).
            if cfg!(target_os = "linux") {
                for f in ["steal_pct", "irq_pct"] {
                    let pct = r["platform_probe"][f].as_f64();
                    assert!(
                        pct.is_some_and(|p| (0.0..=100.0).contains(&p)),
                        "platform_probe.{f} in {r}"
                    );
                }
            }
        } else {
            assert!(r.get("platform_us").is_none(), "no probe in closed loop: {r}");
        }
        let row = r["row"].as_str().unwrap();
        let mode = r["mode"].as_str().unwrap();
        assert!(row.starts_with(mode), "{r}");
        // A closed-loop line is its median round's run (the lower middle
        // of two), with every round's figure.
        if r["run"] != "open-loop" {
            let rounds: Vec<f64> = r["rounds_events_per_sec"]
                .as_array()
                .unwrap_or_else(|| panic!("rounds_events_per_sec in {r}"))
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            assert_eq!(rounds.len(), 2, "{r}");
            assert_eq!(r["events_per_sec"].as_f64().unwrap(), rounds[0].min(rounds[1]), "{r}");
            // The counting sink's runs take 5 times the events.
            let events = if r["run"] == "closed-loop-count" {
                1_000_000
            } else {
                200_000
            };
            assert_eq!(r["events"], events, "{r}");
        } else {
            assert!(r.get("rounds_events_per_sec").is_none(), "{r}");
        }
        if r["run"] == "closed-loop-count" {
            assert_eq!(r["sink"], "count", "{r}");
        } else {
            assert!(ROWS.contains(&row), "{r}");
            assert!(row.ends_with(r["sink"].as_str().unwrap()), "{r}");
            percentiles(r, "visible_latency_us", &["p50", "p99", "p999", "max"]);
        }
        let completed = r.get("checkpoints").map(|c| c["completed"].as_u64().unwrap());
        if mode == "none" {
            assert!(completed.is_none(), "no checkpoints without checkpointing: {r}");
            assert!(r["interval_ms"].is_null(), "{r}");
        } else {
            // At least the final checkpoint of the bounded job.
            assert!(completed.unwrap() >= 1, "{mode}: {r}");
            assert!(r["checkpoints"]["duration_ms"]["p50"].is_number());
            assert!(r["interval_ms"].is_u64(), "{r}");
        }
        if mode != "unaligned" && mode != "none" {
            assert_eq!(r["checkpoints"]["channel_state_bytes"], 0, "{r}");
        }
        let syncs = r.get("syncs");
        if r["run"] == "open-loop" && exactly_once(row) {
            let s = syncs.unwrap_or_else(|| panic!("syncs missing in {r}"));
            for f in ["count", "per_checkpoint", "p50_us", "p99_us"] {
                assert!(s[f].is_number(), "syncs.{f} in {r}");
            }
            assert!(s["count"].as_u64().unwrap() >= 1, "an exactly-once run syncs: {r}");
        } else {
            assert!(syncs.is_none(), "{r}");
        }
    }
    let intervals: Vec<u64> = lines
        .iter()
        .filter(|r| r["run"] == "open-loop" && r["row"] == "aligned·wal")
        .map(|r| r["interval_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(intervals, [10, 100]);
    let disk = lines.last().unwrap();
    assert_eq!(disk["writes"], 200, "{disk}");
    assert_eq!(disk["bytes"], 4096, "{disk}");
    let (p50, p99, max) = (
        disk["p50_us"].as_f64().unwrap(),
        disk["p99_us"].as_f64().unwrap(),
        disk["max_us"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{disk}");

    // The figure: three panels, a curve per row and the platform's.
    let svg = std::fs::read_to_string(results.join("compare.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{}",
        &svg[..svg.len().min(100)]
    );
    let texts: Vec<&str> = svg
        .split("</text>")
        .filter_map(|chunk| chunk.rsplit_once('>').map(|(_, t)| t.trim()))
        .collect();
    for row in ROWS {
        assert!(texts.contains(&row), "legend entry {row} missing in {texts:?}");
    }
    for entry in [
        "platform (all open-loop runs)",
        "aligned·wal p50",
        "unaligned·2pc-file p99",
    ] {
        assert!(texts.contains(&entry), "legend entry {entry} missing in {texts:?}");
    }
    for caption in [
        "visibility by percentile",
        "processing latency by percentile",
        "against the checkpoint interval",
    ] {
        assert!(texts.iter().any(|t| t.contains(caption)), "panel {caption} missing");
    }
    assert!(svg.contains("<polyline") || svg.contains("<path"), "no curve drawn");
}

#[test]
fn bad_intervals_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    for (intervals, says) in [("0", "at least 1 ms"), ("10,10", "twice")] {
        let out = weir(&["compare", "--intervals", intervals], dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--intervals {intervals}: {stderr}");
        assert!(stderr.contains(says), "--intervals {intervals}: {stderr}");
    }
    // The old flag still names one interval; with backpressure, a sweep is refused.
    let out = weir(
        &[
            "compare",
            "--scenario",
            "backpressure",
            "--checkpoint-interval-ms",
            "10,100",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    // The Kafka rows: with the normal scenario only, enough records for
    // the warm-up and 2 s measured, and `--brokers` only with `--kafka`.
    for (args, says) in [
        (&["--kafka", "--scenario", "backpressure"][..], "--scenario normal only"),
        (&["--kafka", "--kafka-events", "1000"][..], "at least 60000"),
        (&["--kafka", "--kafka-rate", "0"][..], "positive number"),
        (&["--brokers", "127.0.0.1:1"][..], "--kafka"),
    ] {
        let out = weir(&[&["compare"][..], args].concat(), dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    // The failure runs' stages: 1 to 8.
    for stages in ["0", "1,9"] {
        let out = weir(&["compare", "--failure-stages", stages], dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--failure-stages {stages}: {stderr}");
        assert!(stderr.contains("each must be between 1 and 8"), "{stderr}");
    }
}

/// `weir bench --fail-at-record 120000` on the keyed job (2 subtasks,
/// 100,000 records/s, 200,000 records, 10 ms) in `mode`, with `extra`
/// arguments; returns the run and its JSON object.
fn fail_run(dir: &std::path::Path, mode: &str, extra: &[&str]) -> (std::process::Output, Option<serde_json::Value>) {
    let json = dir.join(format!("{mode}{}.json", extra.join("-")));
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "--pipeline", "keyed", "--parallelism", "2", "--rate", "100000"])
        .args(["--events", "200000", "--checkpoint-interval-ms", "10", "--mode", mode])
        .args(["--fail-at-record", "120000", "--platform-probe", "off", "--json"])
        .arg(&json)
        .args(extra)
        .env("WEIR_LOG", "error")
        .env("RUST_BACKTRACE", "0")
        .env("TMPDIR", dir)
        .output()
        .unwrap();
    let v = std::fs::read_to_string(&json).ok().and_then(|t| {
        t.lines()
            .next()
            .map(|l| serde_json::from_str(l).expect("one JSON object per run"))
    });
    (out, v)
}

/// `weir bench --stages N`: keyed operators one after another, each behind
/// its own exchange; the output stays exact through a failure in the first
/// stage, in a snapshot mode and in dedup (which aligns behind the second
/// exchange and recovers the failed subtask alone, its exchange dropping
/// what its predecessor had sent, so no sink subtask receives a record
/// twice), and in dedup's last stage (`--fail-stage`); a count out of
/// range is a usage error.
#[test]
fn bench_stages_chain_keyed_operators() {
    let dir = tempfile::tempdir().unwrap();
    let (out, v) = fail_run(dir.path(), "aligned", &["--stages", "3", "--sink", "wal"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = v.expect("a JSON object");
    assert_eq!(v["stages"], 3, "{v}");
    assert_eq!(v["sink_records"], 200_000, "{v}");
    assert_eq!(v["failure"]["output"]["missing"], 0, "{v}");
    assert_eq!(v["failure"]["output"]["duplicated"], 0, "{v}");
    // Dedup behind a second exchange: the failed subtask of the first
    // stage recovers alone, and no sink subtask receives a record twice.
    let (out, v) = fail_run(dir.path(), "dedup", &["--stages", "2", "--sink", "wal"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let v = v.expect("a JSON object");
    assert_eq!(v["stages"], 2, "{v}");
    assert!(
        v["failure"]["reprocessed"].as_array().unwrap().iter().all(|r| r == 0),
        "a first-stage failure under dedup redoes nothing at the sinks: {v}"
    );
    assert!(
        v["failure"]["processing_again_ms"].is_number(),
        "the replacement's first record: {v}"
    );
    assert_eq!(v["failure"]["output"]["missing"], 0, "{v}");
    assert_eq!(v["failure"]["output"]["duplicated"], 0, "{v}");
    // The last stage, chained with the sink: the failed sink subtask alone
    // receives again what it took since the checkpoint.
    let (out, v) = fail_run(
        dir.path(),
        "dedup",
        &["--stages", "2", "--fail-stage", "2", "--sink", "wal"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = v.expect("a JSON object");
    assert!(
        v["failure"]["reprocessed"].as_array().unwrap().iter().any(|r| r == 0),
        "the healthy sink subtask never restarted: {v}"
    );
    assert_eq!(v["failure"]["output"]["missing"], 0, "{v}");
    assert_eq!(v["failure"]["output"]["duplicated"], 0, "{v}");
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "--pipeline", "keyed", "--stages", "2", "--fail-stage", "3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--fail-stage 3: the job has keyed stages 1 to 2"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for bad in ["0", "9"] {
        let out = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["bench", "--pipeline", "keyed", "--events", "1000", "--stages", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--stages {bad}: a usage error");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--stages must be between 1 and 8"));
    }
}

/// `weir bench --fail-at-record`: the keyed function panics once, the job
/// restarts from its latest checkpoint, the output stays exact (exactly-once
/// modes) or gains only duplicates (at-least-once), and the run reports
/// what the failure cost for every sink subtask.
#[test]
fn bench_fail_at_record_reports_what_the_failure_cost() {
    let dir = tempfile::tempdir().unwrap();
    for mode in ["aligned", "unaligned", "at-least-once", "none"] {
        let (out, v) = fail_run(dir.path(), mode, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("failure at record 120000: restarted after"),
            "{mode}: {stdout}"
        );
        let v = v.expect("a JSON object");
        let f = &v["failure"];
        assert_eq!(f["at_record"], 120000, "{mode}: {v}");
        for field in ["restarted_ms", "processing_again_ms"] {
            assert!(f[field].as_f64().is_some_and(|ms| ms > 0.0), "{mode}: {field} in {f}");
        }
        assert!(
            f["restarted_ms"].as_f64() <= f["processing_again_ms"].as_f64(),
            "{mode}: restarted before processing again: {f}"
        );
        let gaps = f["longest_gap_ms"].as_array().unwrap();
        let redone = f["reprocessed"].as_array().unwrap();
        assert_eq!((gaps.len(), redone.len()), (2, 2), "{mode}: one per sink subtask: {f}");
        let redone: u64 = redone.iter().map(|r| r.as_u64().unwrap()).sum();
        let delivered = v["sink_records"].as_u64().unwrap();
        match mode {
            // Restarted from scratch: everything before the failure again.
            "none" => assert!(redone >= 100_000, "{mode}: {f}"),
            // From a checkpoint at most a few intervals old, not from scratch.
            _ => assert!(redone < 100_000, "{mode}: {f}"),
        }
        match mode {
            "at-least-once" => assert!(delivered >= 200_000, "{mode}: {delivered}"),
            _ => assert_eq!(delivered, 200_000, "{mode}: exactly the events"),
        }
    }
    // With a sink that writes files, visible output through the failure,
    // and the files read back: every record, once in the exactly-once modes.
    for (mode, sink) in [("aligned", "wal"), ("aligned", "2pc-file"), ("at-least-once", "direct")] {
        let (out, v) = fail_run(dir.path(), mode, &["--sink", sink]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{mode} {sink}: {}\n{stdout}", out.status);
        assert!(
            stdout.contains("no newly visible output per sink subtask for"),
            "{stdout}"
        );
        let v = v.expect("a JSON object");
        let f = &v["failure"];
        assert_eq!(f["output"]["missing"], 0, "{mode} {sink}: {f}");
        if mode == "aligned" {
            assert_eq!(f["output"]["duplicated"], 0, "{mode} {sink}: {f}");
            assert_eq!(f["output"]["lines"], 200_000, "{mode} {sink}: {f}");
            assert!(
                stdout.contains("the sink's files hold 200000 lines: 0 records missing, 0 written twice"),
                "{stdout}"
            );
        }
        let gaps = f["visible"]["gap_ms"].as_array().unwrap();
        assert_eq!(gaps.len(), 2, "{mode} {sink}: a visible gap per sink subtask: {f}");
        assert!(gaps.iter().all(|g| g.as_f64().is_some_and(|g| g > 0.0)), "{f}");
        assert!(!f["visible"]["timeline"].as_array().unwrap().is_empty(), "{f}");
    }
    // The failure runs are the keyed job's.
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["bench", "--pipeline", "stateless", "--events", "1000"])
        .args(["--fail-at-record", "10"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--fail-at-record needs --pipeline keyed"));
    // Not through Kafka (its own benchmark, which would ignore it).
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "bench",
            "--pipeline",
            "keyed",
            "--events",
            "1000",
            "--source",
            "kafka",
            "--sink",
            "kafka",
        ])
        .args(["--fail-at-record", "10"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("with any sink but Kafka's"));
}

/// `weir bench --platform-probe`: by default the platform is a spin run of
/// its own before the job (nothing preempts the workers), with the
/// workers' idle turns beside it; `fifo` keeps the old probe during the
/// run and says that it preempts the workers; `off` measures nothing.
#[test]
fn bench_measures_the_platform_apart_from_the_workers_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let run = |method: Option<&str>| {
        let json = dir.path().join(format!("{}.json", method.unwrap_or("default")));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_weir"));
        cmd.args(["bench", "--pipeline", "keyed", "--parallelism", "1", "--workers", "1"])
            .args(["--rate", "50000", "--events", "50000", "--json"])
            .arg(&json)
            .env("TMPDIR", dir.path());
        if let Some(m) = method {
            cmd.args(["--platform-probe", m]);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{method:?}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(&json).unwrap().lines().next().unwrap()).unwrap();
        (stdout, v)
    };
    let (text, v) = run(None);
    assert!(text.lines().any(|l| l.starts_with("platform   spin")), "{text}");
    assert!(
        text.contains("a thread spinning alone on 1 worker core right before the run"),
        "{text}"
    );
    assert!(text.contains("workers' idle turns of 1 µs or more:"), "{text}");
    assert_eq!(v["platform_probe"]["policy"], "spin", "{v}");
    assert!(v["platform_us"]["p99"].as_f64().is_some(), "{v}");
    assert!(v["excess_us"]["p99"].as_f64().is_some(), "{v}");
    // About a second of one core observed, the workers' about the run.
    assert!(v["worker_gaps"]["observed_s"].as_f64().unwrap() > 0.5, "{v}");

    let (text, v) = run(Some("fifo"));
    assert!(
        text.lines()
            .any(|l| l.starts_with("platform   fifo") || l.starts_with("platform   other")),
        "{text}"
    );
    assert!(text.contains("during the run"), "{text}");
    assert_ne!(v["platform_probe"]["policy"], "spin", "{v}");

    let (text, v) = run(Some("off"));
    assert!(!text.lines().any(|l| l.starts_with("platform ")), "{text}");
    assert!(v.get("platform_us").is_none(), "{v}");
    // The workers' own idle turns cost nothing to measure: always there.
    assert!(v["worker_gaps"]["gaps"].as_u64().is_some(), "{v}");
}

/// `weir compare --scenario disk-busy`: a co-runner writes and syncs into
/// the temporary folder beside every open-loop run, and the run says what
/// it achieved; its file is gone afterwards. A rate that is not a positive
/// number is a usage error.
#[test]
fn compare_disk_busy_runs_a_co_runner_beside_the_open_loop_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (results, tmp) = (dir.path().join("results"), dir.path().join("tmp"));
    std::fs::create_dir_all(&tmp).unwrap();
    let out = weir_in(
        &[
            "compare",
            "--scenario",
            "disk-busy",
            "--disk-busy-mb-s",
            "20",
            "--events",
            "100000",
            "--open-seconds",
            "0.2",
            "--intervals",
            "10",
            "--rounds",
            "1",
        ],
        &results,
        &tmp,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("disk-busy scenario"), "{stdout}");
    assert!(stdout.contains("the disk-busy co-runner wrote"), "{stdout}");
    assert!(stdout.contains("(asked 20)"), "{stdout}");
    let json = std::fs::read_to_string(results.join("compare.json")).unwrap();
    let open: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["run"] == "open-loop")
        .collect();
    assert!(!open.is_empty());
    for v in &open {
        assert_eq!(v["scenario"], "disk-busy", "{v}");
        assert_eq!(v["disk_load"]["target_mb_s"], 20.0, "{v}");
        assert!(v["disk_load"]["achieved_mb_s"].as_f64().unwrap() > 0.0, "{v}");
    }
    // No co-runner file left behind.
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("weir-disk-load"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    let out = weir(
        &["compare", "--scenario", "disk-busy", "--disk-busy-mb-s", "0"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--disk-busy-mb-s must be a positive number"));
}
