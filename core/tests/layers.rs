//! weir-core's folders are layers, and this test keeps them so: a module may
//! use the modules of its own folder, of the folders below it, and the base
//! modules at the crate root, never a folder above it. The order, bottom to
//! top (also written in `src/lib.rs`):
//!
//! | layer | what |
//! |---|---|
//! | base | `error`, `clock`, `data`, `latency`, `watermark` at the crate root |
//! | threads | helper threads: placement, parking, waking, I/O threads |
//! | storage | vfs, syncs, corruption reports, fault points |
//! | state | keyed state in mapped pages, key groups, snapshot files |
//! | checkpoint | barriers, snapshots, the coordinator, recovery |
//! | runtime | the physical plan, tasks, rings, the job thread, metrics |
//! | operators | stateless, keyed, process, windows, joins, event time |
//! | api | `Pipeline`, `Stream`, `KeyedStream`; the connector harness |
//!
//! Test code (`#[cfg(test)]` modules) and the fuzzing scaffolding may use any
//! layer. The test reads the sources as text: every `crate::` path outside
//! comments and test modules, in `use` trees too, and paths through the
//! crate root's re-exports (`crate::Error`, `crate::vfs`), resolved through
//! `src/lib.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom to top.
const LAYERS: &[&str] = &[
    "base",
    "threads",
    "storage",
    "state",
    "checkpoint",
    "runtime",
    "operators",
    "api",
];

/// Crate-root modules that are test scaffolding: may use every layer, and
/// no layer may use them outside test code.
const SCAFFOLDING: &[&str] = &["fuzzing"];

/// Imports against the order that are known and not yet taken out, as
/// (file relative to `src/`, the layer it reaches up to). The test fails on
/// any other, and on an entry here that no longer occurs, so this list
/// only shrinks.
const KNOWN: &[(&str, &str)] = &[];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `text` without `//` comments (doc comments included) and string literals'
/// contents (so a path in a message is no import), but with the paths of
/// `#[path = "..."]` attributes.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut in_str = false;
    while i < bytes.len() {
        let c = bytes[i];
        if in_str {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
                out.push('"');
            }
            i += 1;
            continue;
        }
        if c == b'/' && bytes.get(i + 1) == Some(&b'/') {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        // Character literals, so that '{' or '"' is neither a brace nor a string.
        if c == b'\'' && bytes.get(i + 2) == Some(&b'\'') {
            out.push_str("' '");
            i += 3;
            continue;
        }
        if c == b'\'' && bytes.get(i + 1) == Some(&b'\\') && bytes.get(i + 3) == Some(&b'\'') {
            out.push_str("' '");
            i += 4;
            continue;
        }
        if c == b'"' {
            if out.ends_with("#[path = ") {
                // A module's path: kept, to find test-only files.
                let end = text[i + 1..].find('"').expect("a path attribute closes") + i + 1;
                out.push_str(&text[i..=end]);
                i = end + 1;
                continue;
            }
            in_str = true;
        }
        out.push(c as char);
        i += 1;
    }
    out
}

/// Removes `#[cfg(test)] mod name { ... }` blocks (and the attribute
/// alone elsewhere); returns the names of
/// `#[cfg(test)] mod name;` declarations (test-only files), with a
/// `#[path = "..."]` if one is given.
fn strip_test_modules(text: &str, file: &str) -> (String, Vec<String>) {
    let mut out = text.to_owned();
    let mut test_files = Vec::new();
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = &out[at + "#[cfg(test)]".len()..];
        let mut path_attr = None;
        let mut skip = 0;
        // Other attributes between the cfg and the item.
        let mut tail = rest.trim_start();
        while tail.starts_with("#[") {
            let end = tail.find(']').expect("an attribute ends") + 1;
            let attr = &tail[..end];
            if let Some(p) = attr.strip_prefix("#[path = \"") {
                path_attr = Some(p.trim_end_matches("\"]").to_owned());
            }
            tail = tail[end..].trim_start();
        }
        skip += rest.len() - tail.len();
        let item = tail;
        let block_end = if let Some(decl) = item.strip_prefix("mod ") {
            let name: String = decl.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let after = decl[name.len()..].trim_start();
            if after.starts_with(';') {
                test_files.push(path_attr.unwrap_or(format!("{name}.rs")));
                Some(at + "#[cfg(test)]".len() + skip + 4 + name.len() + 1)
            } else {
                None
            }
        } else {
            None
        };
        let end = match block_end {
            Some(end) => end,
            None if item.starts_with("mod ") => {
                // An inline test module: up to its matching closing brace.
                let start = at + "#[cfg(test)]".len() + skip;
                let bytes = out.as_bytes();
                let mut j = start;
                let mut depth = 0usize;
                loop {
                    match bytes.get(j) {
                        None => break j,
                        Some(b'{') => depth += 1,
                        Some(b'}') => {
                            depth = depth
                                .checked_sub(1)
                                .unwrap_or_else(|| panic!("{file}: braces do not balance at byte {j}"));
                            if depth == 0 {
                                break j + 1;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
            }
            // A test-only field or statement: only the attribute goes.
            None => at + "#[cfg(test)]".len(),
        };
        out.replace_range(at..end, "");
    }
    (out, test_files)
}

/// The first segment of each path item in a `use` tree body (`a::b, c::{d}`).
fn tree_heads(body: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    for c in body.chars() {
        match c {
            '{' => {
                depth += 1;
                current.push(c);
            }
            '}' => {
                depth -= 1;
                current.push(c);
            }
            ',' if depth == 0 => heads.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    heads.push(current);
    heads
        .iter()
        .filter_map(|item| {
            let head: String = item
                .trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!head.is_empty()).then_some(head)
        })
        .collect()
}

/// The first segment after each `crate::` (each item of a `crate::{..}` tree).
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$');
        let after = &rest[at + "crate::".len()..];
        if !preceded_by_ident {
            if let Some(tree) = after.strip_prefix('{') {
                let mut depth = 1;
                let end = tree
                    .char_indices()
                    .find(|&(_, c)| {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            _ => {}
                        }
                        depth == 0
                    })
                    .map(|(i, _)| i)
                    .expect("a use tree closes");
                found.extend(tree_heads(&tree[..end]));
            } else {
                let head: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !head.is_empty() {
                    found.insert(head);
                }
            }
        }
        rest = after;
    }
    found
}

/// The layer each crate-root name belongs to: the folders, the base
/// modules, and every name `lib.rs` re-exports (`pub use folder::...`).
fn root_names(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for layer in LAYERS.iter().skip(1) {
        names.insert(layer.to_string(), layer.to_string());
    }
    let code = strip_comments(lib);
    for statement in code.split(';') {
        let statement = statement.trim();
        let Some(tree) = statement.strip_prefix("pub use ") else {
            continue;
        };
        let first: String = tree.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let layer = if LAYERS.contains(&first.as_str()) {
            first.clone()
        } else {
            "base".to_owned()
        };
        // Every identifier after the first segment may be a re-exported name.
        let rest = &tree[first.len()..];
        for word in rest.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            if !word.is_empty() {
                names.entry(word.to_owned()).or_insert_with(|| layer.clone());
            }
        }
    }
    for module in ["error", "clock", "data", "latency", "watermark"] {
        names.insert(module.to_owned(), "base".to_owned());
    }
    for module in SCAFFOLDING {
        names.insert(module.to_string(), "scaffolding".to_owned());
    }
    names
}

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == layer)
}

/// Every import against the order: (file, layer it reaches up to).
fn violations() -> BTreeSet<(String, String)> {
    let src = src_dir();
    let names = root_names(&std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs"));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();

    // Test-only files, named by the `#[cfg(test)] mod x;` that includes them.
    let mut test_only = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read a source file");
        let (_, tests) = strip_test_modules(&strip_comments(&text), &file.display().to_string());
        for t in tests {
            // `mod x;` in `a/b.rs` is `a/b/x.rs`; in `a/mod.rs`, and with a
            // `#[path]`, it is relative to `a/`: both are marked.
            test_only.insert(file.with_extension("").join(&t));
            test_only.insert(file.parent().unwrap().join(&t));
        }
    }

    let mut found = BTreeSet::new();
    for file in &files {
        if test_only.contains(file) {
            continue;
        }
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        let layer = if rel.components().count() == 1 {
            let stem = first.trim_end_matches(".rs");
            if SCAFFOLDING.contains(&stem) || stem == "lib" {
                continue;
            }
            "base".to_owned()
        } else {
            first
        };
        let own = rank(&layer).unwrap_or_else(|| panic!("{}: folder {layer} is not a layer in LAYERS", rel.display()));
        let text = std::fs::read_to_string(file).expect("read a source file");
        let (code, _) = strip_test_modules(&strip_comments(&text), &rel.display().to_string());
        for head in crate_paths(&code) {
            let Some(target) = names.get(&head) else {
                panic!(
                    "{}: crate::{head} is neither a layer nor a name re-exported by lib.rs",
                    rel.display()
                );
            };
            if target == "scaffolding" {
                found.insert((rel.display().to_string(), target.clone()));
                continue;
            }
            let to = rank(target).expect("a layer");
            if to > own {
                found.insert((rel.display().to_string(), target.clone()));
            }
        }
    }
    found
}

#[test]
fn no_folder_imports_a_folder_above_it() {
    let found = violations();
    let known: BTreeSet<(String, String)> = KNOWN.iter().map(|(f, l)| (f.to_string(), l.to_string())).collect();
    let new: Vec<_> = found.difference(&known).collect();
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(
        new.is_empty(),
        "imports against the layer order (file, the layer it reaches up to): {new:?}; \
         move the shared item down a layer, or the importing code up"
    );
    assert!(
        gone.is_empty(),
        "entries of KNOWN that no longer occur, take them out of the list: {gone:?}"
    );
}

#[test]
fn the_checker_sees_paths_in_use_trees_and_skips_comments_and_tests() {
    let code = "use crate::{runtime::task::Task, error::Error};\n\
                // crate::api::Pipeline in a comment\n\
                let s = \"crate::operators in a string\";\n\
                fn f() { crate::state::x(); }\n\
                #[cfg(test)]\nmod tests { use crate::api::Pipeline; }\n";
    let (stripped, _) = strip_test_modules(&strip_comments(code), "sample");
    let heads = crate_paths(&stripped);
    assert_eq!(
        heads.into_iter().collect::<Vec<_>>(),
        vec!["error".to_owned(), "runtime".to_owned(), "state".to_owned()]
    );
    let (_, files) = strip_test_modules(
        &strip_comments("#[cfg(test)]\n#[path = \"task_tests.rs\"]\nmod tests;\n"),
        "sample",
    );
    assert_eq!(files, vec!["task_tests.rs".to_owned()]);
}
