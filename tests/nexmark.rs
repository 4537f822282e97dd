//! Nexmark tests: the reference implementation's own checks, and the
//! reference on generated events.

mod nexmark_reference;

use weir_io::nexmark::{Event, NexmarkConfig, NexmarkGenerator};

#[test]
fn reference_self_check() {
    nexmark_reference::self_check();
}

/// Every query finds results in a modest generated stream, with the row
/// counts the model implies: otherwise a query comparison on generated data
/// would compare empty files.
#[test]
fn reference_finds_results_in_generated_events() {
    let g = NexmarkGenerator::new(NexmarkConfig {
        seed: 3,
        ..Default::default()
    })
    .unwrap();
    let mut events = Vec::new();
    g.events_into(0, 1, 100_000, &mut events);
    let bids = events.iter().filter(|e| matches!(e, Event::Bid(_))).count();
    for q in nexmark_reference::QUERIES {
        let out = nexmark_reference::reference(q, &events);
        assert!(out.ends_with('\n'), "{q}");
        let rows: Vec<&str> = out.lines().skip(1).collect();
        assert!(!rows.is_empty(), "{q} finds nothing in 100000 generated events");
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        assert_eq!(rows, sorted, "{q} rows are sorted");
        match q {
            "q0" | "q1" => assert_eq!(rows.len(), bids, "{q}"),
            // One row per category 10..=14.
            "q4" => assert_eq!(
                rows.iter().map(|r| &r[..3]).collect::<Vec<_>>(),
                ["10,", "11,", "12,", "13,", "14,"]
            ),
            _ => {}
        }
    }
    assert_eq!(
        nexmark_reference::fmt_cents_half_up(1, 200),
        "0.01",
        "0.005 cents rounds half up"
    );
}

// ---------------------------------------------------------------------------
// weir's queries (`weir nexmark`) against the reference
// ---------------------------------------------------------------------------

use std::path::Path;
use std::process::Command;

const QUERIES: [&str; 9] = ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8"];

fn weir(args: &[&str], faults: Option<&str>) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weir"));
    c.args(args).env("WEIR_LOG", "warn");
    if let Some(f) = faults {
        c.env("WEIR_FAULTS", f);
    }
    c.output().expect("the weir binary runs")
}

/// Writes an event file with `weir nexmark --generate`; returns its events.
fn generate(dir: &Path, n: u64, rate: u64, seed: u64) -> (String, Vec<Event>) {
    let file = dir.join(format!("events-{seed}-{rate}.jsonl"));
    let f = file.to_str().unwrap().to_string();
    let out = weir(
        &[
            "nexmark",
            "--generate",
            &n.to_string(),
            "--rate",
            &rate.to_string(),
            "--seed",
            &seed.to_string(),
            "--output",
            &f,
        ],
        None,
    );
    assert!(
        out.status.success(),
        "generate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = weir_io::nexmark::read_events_file(&file).unwrap();
    assert_eq!(events.len() as u64, n);
    (f, events)
}

/// Runs `query` over `input` into `out_dir` and returns `qN.csv`.
fn run_query(query: &str, input: &str, out_dir: &Path, extra: &[&str], faults: Option<&str>) -> (bool, String) {
    let (ok, csv, _) = run_query_summary(query, input, out_dir, extra, faults);
    (ok, csv)
}

/// [`run_query`], also returning the summary line `weir` printed.
fn run_query_summary(
    query: &str,
    input: &str,
    out_dir: &Path,
    extra: &[&str],
    faults: Option<&str>,
) -> (bool, String, String) {
    let o = out_dir.to_str().unwrap();
    let mut args = vec!["nexmark", "--query", query, "--input", input, "--output", o];
    args.extend_from_slice(extra);
    let out = weir(&args, faults);
    let csv = std::fs::read_to_string(out_dir.join(format!("{query}.csv"))).unwrap_or_default();
    if !out.status.success() && faults.is_none() {
        panic!("{query} {extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    (
        out.status.success(),
        csv,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn assert_same(query: &str, what: &str, got: &str, expected: &str) {
    if got != expected {
        let g: Vec<&str> = got.lines().collect();
        let e: Vec<&str> = expected.lines().collect();
        let first = g.iter().zip(&e).position(|(a, b)| a != b);
        panic!(
            "{query} ({what}): {} lines, expected {}; first difference at line {first:?}: {:?} vs {:?}",
            g.len(),
            e.len(),
            first.map(|i| g[i]),
            first.map(|i| e[i]),
        );
    }
}

/// Every query over files of several seeds and rates, aligned checkpoints.
#[test]
fn every_query_matches_the_reference_over_several_inputs() {
    let dir = tempfile::tempdir().unwrap();
    for (seed, rate) in [(1, 10_000), (7, 2_000), (42, 50_000)] {
        let (input, events) = generate(dir.path(), 40_000, rate, seed);
        for q in QUERIES {
            let expected = nexmark_reference::reference(q, &events);
            let out = dir.path().join(format!("out-{seed}-{q}"));
            let (_, got) = run_query(q, &input, &out, &[], None);
            assert_same(q, &format!("seed {seed}, rate {rate}"), &got, &expected);
            assert!(expected.lines().count() > 1, "{q}: the reference finds rows");
        }
    }
}

/// Every query in every checkpoint mode, checkpoints every 10 ms.
#[test]
fn every_query_matches_the_reference_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    let (input, events) = generate(dir.path(), 40_000, 5_000, 5);
    for mode in ["none", "at-least-once", "unaligned"] {
        for q in QUERIES {
            let expected = nexmark_reference::reference(q, &events);
            let out = dir.path().join(format!("out-{mode}-{q}"));
            let (_, got) = run_query(
                q,
                &input,
                &out,
                &["--mode", mode, "--checkpoint-interval-ms", "10"],
                None,
            );
            assert_same(q, mode, &got, &expected);
        }
    }
}

/// A failure in the middle of every query (in-process restart from the
/// latest checkpoint), and a crash of the process right after a checkpoint
/// completed, before its output was committed (a second run resumes from
/// it and commits): the same exact output.
#[test]
fn every_query_recovers_from_a_failure_and_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (input, events) = generate(dir.path(), 100_000, 5_000, 9);
    for q in QUERIES {
        let expected = nexmark_reference::reference(q, &events);
        for mode in ["aligned", "unaligned"] {
            let out = dir.path().join(format!("fail-{mode}-{q}"));
            let args = ["--mode", mode, "--checkpoint-interval-ms", "5"];
            let (ok, got, summary) = run_query_summary(q, &input, &out, &args, Some("nexmark.record=fail-after:70000"));
            assert!(ok, "{q} {mode}: the job restarts after the failure");
            assert!(summary.contains(", 1 restarts"), "{q} {mode}: {summary}");
            assert_same(q, &format!("{mode}, failure"), &got, &expected);
        }
        let out = dir.path().join(format!("crash-{q}"));
        let args = ["--mode", "aligned", "--checkpoint-interval-ms", "5"];
        // The process dies right after the second checkpoint's manifest is
        // durable, before any sink learned it completed.
        let (ok, _) = run_query(q, &input, &out, &args, Some("checkpoint.manifest.after=abort-after:1"));
        assert!(!ok, "{q}: the first run crashed");
        assert!(
            !out.join(format!("{q}.csv")).exists(),
            "{q}: no output file before the end"
        );
        let (ok, got, summary) = run_query_summary(q, &input, &out, &args, None);
        assert!(ok);
        assert!(summary.contains("restored from checkpoint"), "{q}: resumed: {summary}");
        assert_same(q, "crash and resume", &got, &expected);
    }
}
