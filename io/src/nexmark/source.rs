//! [`NexmarkSource`]: the Nexmark generator as a replayable weir source.
//!
//! This module exists to feed Nexmark events into a pipeline without a file
//! in between. Subtask `i` of `p` emits event numbers `i, i + p, i + 2p, ...`
//! (of `0..events`, or without end), so the union over subtasks is the same
//! stream for every parallelism, and each subtask's events have
//! non-decreasing event times. The offset is the next local index, so a
//! restored subtask replays exactly the events after its checkpoint.
//! Events are made at full speed: `events_per_second` only sets event time.

use weir_core::{BoxError, Source, SourceContext, SourcePoll};

use super::generator::{NexmarkConfig, NexmarkGenerator};
use super::model::Event;
use crate::{Error, Result};

/// One subtask of the Nexmark source; see the module docs.
///
/// ```
/// use weir_core::harness::Harness;
/// use weir_core::SourcePoll;
/// use weir_io::nexmark::{NexmarkConfig, NexmarkSource};
///
/// // Subtask 1 of 2 emits the odd event numbers of 0..10.
/// let mut src = NexmarkSource::new(NexmarkConfig::default(), Some(10), 1, 2).unwrap();
/// let mut out = Vec::new();
/// let status = Harness::new(1, 2).poll_source(&mut src, &mut out, 100).unwrap();
/// assert_eq!((status, out.len()), (SourcePoll::Done, 5));
/// ```
#[derive(Debug)]
pub struct NexmarkSource {
    generator: NexmarkGenerator,
    /// Next local index k; the next event number is `subtask + k * stride`.
    next: u64,
    /// Local indexes `0..end` exist (`u64::MAX`: unbounded).
    end: u64,
    subtask: u64,
    stride: u64,
}

impl NexmarkSource {
    /// The source instance of `subtask` out of `parallelism`, emitting events
    /// `0..events` (`None`: without end) of the stream configured by `cfg`.
    pub fn new(cfg: NexmarkConfig, events: Option<u64>, subtask: usize, parallelism: usize) -> Result<Self> {
        if parallelism == 0 || subtask >= parallelism {
            return Err(Error::InvalidConfig {
                setting: "subtask",
                value: format!("{subtask} of {parallelism}"),
                reason: "subtask must be in 0..parallelism",
            });
        }
        let (s, p) = (subtask as u64, parallelism as u64);
        let end = match events {
            Some(n) if n > s => (n - s).div_ceil(p),
            Some(_) => 0,
            None => u64::MAX,
        };
        Ok(NexmarkSource {
            generator: NexmarkGenerator::new(cfg)?,
            next: 0,
            end,
            subtask: s,
            stride: p,
        })
    }

    /// The event number the next poll starts with.
    pub fn next_event_number(&self) -> u64 {
        self.subtask + self.next * self.stride
    }
}

impl Source<Event> for NexmarkSource {
    #[inline]
    fn poll(&mut self, out: &mut Vec<Event>, max: usize, _: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError> {
        let n = (self.end - self.next).min(max as u64);
        self.generator
            .events_into(self.next_event_number(), self.stride, n as usize, out);
        self.next += n;
        Ok(if self.next == self.end {
            SourcePoll::Done
        } else {
            SourcePoll::Ready
        })
    }

    fn offset(&self) -> Vec<u8> {
        self.next.to_le_bytes().to_vec()
    }

    fn seek(&mut self, offset: &[u8]) -> Result<(), BoxError> {
        self.next = crate::generator::decode_index_offset(offset, self.end, "nexmark")?;
        Ok(())
    }

    fn is_replayable(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use weir_core::harness::Harness;

    use super::*;
    use crate::nexmark::generator::event;

    fn cfg() -> NexmarkConfig {
        NexmarkConfig {
            seed: 11,
            ..Default::default()
        }
    }

    /// Drains subtask `i` of `p` in batches of `batch`.
    fn drain(events: u64, i: usize, p: usize, batch: usize) -> Vec<Event> {
        let mut src = NexmarkSource::new(cfg(), Some(events), i, p).unwrap();
        let mut h = Harness::new(i, p);
        let mut all = Vec::new();
        loop {
            let mut out = Vec::new();
            let status = h.poll_source(&mut src, &mut out, batch).unwrap();
            assert!(out.len() <= batch);
            all.extend(out);
            if status == SourcePoll::Done {
                return all;
            }
        }
    }

    fn counts(events: impl IntoIterator<Item = Event>) -> HashMap<Event, usize> {
        let mut m = HashMap::new();
        for e in events {
            *m.entry(e).or_insert(0) += 1;
        }
        m
    }

    #[test]
    fn every_parallelism_emits_the_same_events() {
        let n = 2503;
        let expected: Vec<Event> = (0..n).map(|k| event(&cfg(), k)).collect();
        assert_eq!(drain(n, 0, 1, 1000), expected, "parallelism 1 emits events in order");
        for (p, batch) in [(2, 7), (3, 1), (3, 100), (4, 64)] {
            let mut all = Vec::new();
            for i in 0..p {
                let part = drain(n, i, p, batch);
                // Subtask i emits events i, i + p, ... in order.
                let mine: Vec<Event> = (i as u64..n).step_by(p).map(|k| event(&cfg(), k)).collect();
                assert_eq!(part, mine, "p={p} i={i}");
                assert!(part.windows(2).all(|w| w[0].date_time() <= w[1].date_time()));
                all.extend(part);
            }
            assert_eq!(counts(all), counts(expected.clone()), "p={p} batch={batch}");
        }
    }

    #[test]
    fn seek_replays_from_the_offset() {
        let mut src = NexmarkSource::new(cfg(), Some(1000), 1, 3).unwrap();
        let mut h = Harness::new(1, 3);
        let mut first = Vec::new();
        h.poll_source(&mut src, &mut first, 40).unwrap();
        let offset = src.offset();
        assert_eq!(src.next_event_number(), 1 + 40 * 3);
        let mut rest = Vec::new();
        h.poll_source(&mut src, &mut rest, 50).unwrap();
        // A fresh instance restored from the offset replays exactly `rest`.
        let mut restored = NexmarkSource::new(cfg(), Some(1000), 1, 3).unwrap();
        restored.seek(&offset).unwrap();
        let mut again = Vec::new();
        h.poll_source(&mut restored, &mut again, 50).unwrap();
        assert_eq!(again, rest);
        assert_eq!(rest[0], event(&cfg(), 121));
        // Seeking back on the same instance too.
        src.seek(&offset).unwrap();
        let mut again = Vec::new();
        h.poll_source(&mut src, &mut again, 50).unwrap();
        assert_eq!(again, rest);
        assert!(src.is_replayable());
        // Local indexes 0..=333 exist for subtask 1 of 3 over 1000 events.
        assert!(src.seek(&333u64.to_le_bytes()).is_ok());
        let e = src.seek(&335u64.to_le_bytes()).unwrap_err().to_string();
        assert!(e.contains("past the end"), "{e}");
        let e = src.seek(&[1, 2, 3]).unwrap_err().to_string();
        assert!(e.contains("expected 8 bytes"), "{e}");
    }

    #[test]
    fn bounds_and_settings() {
        // More subtasks than events: the extra ones are done at once.
        assert!(drain(2, 2, 3, 10).is_empty());
        assert_eq!(drain(2, 1, 3, 10).len(), 1);
        // Unbounded: never done.
        let mut src = NexmarkSource::new(cfg(), None, 0, 1).unwrap();
        let mut h = Harness::new(0, 1);
        for _ in 0..3 {
            let mut out = Vec::new();
            assert_eq!(h.poll_source(&mut src, &mut out, 500).unwrap(), SourcePoll::Ready);
            assert_eq!(out.len(), 500);
        }
        assert!(NexmarkSource::new(cfg(), None, 2, 2).is_err());
        assert!(NexmarkSource::new(cfg(), None, 0, 0).is_err());
        let bad = NexmarkConfig {
            events_per_second: 0,
            ..cfg()
        };
        assert!(NexmarkSource::new(bad, None, 0, 1).is_err());
    }
}
