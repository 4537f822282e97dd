//! Text records written without `core::fmt`: comma-separated fields of
//! integers and strings, for the encode functions of the line sinks.
//!
//! A sink's encode function runs on the worker for every record, so its
//! cost is the sink's throughput. `writeln!(out, "{},{},{}", a, b, c)`
//! goes through `core::fmt`: a dynamically dispatched writer per piece,
//! padding logic per integer. In the keyed benchmark with the direct file
//! sink (`weir bench --pipeline keyed --sink direct`, closed loop, two
//! workers) that formatting takes more than half of each worker's time
//! (docs/notebook/benchmarks-2026-12.md, "Sinks' encode on the worker:
//! integers without `core::fmt`"). [`Line`] writes integers with `itoa`
//! straight into the sink's buffer: no formatter, no allocation once the
//! buffer has grown.
//!
//! ```
//! use weir_io::text::Line;
//! let mut out = Vec::new();
//! Line::new(&mut out).u64(7).i64(-3).str("k").end();
//! Line::new(&mut out).u64(1).done();
//! assert_eq!(out, b"7,-3,k\n1");
//! ```

/// One record's fields, appended to a buffer with a `,` between them.
///
/// Every method but [`Line::end`] and [`Line::done`] returns the line, so
/// that a record reads as one expression; the line must be finished with
/// one of the two (the builder is `#[must_use]`).
#[must_use = "finish the line with `end()` (newline) or `done()`"]
#[derive(Debug)]
pub struct Line<'a> {
    out: &'a mut Vec<u8>,
    /// Whether a field was written: the next one needs a separator.
    any: bool,
}

impl<'a> Line<'a> {
    /// A line appended to `out`, after what `out` already holds.
    #[inline]
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Line { out, any: false }
    }

    #[inline(always)]
    fn sep(&mut self) {
        if self.any {
            self.out.push(b',');
        }
        self.any = true;
    }

    /// An unsigned integer field, in decimal.
    #[inline]
    pub fn u64(self, v: u64) -> Self {
        self.int(v)
    }

    /// A signed integer field, in decimal (`-` before a negative one).
    #[inline]
    pub fn i64(self, v: i64) -> Self {
        self.int(v)
    }

    #[inline(always)]
    fn int(mut self, v: impl itoa::Integer) -> Self {
        self.sep();
        self.out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        self
    }

    /// A text field, written as it is: no quoting or escaping, so a
    /// string holding a `,` or a newline makes a line that reads back as
    /// other fields. Use it for keys the input already split on those.
    #[inline]
    pub fn str(self, s: &str) -> Self {
        self.bytes(s.as_bytes())
    }

    /// A field of raw bytes, written as they are (as [`Line::str`]).
    #[inline]
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.sep();
        self.out.extend_from_slice(b);
        self
    }

    /// Ends the line with `\n`.
    #[inline]
    pub fn end(self) {
        self.out.push(b'\n');
    }

    /// Ends the record without a newline (a Kafka value, a framed record).
    #[inline]
    pub fn done(self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_empty_line_is_a_newline() {
        let mut out = b"x".to_vec();
        Line::new(&mut out).end();
        assert_eq!(out, b"x\n");
    }

    #[test]
    fn extremes_are_written_in_full() {
        let mut out = Vec::new();
        Line::new(&mut out).u64(u64::MAX).i64(i64::MIN).u64(0).end();
        assert_eq!(out, format!("{},{},0\n", u64::MAX, i64::MIN).into_bytes());
    }

    proptest! {
        /// The same bytes as `writeln!`, whatever the values.
        #[test]
        fn the_same_as_core_fmt(a: u64, b: i64, s in "[a-z0-9_]{0,12}", tail: bool) {
            use std::io::Write;
            let mut fast = Vec::new();
            let line = Line::new(&mut fast).str(&s).u64(a).i64(b);
            let mut slow = Vec::new();
            if tail {
                line.end();
                writeln!(slow, "{s},{a},{b}").unwrap();
            } else {
                line.done();
                write!(slow, "{s},{a},{b}").unwrap();
            }
            prop_assert_eq!(fast, slow);
        }
    }
}
