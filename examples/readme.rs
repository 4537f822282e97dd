//! The embedding example of README.md, kept here so that it always compiles and runs:
//! `cargo run --release -p weir-bench --example readme`.

use std::sync::Arc;

use weir_core::{CheckpointConfig, Pipeline, RuntimeConfig, VecSource};
use weir_io::{sinks, text::Line};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let words: Vec<String> = ["to", "be", "or", "not", "to", "be"].map(String::from).to_vec();
    let words = Arc::new(words);
    let dir = std::env::temp_dir().join(format!("weir-readme-{}", std::process::id()));

    let pipeline = Pipeline::new("word-count");
    pipeline
        // Two source subtasks; subtask i reads words i, i + 2, i + 4, ...
        .source("words", 2, move |i, n| VecSource::new(words.clone(), i, n))
        // Same word, same subtask: hash partitioning over key groups.
        .key_by(|w: &String| w.clone())
        // Per-key state (a u64 count in a memory-mapped page), 0 on first use.
        .process(|word: &String, count: &mut u64, _: String, out| {
            *count += 1;
            out.emit((word.clone(), *count));
        })
        // Exactly-once files: logged, then moved into `out/` as checkpoints complete.
        .sink(
            "counts",
            sinks::wal_files(dir.join("wal"), dir.join("out"), |(w, n): &(String, u64), buf| {
                Line::new(buf).str(w).u64(*n).end()
            }),
        );

    let config = RuntimeConfig {
        checkpointing: Some(CheckpointConfig::exactly_once(dir.join("checkpoints"))),
        ..RuntimeConfig::default()
    };
    // run() starts pinned worker threads and returns at once; join() waits.
    pipeline.run(config)?.join()?;

    let mut files: Vec<_> = std::fs::read_dir(dir.join("out"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    for file in files {
        print!("{}", std::fs::read_to_string(file)?);
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
