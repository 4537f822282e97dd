//! The scaling model of docs/design/scaling.md, fitted to a keyed sweep's
//! one- and two-worker figures of the same run (`weir bench --pipeline
//! keyed --parallelism 1,2`), and what it projects for 8, 32 and 64 cores:
//! a 2-core machine cannot show what a larger one would, so a model fitted
//! to its 1- and 2-core figures says it.
//!
//! With P workers on P cores, each worker spends per event:
//! - `t1`: generate, state update, sink; all of one worker's cost at
//!   P = 1, where the exchange has one target on the same worker, so it
//!   computes no key and hands each batch over by reference;
//! - `h` once P > 1: the exchange's routing (stable hash, key group,
//!   target), measured alone in the same run (`parts_probe::route_ns`);
//! - `r` once P > 1: each record's trip through a ring, staged, copied
//!   in and copied out, which one worker does not make; the one-core ring
//!   probe measured before the one-worker run (`parts_probe`);
//! - `c * (P-1)/P`: the crossing; a record goes to another core's keyed
//!   subtask with probability (P-1)/P, and its consumer then reads lines
//!   the producer's core wrote;
//! - `f * (P-1)/B`: the chunks; a source batch of B records is split over
//!   P rings, P-1 of them to other cores, and each such chunk costs `f`
//!   (the consumer misses on the producer's new tail index, the producer
//!   on the consumer's new head: two one-way handoffs).
//!
//! `T(P) = P / (t1 + h + r + c*(P-1)/P + f*(P-1)/B)` events/s (no `h`
//! or `r` at P = 1). One worker gives `t1 = 1/T(1)`; two give
//! `c = 2 * (2/T(2) - t1 - h - r - f/B)`; `f` is twice the one-way handoff
//! measured in the same run (`handoff_probe`). The model
//! leaves out what grows only on larger machines (the P² rings outgrowing
//! the caches, key-group skew, NUMA), so its projections are upper bounds.

use serde::Serialize;

/// The model's parameters, fitted to one run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Model {
    /// Events/s of the whole job with one worker (measured).
    pub one_worker_events_per_sec: f64,
    /// Events/s of the whole job with two workers (measured).
    pub two_workers_events_per_sec: f64,
    /// Source batch size B, records.
    pub batch: usize,
    /// One-way handoff between cores 0 and 1, ns (measured).
    pub handoff_ns: f64,
    /// `h`: the exchange's routing per record when it has more than one
    /// target, ns (measured).
    pub route_ns: f64,
    /// `r`: a record's trip through a ring when there is more than one
    /// worker (one worker hands batches over by reference), ns (measured:
    /// the one-core ring probe; 0 when not measured).
    pub ring_ns: f64,
    /// `t1`: one worker's time per event, ns.
    pub t1_ns: f64,
    /// `c`: the crossing's cost per record that crosses, ns.
    pub crossing_ns: f64,
    /// `f`: the cost of one chunk to another core, ns (twice the handoff).
    pub chunk_ns: f64,
    /// The one-way handoff measured just before the two-worker run (its
    /// parts), when known. This guest's path between cores runs at 34-43
    /// or 150-196 ns; a handoff that differs by more than
    /// [`STATE_CHANGE`] times from `handoff_ns` (measured after the runs)
    /// says the host changed state around the two-worker run, and the fit
    /// mixes the two states.
    pub handoff_before_ns: Option<f64>,
}

/// The ratio between the handoffs before and after the two-worker run
/// beyond which the host is taken to have changed state (its two states
/// differ by 4-5x; one state's readings by under 1.5x).
pub const STATE_CHANGE: f64 = 2.0;

/// What the model gives for one number of cores.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Projection {
    /// Cores, one worker each.
    pub cores: usize,
    /// Events/s of the whole job.
    pub events_per_sec: f64,
    /// `T(P) / (P * T(1))`.
    pub efficiency: f64,
    /// The routing's share of a worker's time per event, ns (0 on one core).
    pub route_ns: f64,
    /// The rings' share of a worker's time per event, ns (0 on one core).
    pub ring_ns: f64,
    /// The crossing's share of a worker's time per event, ns.
    pub crossing_ns: f64,
    /// The chunks' share of a worker's time per event, ns.
    pub chunks_ns: f64,
}

/// The core counts `weir bench` prints projections for.
pub const PROJECTED_CORES: [usize; 3] = [8, 32, 64];

impl Model {
    /// Fits the model to the job's events/s with one worker (`one`) and
    /// two (`two`), batches of `batch` records, a one-way handoff of
    /// `handoff_ns`, routing of `route_ns` and a ring trip of `ring_ns`
    /// per record. `None` unless every input is positive and finite (the
    /// routing and the ring trip may be 0).
    ///
    /// The crossing cost comes out negative when two workers ran more
    /// than twice as fast per core as the model allows: the two runs then
    /// do not fit the model (the machine's speed changed between them),
    /// which [`Model::fits`] says.
    pub fn fit(one: f64, two: f64, batch: usize, handoff_ns: f64, route_ns: f64, ring_ns: f64) -> Option<Model> {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        let ok0 = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(one) && ok(two) && ok(handoff_ns) && ok0(route_ns) && ok0(ring_ns)) || batch == 0 {
            return None;
        }
        let chunk_ns = 2.0 * handoff_ns;
        let t1_ns = 1e9 / one;
        let crossing_ns = 2.0 * (2e9 / two - t1_ns - route_ns - ring_ns - chunk_ns / batch as f64);
        Some(Model {
            one_worker_events_per_sec: one,
            two_workers_events_per_sec: two,
            batch,
            handoff_ns,
            route_ns,
            ring_ns,
            t1_ns,
            crossing_ns,
            chunk_ns,
            handoff_before_ns: None,
        })
    }

    /// The model with the handoff measured just before the two-worker run.
    pub fn with_handoff_before(mut self, handoff_ns: Option<f64>) -> Model {
        self.handoff_before_ns = handoff_ns.filter(|h| h.is_finite() && *h > 0.0);
        self
    }

    /// True when the handoffs before and after the two-worker run differ
    /// by more than [`STATE_CHANGE`] times.
    pub fn state_changed(&self) -> bool {
        self.handoff_before_ns.is_some_and(|b| {
            let (lo, hi) = (b.min(self.handoff_ns), b.max(self.handoff_ns));
            hi > STATE_CHANGE * lo
        })
    }

    /// True when the fitted costs are all non-negative and the host kept
    /// its state around the two-worker run.
    pub fn fits(&self) -> bool {
        self.crossing_ns >= 0.0 && !self.state_changed()
    }

    /// The model at `cores` cores (at least 1).
    pub fn at(&self, cores: usize) -> Projection {
        let p = cores.max(1) as f64;
        let route_ns = if cores > 1 { self.route_ns } else { 0.0 };
        let ring_ns = if cores > 1 { self.ring_ns } else { 0.0 };
        let crossing_ns = self.crossing_ns * (p - 1.0) / p;
        let chunks_ns = self.chunk_ns * (p - 1.0) / self.batch as f64;
        let per_event_ns = self.t1_ns + route_ns + ring_ns + crossing_ns + chunks_ns;
        let events_per_sec = p * 1e9 / per_event_ns;
        Projection {
            cores: cores.max(1),
            events_per_sec,
            efficiency: events_per_sec / (p * self.one_worker_events_per_sec),
            route_ns,
            ring_ns,
            crossing_ns,
            chunks_ns,
        }
    }

    /// The lines `weir bench` prints under a sweep over 1 and 2 workers.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "scaling model (docs/design/scaling.md), fitted to this run's p=1 and p=2, a one-way \
             handoff of {:.0} ns, routing of {:.2} ns and a ring trip of {:.2} ns per record measured \
             now: t1 {:.2} ns per event, crossing {:.2} ns per record that crosses, {:.0} ns per chunk \
             of B = {}",
            self.handoff_ns, self.route_ns, self.ring_ns, self.t1_ns, self.crossing_ns, self.chunk_ns, self.batch
        );
        if let (true, Some(before)) = (self.state_changed(), self.handoff_before_ns) {
            s.push_str(&format!(
                "\n    not fitted: the host changed state around the two-worker run (a one-way handoff \
                 of {before:.0} ns just before it, {:.0} ns after): its events/s mix the two states; \
                 run the sweep again",
                self.handoff_ns
            ));
            return s;
        }
        if !self.fits() {
            s.push_str(&format!(
                "\n    not fitted: two workers ran {:.2}x one, more than the model allows with this \
                 handoff, routing and ring trip (the crossing cost comes out negative); a machine whose speed \
                 drifts between the two runs does this: run the sweep again",
                self.two_workers_events_per_sec / self.one_worker_events_per_sec
            ));
            return s;
        }
        for p in PROJECTED_CORES {
            let x = self.at(p);
            s.push_str(&format!(
                "\n    {} cores: {:.0} M ev/s at most, efficiency {:.2} (routing {:.1} ns, rings {:.1} ns, \
                 crossing {:.1} ns, chunks {:.1} ns per event per worker)",
                p,
                x.events_per_sec / 1e6,
                x.efficiency,
                x.route_ns,
                x.ring_ns,
                x.crossing_ns,
                x.chunks_ns
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
    }

    /// 100 M ev/s on one worker is 10 ns per event; 160 M on two is
    /// 12.5 ns per event per worker, of which 1.5 ns is the routing,
    /// f/B = 400/1000 = 0.4 ns the chunks and the rest, 0.6 ns, half the
    /// crossing.
    #[test]
    fn fits_a_worked_example() {
        let m = Model::fit(100e6, 160e6, 1000, 200.0, 1.5, 0.0).unwrap();
        assert!(close(m.t1_ns, 10.0));
        assert!(close(m.chunk_ns, 400.0));
        assert!(close(m.crossing_ns, 1.2), "{}", m.crossing_ns);
        assert!(m.fits());
        assert_eq!(m.at(1).route_ns, 0.0);
        assert_eq!(m.at(2).route_ns, 1.5);
        let at64 = m.at(64);
        let expected = 64e9 / (10.0 + 1.5 + 1.2 * 63.0 / 64.0 + 400.0 * 63.0 / 1000.0);
        assert!(close(at64.events_per_sec, expected));
        assert!(m.describe().contains("64 cores"));
    }

    /// With a ring trip of 1 ns that two workers pay and one does not:
    /// 140 M ev/s on two is 14.29 ns per event per worker, of which 1.5 is
    /// the routing, 1 the rings and 0.4 the chunks; the rest, 1.39 ns, is
    /// half the crossing. Every core count above one pays the rings.
    #[test]
    fn charges_the_rings_to_more_than_one_worker() {
        let m = Model::fit(100e6, 140e6, 1000, 200.0, 1.5, 1.0).unwrap();
        let crossing = 2.0 * (2e9 / 140e6 - 10.0 - 1.5 - 1.0 - 0.4);
        assert!(close(m.crossing_ns, crossing), "{}", m.crossing_ns);
        assert_eq!(m.at(1).ring_ns, 0.0);
        assert_eq!(m.at(8).ring_ns, 1.0);
        assert!(close(m.at(2).events_per_sec, 140e6));
        let at64 = m.at(64);
        let expected = 64e9 / (10.0 + 1.5 + 1.0 + crossing * 63.0 / 64.0 + 400.0 * 63.0 / 1000.0);
        assert!(close(at64.events_per_sec, expected));
        assert!(m.describe().contains("ring trip of 1.00 ns"));
        assert_eq!(Model::fit(100e6, 140e6, 1000, 200.0, 1.5, -1.0), None);
    }

    #[test]
    fn rejects_what_cannot_be_fitted() {
        assert_eq!(Model::fit(0.0, 1.0, 1, 1.0, 0.0, 0.0), None);
        assert_eq!(Model::fit(1.0, f64::NAN, 1, 1.0, 0.0, 0.0), None);
        assert_eq!(Model::fit(1.0, 1.0, 0, 1.0, 0.0, 0.0), None);
        assert_eq!(Model::fit(1.0, 1.0, 1, 0.0, 0.0, 0.0), None);
        assert_eq!(Model::fit(1.0, 1.0, 1, 1.0, -1.0, 0.0), None);
        assert_eq!(Model::fit(1.0, 1.0, 1, 1.0, 0.0, f64::INFINITY), None);
        // Two workers at 1.9x one with 1 ns of routing: a negative crossing.
        let m = Model::fit(100e6, 190e6, 1024, 200.0, 1.0, 0.0).unwrap();
        assert!(!m.fits());
        assert!(m.describe().contains("run the sweep again"));
        assert!(!m.describe().contains("64 cores"));
    }

    /// Handoffs of 36 ns before the two-worker run and 165 ns after it:
    /// the host changed state, so nothing is projected; 36 and 41 ns is
    /// one state.
    #[test]
    fn a_state_change_around_the_two_worker_run_is_not_fitted() {
        let m = Model::fit(90e6, 145e6, 1024, 165.0, 0.95, 0.0).unwrap();
        assert!(m.fits() && !m.state_changed());
        let changed = m.with_handoff_before(Some(36.0));
        assert!(changed.state_changed() && !changed.fits());
        let d = changed.describe();
        assert!(d.contains("changed state") && d.contains("36 ns just before"), "{d}");
        assert!(!d.contains("64 cores"));
        let same = Model::fit(90e6, 145e6, 1024, 41.0, 0.95, 0.0)
            .unwrap()
            .with_handoff_before(Some(36.0));
        assert!(same.fits() && same.describe().contains("64 cores"));
        assert_eq!(m.with_handoff_before(Some(f64::NAN)).handoff_before_ns, None);
    }

    proptest! {
        /// The fitted model gives back the two measured figures, and its
        /// efficiency falls as cores are added (when it fits).
        #[test]
        fn reproduces_its_inputs(
            one in 1e6f64..1e9,
            ratio in 1.0f64..2.0,
            batch in 1usize..8192,
            handoff in 10.0f64..2000.0,
            route in 0.0f64..5.0,
            ring in 0.0f64..5.0,
        ) {
            let two = one * ratio;
            let m = Model::fit(one, two, batch, handoff, route, ring).unwrap();
            prop_assert!(close(m.at(1).events_per_sec, one));
            prop_assert!(close(m.at(2).events_per_sec, two));
            if m.fits() {
                let e: Vec<f64> = [2, 8, 32, 64].iter().map(|&p| m.at(p).efficiency).collect();
                prop_assert!(e.windows(2).all(|w| w[1] <= w[0] + 1e-9), "{e:?}");
            }
        }
    }
}
