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
