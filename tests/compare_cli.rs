//! `weir compare` with tiny event counts: the table, the JSON rows and the
//! SVG figure are produced and well formed, and the modes really differ in
//! their checkpoint behaviour.

use std::process::Command;

#[test]
fn compare_writes_table_json_and_plot_and_modes_differ() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "compare",
            "--events",
            "200000",
            "--open-seconds",
            "0.3",
            "--checkpoint-interval-ms",
            "10",
        ])
        .arg("--results")
        .arg(&results)
        .env("WEIR_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "weir compare failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The table: a header, one row per mode, the ratios, where the numbers come from.
    assert!(stdout.contains("measured now on this machine"), "{stdout}");
    for col in ["events/s", "p99.9 µs", "vis p50", "dur p50", "align p99", "channel B"] {
        assert!(stdout.contains(col), "column {col} missing:\n{stdout}");
    }
    for mode in ["none", "at-least-once", "aligned", "unaligned"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(mode)),
            "no row for {mode}:\n{stdout}"
        );
    }
    assert!(stdout.contains("ratios against no checkpointing"), "{stdout}");

    // JSON: a closed-loop and an open-loop row per mode, with bench's fields.
    let json = std::fs::read_to_string(results.join("compare.json")).unwrap();
    let rows: Vec<serde_json::Value> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 8, "{json}");
    for r in &rows {
        for field in ["pipeline", "mode", "events", "seconds", "events_per_sec", "run"] {
            assert!(r.get(field).is_some(), "field {field} missing in {r}");
        }
        for q in ["p50", "p99", "p999", "max"] {
            assert!(r["latency_us"][q].is_number(), "latency_us.{q} in {r}");
        }
        let mode = r["mode"].as_str().unwrap();
        let completed = r.get("checkpoints").map(|c| c["completed"].as_u64().unwrap());
        if mode == "none" {
            assert!(completed.is_none(), "no checkpoints without checkpointing: {r}");
        } else {
            // At least the final checkpoint of the bounded job.
            assert!(completed.unwrap() >= 1, "{mode}: {r}");
            assert!(r["checkpoints"]["duration_ms"]["p50"].is_number());
            assert!(
                r["visible_latency_us"]["p99"].is_number(),
                "visibility through the WAL sink: {r}"
            );
        }
    }
    // Only the unaligned runs may store in-flight records.
    for r in rows.iter().filter(|r| r["mode"] != "unaligned" && r["mode"] != "none") {
        assert_eq!(r["checkpoints"]["channel_state_bytes"], 0, "{r}");
    }

    // The figure: an SVG with a curve per mode.
    let svg = std::fs::read_to_string(results.join("compare.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{}",
        &svg[..svg.len().min(100)]
    );
    // Text elements' contents, trimmed (the legend holds one per mode).
    let texts: Vec<&str> = svg
        .split("</text>")
        .filter_map(|chunk| chunk.rsplit_once('>').map(|(_, t)| t.trim()))
        .collect();
    for mode in ["none", "at-least-once", "aligned", "unaligned"] {
        assert!(texts.contains(&mode), "legend entry {mode} missing in {texts:?}");
    }
    assert!(svg.contains("<polyline") || svg.contains("<path"), "no curve drawn");
}
