//! `weir checkpoints list|inspect|verify` on real checkpoints: a bounded
//! keyed job with checkpoints every 5 ms leaves its final checkpoint and the
//! retained ones on disk; the command must describe them, verify them, and
//! name the file and the mismatch once a byte is flipped or a file cut.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_core::checkpoint::storage::{self, Manifest};
use weir_core::{CheckpointConfig, CheckpointMode, ForEachSink, Outcome, Pipeline, RuntimeConfig};
use weir_io::{GenContext, Generator, GeneratorConfig};

/// Completed checkpoints the job keeps (the final one among them).
const RETAINED: usize = 3;
const EVENTS: u64 = 40_000;

/// Runs a bounded keyed job with aligned checkpoints into `dir`.
fn make_checkpoints(dir: &Path) {
    let p = Pipeline::new("cli-test");
    let gen = GeneratorConfig {
        seed: 7,
        events: Some(EVENTS),
        // 200 ms of input: about 40 checkpoints at a 5 ms interval.
        rate: Some(200_000.0),
        start_ns: None,
    };
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    p.source("gen", 2, move |i, n| {
        Generator::new(gen, i, n, |c: GenContext| (c.random % 100, c.seq)).unwrap()
    })
    .key_by(|r: &(u64, u64)| r.0)
    .parallelism(2)
    .process(|k: &u64, sum: &mut u64, (_, v): (u64, u64), out| {
        *sum += v;
        out.emit((*k, *sum));
    })
    .name("sum")
    .sink("count", move |_| {
        let s = s.clone();
        ForEachSink::new(move |_: (u64, u64)| {
            s.fetch_add(1, Ordering::Relaxed);
        })
    });
    let config = RuntimeConfig {
        workers: 2,
        ring_capacity: 256,
        checkpointing: Some(CheckpointConfig {
            interval: Duration::from_millis(5),
            retained: RETAINED,
            // The sources' 38-byte states inline in the manifest, the keyed
            // tasks' larger ones in task files: both kinds are inspected
            // and corrupted below.
            inline_state_max: 64,
            ..CheckpointConfig::new(CheckpointMode::Aligned, dir)
        }),
        ..RuntimeConfig::default()
    };
    let result = p.run(config).unwrap().join().unwrap();
    assert_eq!(result.outcome, Outcome::Finished);
    assert_eq!(seen.load(Ordering::Relaxed), EVENTS);
    assert!(
        result.metrics.checkpoints.completed >= RETAINED as u64,
        "checkpoints completed: {}",
        result.metrics.checkpoints.completed
    );
}

fn weir(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .output()
        .expect("the weir binary runs")
}

/// Runs `weir checkpoints ARGS`; returns exit code, stdout, stderr.
fn checkpoints(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["checkpoints"];
    all.extend_from_slice(args);
    let out = weir(&all);
    (
        out.status.code().expect("exited, not killed"),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn complete_ids(dir: &Path) -> Vec<u64> {
    storage::list_ids(dir)
        .unwrap()
        .into_iter()
        .filter(|&id| storage::is_complete(dir, id))
        .collect()
}

fn manifest(dir: &Path, id: u64) -> Manifest {
    storage::read_manifest(dir, id).unwrap().unwrap()
}

#[test]
fn list_inspect_verify_and_detect_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_checkpoints(dir);
    let d = dir.to_str().unwrap();

    let ids = complete_ids(dir);
    assert_eq!(ids.len(), RETAINED, "retained checkpoints on disk: {ids:?}");
    let latest = *ids.last().unwrap();
    let last = manifest(dir, latest);
    assert!(last.is_final, "a bounded job ends with its final checkpoint");
    assert_eq!(last.tasks.len(), 4, "2 source tasks, 2 keyed-sink tasks");
    // An unfinished checkpoint newer than all: listed, never chosen.
    let garbage = storage::checkpoint_dir(dir, latest + 1);
    std::fs::create_dir(&garbage).unwrap();
    std::fs::write(garbage.join("task-000-000.state"), b"WEIRTSK1 half-written").unwrap();
    // And one whose manifest a crash cut short: unfinished, incomplete too.
    let torn = storage::checkpoint_dir(dir, latest + 2);
    std::fs::create_dir(&torn).unwrap();
    let whole = std::fs::read(storage::checkpoint_dir(dir, latest).join(storage::MANIFEST)).unwrap();
    std::fs::write(torn.join(storage::MANIFEST), &whole[..whole.len() / 2]).unwrap();

    // list: a header and one line per folder.
    let (code, out, err) = checkpoints(&["list", d]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1 + RETAINED + 2, "{out}");
    assert!(
        lines[0].contains("trigger (UTC)") && lines[0].contains("channel B"),
        "{out}"
    );
    for (line, &id) in lines[1..].iter().zip(&ids) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[0], id.to_string(), "{line}");
        assert_eq!(f[1], "complete", "{line}");
        assert_eq!(f[2], if id == latest { "final" } else { "-" }, "{line}");
        assert_eq!(f[3], "aligned", "{line}");
        assert!(f[4].ends_with('Z') && f[4].len() == 24, "UTC time: {line}");
        assert_eq!(f[6], "ms", "{line}");
        assert_eq!(f[7], "4", "tasks: {line}");
        let m = manifest(dir, id);
        let state: u64 = m.tasks.iter().map(|t| t.state_bytes).sum();
        assert_eq!(f[8], state.to_string(), "{line}");
        assert_eq!(f[9], "0", "aligned: no channel state: {line}");
    }
    let torn_line = lines.last().unwrap();
    assert!(
        torn_line.contains(&(latest + 2).to_string())
            && torn_line.contains("incomplete")
            && torn_line.contains("unfinished MANIFEST: cut short"),
        "{torn_line}"
    );
    let garbage_line = lines[lines.len() - 2];
    assert!(
        garbage_line.contains(&(latest + 1).to_string()) && garbage_line.contains("incomplete"),
        "{out}"
    );

    // inspect: the latest complete checkpoint by default.
    let (code, out, err) = checkpoints(&["inspect", d]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with(&format!("checkpoint {latest} (")), "{out}");
    for needle in [
        "job             cli-test",
        &format!("fingerprint     {}", last.fingerprint),
        "mode            aligned",
        "final           yes",
        "0.0:gen",
        "1.0:sum -> 1.1:count",
        "parallelism 2",
    ] {
        assert!(out.contains(needle), "missing '{needle}' in\n{out}");
    }
    // Source tasks' small state is inline in the manifest; the keyed tasks'
    // (over `inline_state_max`) is in task files.
    assert!(last.tasks[..2].iter().all(|t| t.inline_offset.is_some()), "{last:?}");
    assert!(last.tasks[2..].iter().all(|t| t.inline_offset.is_none()), "{last:?}");
    for t in &last.tasks {
        let needle = match t.inline_offset {
            Some(off) => format!("inline @{off} "),
            None => t.file.path.clone(),
        };
        let row = out
            .lines()
            .find(|l| l.contains(&needle))
            .unwrap_or_else(|| panic!("no row for {needle} in\n{out}"));
        assert!(row.contains(&format!("{:08x}", t.file.crc32)), "{row}");
        assert!(row.contains("magic \"WEIRTSK2\""), "{row}");
        assert!(row.contains(&format!("payload {} B", t.file.size - 20)), "{row}");
        assert!(row.contains(" ok") && !row.contains("[BAD]"), "{row}");
    }
    // ... or the one named.
    let (code, out, _) = checkpoints(&["inspect", d, &ids[0].to_string()]);
    assert_eq!(code, 0);
    assert!(out.starts_with(&format!("checkpoint {} (", ids[0])) && out.contains("final           no"));
    // ... and an incomplete folder shows what it holds.
    let (code, out, _) = checkpoints(&["inspect", d, &(latest + 1).to_string()]);
    assert_eq!(code, 0);
    assert!(
        out.contains("incomplete") && out.contains("task-000-000.state"),
        "{out}"
    );

    // verify: every complete checkpoint is OK; the incomplete one is skipped.
    let (code, out, err) = checkpoints(&["verify", d]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().filter(|l| l.contains("  OK  ")).count(), RETAINED, "{out}");
    assert!(out.contains("incomplete (no MANIFEST): skipped"), "{out}");
    assert!(out.contains("incomplete (unfinished MANIFEST: cut short"), "{out}");

    // Corrupt one byte of a task file's payload in the latest checkpoint,
    // and cut another task file of the oldest one.
    let flipped = &last.tasks[3].file;
    let flipped_path = dir.join(&flipped.path);
    let mut bytes = std::fs::read(&flipped_path).unwrap();
    bytes[16] ^= 0x5a;
    std::fs::write(&flipped_path, &bytes).unwrap();
    let oldest = manifest(dir, ids[0]);
    let cut = &oldest.tasks[2].file;
    let cut_path = dir.join(&cut.path);
    let bytes = std::fs::read(&cut_path).unwrap();
    std::fs::write(&cut_path, &bytes[..bytes.len() - 3]).unwrap();

    let (code, out, err) = checkpoints(&["verify", d]);
    assert_eq!(code, 1, "{out}{err}");
    let flip_report: Vec<&str> = out.lines().filter(|l| l.contains(&flipped.path)).collect();
    assert!(
        flip_report.iter().any(|l| l.contains("CRC mismatch")
            && l.contains(&format!("expected {:08x}", flipped.crc32))
            && l.contains("actual ")),
        "whole-file CRC mismatch named:\n{out}"
    );
    assert!(
        flip_report
            .iter()
            .any(|l| l.contains("payload CRC mismatch at offset 16..")),
        "payload CRC mismatch named:\n{out}"
    );
    assert!(
        out.lines().any(|l| l.contains(&cut.path)
            && l.contains(&format!("has {} bytes, the manifest says {}", cut.size - 3, cut.size))),
        "truncation named:\n{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains(&cut.path) && l.contains("length field at byte 8 says")),
        "frame length mismatch named:\n{out}"
    );
    assert!(err.contains("2 of 3 checkpoints failed verification"), "{err}");
    assert!(
        err.contains(&ids[0].to_string()) && err.contains(&latest.to_string()),
        "{err}"
    );
    // The middle checkpoint is untouched: verifying it alone succeeds.
    let (code, out, err) = checkpoints(&["verify", d, &ids[1].to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("  OK  "), "{out}");
    // inspect flags the bad file instead of hiding it.
    let (code, out, _) = checkpoints(&["inspect", d]);
    assert_eq!(code, 0);
    let row = out.lines().find(|l| l.contains(&flipped.path)).unwrap();
    assert!(
        row.contains("[BAD]") && row.contains("payload CRC mismatch at offset 16.."),
        "{row}"
    );

    // A manifest with a flipped byte in an inline task state (its last
    // byte: the second source task's frame), then in its JSON: listed as
    // corrupt, fails verify, naming what and where.
    let m_path = storage::checkpoint_dir(dir, ids[1]).join(storage::MANIFEST);
    let good = std::fs::read(&m_path).unwrap();
    let mut bytes = good.clone();
    *bytes.last_mut().unwrap() ^= 0x01;
    std::fs::write(&m_path, &bytes).unwrap();
    let (code, out, _) = checkpoints(&["verify", d, &ids[1].to_string()]);
    assert_eq!(code, 1);
    assert!(
        out.contains("CRC mismatch in the inline state of task 0/1 at bytes")
            && out.contains(&format!("..{}", good.len())),
        "{out}"
    );
    // (Byte 20: in the JSON line, after the first sector's 16-byte tag.)
    let mut bytes = good;
    bytes[20] ^= 0x01;
    std::fs::write(&m_path, &bytes).unwrap();
    let (code, out, _) = checkpoints(&["list", d]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.contains(&ids[1].to_string()) && l.contains("corrupt") && l.contains("CRC mismatch")),
        "{out}"
    );
    let (code, out, _) = checkpoints(&["verify", d, &ids[1].to_string()]);
    assert_eq!(code, 1);
    assert!(out.contains("manifest:") && out.contains("CRC mismatch"), "{out}");
}

#[test]
fn usage_errors_exit_2_with_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nowhere");
    let m = missing.to_str().unwrap();
    for cmd in ["list", "inspect", "verify"] {
        let (code, _, err) = checkpoints(&[cmd, m]);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(
            err.starts_with("weir: error: checkpoint directory ") && err.contains("nowhere"),
            "{cmd}: {err}"
        );
    }
    // An empty directory: nothing to list is fine, nothing to verify is not.
    let d = tmp.path().to_str().unwrap();
    let (code, out, _) = checkpoints(&["list", d]);
    assert_eq!(code, 0);
    assert!(out.contains("no checkpoint folders"), "{out}");
    let (code, _, err) = checkpoints(&["verify", d]);
    assert_eq!(code, 2);
    assert!(err.contains("no complete checkpoint"), "{err}");
    let (code, _, err) = checkpoints(&["inspect", d, "42"]);
    assert_eq!(code, 2);
    assert!(err.contains("no checkpoint 42 (chk-0000000042)"), "{err}");
    // clap refuses a non-numeric id with its own usage error.
    let (code, _, _) = checkpoints(&["inspect", d, "latest"]);
    assert_eq!(code, 2);
}
