//! A deterministic generator source: the same seed gives the same records,
//! whatever the parallelism, the batch sizes or the restarts.
//!
//! Record number `seq` (a global sequence number, `0..events`) is made by a
//! user function from `seq` and a pseudo-random word derived from
//! `(seed, seq)` alone. Subtask `i` of `p` emits the sequence numbers
//! `i, i + p, i + 2p, ...`, so the union over subtasks is the same set for
//! every parallelism. The offset is the next local sequence index, so the
//! source is replayable.
//!
//! With a rate, record `seq` is due at `start + seq / rate` and is stamped
//! with that scheduled time, not with the time it was actually emitted: a
//! stall anywhere in the pipeline then shows up in the measured latency
//! instead of silently slowing the load (no coordinated omission). Without
//! a rate, records are stamped with one clock reading per batch.

use weir_core::{BoxError, Source, SourceContext, SourcePoll};

use crate::{Error, Result};

/// What the record function gets for each record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenContext {
    /// Global sequence number of the record.
    pub seq: u64,
    /// A pseudo-random word determined by `(seed, seq)`.
    pub random: u64,
    /// Emission timestamp on [`weir_core::clock`]: the scheduled time with a
    /// rate, the batch's clock reading without.
    pub emitted_ns: u64,
}

/// Settings of a [`Generator`], shared by all its subtasks.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GeneratorConfig {
    /// Seed of the pseudo-random words.
    pub seed: u64,
    /// Total records over all subtasks; `None` for an unbounded source.
    pub events: Option<u64>,
    /// Total records per second over all subtasks; `None` for full speed.
    pub rate: Option<f64>,
    /// Schedule origin on [`weir_core::clock`] for a rated generator; every
    /// subtask must use the same. `None`: the first poll of each subtask.
    pub start_ns: Option<u64>,
}

impl GeneratorConfig {
    /// Checks the rate: positive, finite, at most 10^10 records/s.
    pub fn validate(&self) -> Result<()> {
        if let Some(r) = self.rate {
            if !(r.is_finite() && r > 0.0 && r <= 1e10) {
                return Err(Error::InvalidConfig {
                    setting: "rate",
                    value: r.to_string(),
                    reason: "must be a positive number of records per second, at most 1e10",
                });
            }
        }
        Ok(())
    }
}

/// Decodes the offset of a source that emits a local index sequence: the
/// next index as 8 little-endian bytes, at most `end`.
pub(crate) fn decode_index_offset(offset: &[u8], end: u64, source_name: &'static str) -> Result<u64> {
    let bytes: [u8; 8] = offset.try_into().map_err(|_| Error::BadOffset {
        source_name,
        reason: format!("expected 8 bytes, got {}", offset.len()),
    })?;
    let k = u64::from_le_bytes(bytes);
    if k > end {
        return Err(Error::BadOffset {
            source_name,
            reason: format!("offset {k} is past the end {end}"),
        });
    }
    Ok(k)
}

/// SplitMix64: a fast, well-mixed function of `(seed, seq)`.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One subtask of a deterministic generator; see the module docs.
///
/// ```
/// use weir_io::{GenContext, Generator, GeneratorConfig};
/// let cfg = GeneratorConfig { seed: 7, events: Some(10), ..Default::default() };
/// // Subtask 1 of 2 makes the odd sequence numbers.
/// let g = Generator::new(cfg, 1, 2, |c: GenContext| c.seq).unwrap();
/// # let _ = g;
/// ```
pub struct Generator<F> {
    f: F,
    seed_mix: u64,
    /// Next local index k; this subtask's next record is `subtask + k * stride`.
    next: u64,
    /// Local indexes `0..end` exist (`u64::MAX`: unbounded).
    end: u64,
    subtask: u64,
    stride: u64,
    /// Nanoseconds per global sequence number, for a rated generator.
    period_ns: Option<f64>,
    start_ns: Option<u64>,
}

impl<F> Generator<F> {
    /// The generator instance of `subtask` out of `parallelism`.
    pub fn new(config: GeneratorConfig, subtask: usize, parallelism: usize, f: F) -> Result<Self> {
        config.validate()?;
        if parallelism == 0 || subtask >= parallelism {
            return Err(Error::InvalidConfig {
                setting: "subtask",
                value: format!("{subtask} of {parallelism}"),
                reason: "subtask must be in 0..parallelism",
            });
        }
        let (s, p) = (subtask as u64, parallelism as u64);
        let end = match config.events {
            // Local indexes k with s + k*p < events.
            Some(n) if n > s => (n - s).div_ceil(p),
            Some(_) => 0,
            None => u64::MAX,
        };
        Ok(Generator {
            f,
            seed_mix: splitmix64(config.seed),
            next: 0,
            end,
            subtask: s,
            stride: p,
            period_ns: config.rate.map(|r| 1e9 / r),
            start_ns: config.start_ns,
        })
    }

    #[inline]
    fn seq(&self, k: u64) -> u64 {
        self.subtask + k * self.stride
    }
}

impl<T, F> Source<T> for Generator<F>
where
    T: Send + 'static,
    F: FnMut(GenContext) -> T + Send + 'static,
{
    #[inline]
    fn poll(&mut self, out: &mut Vec<T>, max: usize, ctx: &mut SourceContext<'_>) -> Result<SourcePoll, BoxError> {
        let remaining = self.end - self.next;
        let mut n = remaining.min(max as u64);
        let now = ctx.now_ns();
        match self.period_ns {
            None => {
                // One reservation, then a loop of exactly `n` writes: the
                // capacity check runs once per batch, not per record.
                let (f, seed_mix) = (&mut self.f, self.seed_mix);
                let (first, stride) = (self.subtask + self.next * self.stride, self.stride);
                out.reserve(n as usize);
                out.extend((0..n).map(|j| {
                    let seq = first + j * stride;
                    f(GenContext {
                        seq,
                        random: splitmix64(seq ^ seed_mix),
                        emitted_ns: now,
                    })
                }));
            }
            Some(period) => {
                let start = *self.start_ns.get_or_insert(now);
                // Records due by now: global seq with start + seq*period <= now.
                let due_global = if now < start {
                    0
                } else {
                    ((now - start) as f64 / period) as u64 + 1
                };
                // Local indexes k with subtask + k*stride < due_global.
                let due_local = due_global.saturating_sub(self.subtask).div_ceil(self.stride);
                n = n.min(due_local.saturating_sub(self.next));
                for k in self.next..self.next + n {
                    let seq = self.seq(k);
                    out.push((self.f)(GenContext {
                        seq,
                        random: splitmix64(seq ^ self.seed_mix),
                        emitted_ns: start + (seq as f64 * period) as u64,
                    }));
                }
            }
        }
        self.next += n;
        Ok(if self.next == self.end {
            SourcePoll::Done
        } else if n == 0 {
            SourcePoll::Idle
        } else {
            SourcePoll::Ready
        })
    }

    fn offset(&self) -> Vec<u8> {
        self.next.to_le_bytes().to_vec()
    }

    fn seek(&mut self, offset: &[u8]) -> Result<(), BoxError> {
        self.next = decode_index_offset(offset, self.end, "generator")?;
        Ok(())
    }

    fn is_replayable(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::harness::Harness;

    fn drain(cfg: GeneratorConfig, p: usize, batch: usize) -> Vec<(u64, u64)> {
        let mut all = Vec::new();
        for i in 0..p {
            let mut g = Generator::new(cfg, i, p, |c: GenContext| (c.seq, c.random)).unwrap();
            let mut h = Harness::new(i, p);
            loop {
                let mut out = Vec::new();
                let status = h.poll_source(&mut g, &mut out, batch).unwrap();
                assert!(out.len() <= batch);
                all.extend(out);
                if status == SourcePoll::Done {
                    break;
                }
            }
        }
        all.sort();
        all
    }

    #[test]
    fn same_records_for_every_parallelism_and_batch() {
        let cfg = GeneratorConfig {
            seed: 42,
            events: Some(1003),
            ..Default::default()
        };
        let one = drain(cfg, 1, 1000);
        assert_eq!(one.len(), 1003);
        assert_eq!(
            one.iter().map(|r| r.0).collect::<Vec<_>>(),
            (0..1003).collect::<Vec<_>>()
        );
        for (p, b) in [(2, 7), (3, 1), (4, 64), (7, 1000)] {
            assert_eq!(drain(cfg, p, b), one, "p={p} batch={b}");
        }
        let other_seed = drain(GeneratorConfig { seed: 43, ..cfg }, 1, 1000);
        assert_ne!(other_seed, one, "the seed must change the random words");
    }

    #[test]
    fn seek_replays_from_the_offset() {
        let cfg = GeneratorConfig {
            seed: 1,
            events: Some(100),
            ..Default::default()
        };
        let mut g = Generator::new(cfg, 0, 1, |c: GenContext| c.seq).unwrap();
        let mut h = Harness::new(0, 1);
        let mut first = Vec::new();
        h.poll_source(&mut g, &mut first, 30).unwrap();
        let offset = Source::<u64>::offset(&g);
        let mut rest = Vec::new();
        h.poll_source(&mut g, &mut rest, 30).unwrap();
        Source::<u64>::seek(&mut g, &offset).unwrap();
        let mut again = Vec::new();
        h.poll_source(&mut g, &mut again, 30).unwrap();
        assert_eq!(first, (0..30).collect::<Vec<_>>());
        assert_eq!(again, rest);
        assert!(Source::<u64>::seek(&mut g, &[1, 2]).is_err());
        assert!(Source::<u64>::seek(&mut g, &1000u64.to_le_bytes()).is_err());
    }

    #[test]
    fn rated_records_carry_their_scheduled_time() {
        // 1000 records/s: record seq is due at start + seq ms.
        let start = weir_core::clock::now_ns();
        let cfg = GeneratorConfig {
            seed: 0,
            events: Some(5),
            rate: Some(1000.0),
            start_ns: Some(start),
        };
        let mut g = Generator::new(cfg, 0, 1, |c: GenContext| (c.seq, c.emitted_ns)).unwrap();
        let mut h = Harness::new(0, 1);
        let mut got = Vec::new();
        let mut status = SourcePoll::Ready;
        while status != SourcePoll::Done {
            let mut out = Vec::new();
            status = h.poll_source(&mut g, &mut out, 100).unwrap();
            for &(seq, at) in &out {
                // Never emitted before it is due.
                assert!(weir_core::clock::now_ns() >= at, "record {seq} emitted early");
            }
            got.extend(out);
        }
        let expected: Vec<_> = (0..5).map(|s| (s, start + s * 1_000_000)).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn bad_settings_are_refused() {
        let bad = GeneratorConfig {
            rate: Some(0.0),
            ..Default::default()
        };
        assert!(Generator::new(bad, 0, 1, |c: GenContext| c.seq).is_err());
        assert!(Generator::new(GeneratorConfig::default(), 2, 2, |c: GenContext| c.seq).is_err());
    }
}
