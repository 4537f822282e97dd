//! The embedding example of README.md, kept here so that it always compiles and runs:
//! `cargo run --release -p weir-bench --example readme`.

use std::sync::Arc;

use weir_core::{ForEachSink, Pipeline, RuntimeConfig, VecSource};

fn main() -> weir_core::Result<()> {
    let words: Vec<String> = ["to", "be", "or", "not", "to", "be"].map(String::from).to_vec();
    let words = Arc::new(words);

    let pipeline = Pipeline::new("word-count");
    pipeline
        // Two source subtasks; subtask i reads words i, i + 2, i + 4, ...
        .source("words", 2, move |i, p| VecSource::new(words.clone(), i, p))
        // Same word, same subtask: hash partitioning over key groups.
        .key_by(|w: &String| w.clone())
        .parallelism(2)
        // Per-key state (a u64 count in a memory-mapped page), 0 on first use.
        .process(|word: &String, count: &mut u64, _: String, out| {
            *count += 1;
            out.emit((word.clone(), *count));
        })
        .sink("print", |_| {
            ForEachSink::new(|(w, n): (String, u64)| println!("{w}: {n}"))
        });

    // run() starts pinned worker threads and returns at once; join() waits.
    let result = pipeline.run(RuntimeConfig::default())?.join()?;
    for t in &result.metrics.tasks {
        println!("{} [{}]: {} in, {} out", t.name, t.subtask, t.records_in, t.records_out);
    }
    Ok(())
}
