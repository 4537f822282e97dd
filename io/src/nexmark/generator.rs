//! The deterministic Nexmark event generator.
//!
//! This module exists so that every Nexmark run (in-process source, event
//! files, reference results) sees the same events: event number `n` is a
//! pure function of the [`NexmarkConfig`] and `n`, so a stream split over
//! any number of parallel subtasks is the same set of events, and a file
//! written today can be regenerated bit for bit.
//!
//! It follows the public Nexmark generator (nexmark-flink's
//! `GeneratorConfig`, `PersonGenerator`, `AuctionGenerator`,
//! `BidGenerator`):
//!
//! - Events come in blocks of 50: `n % 50 == 0` is a person, `1..=3` are
//!   auctions, the other 46 are bids.
//! - Person and auction ids are derived from `n` and start at 1000: the
//!   person of block `b` has id `1000 + b`, its auctions `1000 + 3b + 0..3`.
//! - A seller is, with probability `1 - 1/hot_sellers_ratio`, the hot seller
//!   (the first person of the latest batch of 100 people), else a random one
//!   of the last `num_active_people` people. Bids go, with probability
//!   `1 - 1/hot_auction_ratio`, to the hot auction (the first of the latest
//!   batch of 100 auctions), else to a random one of the last
//!   `num_in_flight_auctions`; bidders likewise (the hot bidder is the second
//!   person of the latest batch of 100 people).
//! - Prices are `round(100 * 10^(6u))` cents for uniform `u` in `[0, 1)`;
//!   auctions have category `10 + random(5)` and last `1 + random(2h)` ms,
//!   where `h` is the event-time span of the next `num_in_flight_auctions`
//!   auctions; half of the bids come through one of four hot channels, the
//!   rest through `channel-<k>` for `k` in `0..10000`, each with a URL.
//!
//! Deliberate differences from the reference:
//!
//! - The reference may pick a person or auction id up to 10 ahead of the
//!   latest one (its "id lead"), which makes some auctions name a seller, and
//!   some bids an auction, that does not exist yet. Here every seller,
//!   bidder and bid auction already exists when the event refers to it: ids
//!   are picked among existing ones only, and the hot bidder is capped at the
//!   latest person.
//! - Time is exact integer math: event `n` happens at
//!   `base_time_ms + n * 1000 / events_per_second` (floor), so times never
//!   decrease with `n`; there is no out-of-order grouping.
//! - Strings come from pools built once per process, and shared by every
//!   generator, from a fixed vocabulary seed (names, e-mails, credit cards,
//!   item names, descriptions, padding, channels and URLs); the
//!   configuration's seed picks among them. An event holds pointers into
//!   them ([`Text::Pooled`]), so its strings cost no allocation and no
//!   reference count. The padding (`extra`) has the reference's lengths
//!   (records of about 200, 500 and 100 bytes) but comes from a pool of 256
//!   strings per type.
//! - Random choices come from a SplitMix64 stream seeded by `(seed, n)`, and
//!   prices are computed in fixed point and plain IEEE arithmetic (no
//!   `libm`), so the same configuration gives the same events on every
//!   IEEE-754 platform.

use std::sync::OnceLock;

use super::model::{Auction, Bid, Event, Person, Text};
use crate::generator::splitmix64;
use crate::{Error, Result};

/// Persons per block of [`TOTAL_PROPORTION`] events.
pub const PERSON_PROPORTION: u64 = 1;
/// Auctions per block.
pub const AUCTION_PROPORTION: u64 = 3;
/// Bids per block.
pub const BID_PROPORTION: u64 = 46;
/// Events per block.
pub const TOTAL_PROPORTION: u64 = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION;
/// Id of the first person.
pub const FIRST_PERSON_ID: u64 = 1000;
/// Id of the first auction.
pub const FIRST_AUCTION_ID: u64 = 1000;
/// Lowest category id.
pub const FIRST_CATEGORY_ID: u64 = 10;
/// Number of categories: ids `10..15`.
pub const NUM_CATEGORIES: u64 = 5;
/// Default event time of event 0: 2023-11-14T22:13:20Z, a multiple of 10 s.
pub const DEFAULT_BASE_TIME_MS: i64 = 1_700_000_000_000;

/// Hot sellers, bidders and auctions are the first (bidders: second) of the
/// latest batch of this many people or auctions.
const HOT_BATCH: u64 = 100;
/// One bid in this many comes through a cold channel.
const HOT_CHANNELS_RATIO: u32 = 2;
/// Number of cold channels.
const CHANNELS_NUMBER: usize = 10_000;
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const FIRST_NAMES: [&str; 11] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: [&str; 9] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
/// Seed of the string pools: fixed, so pools are the same for every config.
const VOCABULARY_SEED: u64 = 0x6e65_786d_6172_6b21;
/// Entries in each pool of random strings.
const POOL: usize = 1024;
/// Entries in each pool of padding strings.
const EXTRA_POOL: usize = 256;

/// Settings of the Nexmark generator. [`NexmarkConfig::default`] follows
/// the reference defaults (`NexmarkConfiguration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NexmarkConfig {
    /// Seed of the per-event random choices.
    pub seed: u64,
    /// Event-time rate: event `n` happens at
    /// `base_time_ms + n * 1000 / events_per_second`. Not a wall-clock rate.
    pub events_per_second: u64,
    /// Event time of event 0, epoch milliseconds.
    pub base_time_ms: i64,
    /// Sellers and cold bidders are picked among this many latest people.
    pub num_active_people: u32,
    /// Cold bids go to one of this many latest auctions; also sets the
    /// average auction length.
    pub num_in_flight_auctions: u32,
    /// One bid in this many goes to a cold auction, the others to the hot one.
    pub hot_auction_ratio: u32,
    /// One auction in this many has a cold seller.
    pub hot_sellers_ratio: u32,
    /// One bid in this many has a cold bidder.
    pub hot_bidders_ratio: u32,
}

impl Default for NexmarkConfig {
    fn default() -> Self {
        NexmarkConfig {
            seed: 0,
            events_per_second: 10_000,
            base_time_ms: DEFAULT_BASE_TIME_MS,
            num_active_people: 1000,
            num_in_flight_auctions: 100,
            hot_auction_ratio: 2,
            hot_sellers_ratio: 4,
            hot_bidders_ratio: 4,
        }
    }
}

impl NexmarkConfig {
    /// Checks every setting: rates, counts and ratios positive, base time
    /// not negative.
    pub fn validate(&self) -> Result<()> {
        let positive: [(&'static str, u64); 6] = [
            ("events_per_second", self.events_per_second),
            ("num_active_people", self.num_active_people.into()),
            ("num_in_flight_auctions", self.num_in_flight_auctions.into()),
            ("hot_auction_ratio", self.hot_auction_ratio.into()),
            ("hot_sellers_ratio", self.hot_sellers_ratio.into()),
            ("hot_bidders_ratio", self.hot_bidders_ratio.into()),
        ];
        for (setting, value) in positive {
            if value == 0 {
                return Err(Error::InvalidConfig {
                    setting,
                    value: value.to_string(),
                    reason: "must be at least 1",
                });
            }
        }
        if self.base_time_ms < 0 {
            return Err(Error::InvalidConfig {
                setting: "base_time_ms",
                value: self.base_time_ms.to_string(),
                reason: "must be an epoch time in milliseconds, at least 0",
            });
        }
        Ok(())
    }

    /// Event time of event `n`: `base_time_ms + n * 1000 / events_per_second`,
    /// exact (saturating at `i64::MAX`, which no real run reaches).
    #[inline]
    pub fn timestamp(&self, n: u64) -> i64 {
        let offset = match n.checked_mul(1000) {
            Some(ms) => ms / self.events_per_second,
            None => u64::try_from(u128::from(n) * 1000 / u128::from(self.events_per_second)).unwrap_or(u64::MAX),
        };
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        self.base_time_ms.saturating_add(offset)
    }
}

/// What event number `n` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A person (`n % 50 == 0`).
    Person,
    /// An auction (`n % 50` in `1..=3`).
    Auction,
    /// A bid (the rest).
    Bid,
}

/// The kind of event number `n`.
#[inline]
pub fn event_kind(n: u64) -> EventKind {
    let offset = n % TOTAL_PROPORTION;
    if offset < PERSON_PROPORTION {
        EventKind::Person
    } else if offset < PERSON_PROPORTION + AUCTION_PROPORTION {
        EventKind::Auction
    } else {
        EventKind::Bid
    }
}

/// Id of the latest person at event `n` (the new person's id if `n` is one).
#[inline]
pub fn last_person_id(n: u64) -> u64 {
    FIRST_PERSON_ID + last_base0_person_id(n)
}

/// Id of the latest auction at event `n` (the new auction's id if `n` is
/// one); `None` before the first auction (event 0).
#[inline]
pub fn last_auction_id(n: u64) -> Option<u64> {
    (n > 0).then(|| FIRST_AUCTION_ID + last_base0_auction_id(n))
}

#[inline]
fn last_base0_person_id(n: u64) -> u64 {
    // One person per block, first in it: the latest is the one of n's block.
    const _: () = assert!(PERSON_PROPORTION == 1);
    n / TOTAL_PROPORTION
}

/// Only meaningful for `n >= 1`: event 0 is a person and no auction exists.
#[inline]
fn last_base0_auction_id(n: u64) -> u64 {
    let epoch = n / TOTAL_PROPORTION;
    let offset = n % TOTAL_PROPORTION;
    if offset < PERSON_PROPORTION {
        // A person: the last auction of the previous block.
        (epoch * AUCTION_PROPORTION).saturating_sub(1)
    } else if offset >= PERSON_PROPORTION + AUCTION_PROPORTION {
        // A bid: the last auction of this block.
        epoch * AUCTION_PROPORTION + AUCTION_PROPORTION - 1
    } else {
        epoch * AUCTION_PROPORTION + offset - PERSON_PROPORTION
    }
}

/// SplitMix64 stream seeded by `(seed, n)`.
struct Rng(u64);

impl Rng {
    #[inline]
    fn new(seed_mix: u64, n: u64) -> Self {
        Rng(splitmix64(n ^ seed_mix))
    }

    #[inline]
    fn next_u64(&mut self) -> u64 {
        let r = splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        r
    }

    /// Uniform in `0..n` (`0` for `n == 0`), by multiply-shift.
    #[inline]
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Two independent 32-bit draws from one word.
    #[inline]
    fn pair(&mut self) -> (u32, u32) {
        let w = self.next_u64();
        (w as u32, (w >> 32) as u32)
    }

    /// A price in cents: `round(100 * 10^(6u))`, in `100..=100_000_000`.
    #[inline]
    fn price(&mut self, pow2: &Pow2) -> u64 {
        // Rounds half up: the value is positive, and `as` truncates.
        (100.0 * pow2.ten_to_6u(self.next_u64()) + 0.5) as i64 as u64
    }

    /// The reference's `nextString`: `3 + random(max_len - 3)` characters,
    /// each `space` with probability 1/13, else a lowercase letter; trimmed
    /// of spaces.
    fn string(&mut self, max_len: u64, space: char) -> String {
        let len = 3 + self.below(max_len - 3);
        let s: String = (0..len)
            .map(|_| {
                if self.below(13) == 0 {
                    space
                } else {
                    char::from(b'a' + self.below(26) as u8)
                }
            })
            .collect();
        s.trim_matches(' ').to_string()
    }

    /// The reference's `nextExtra`: lowercase padding so that a record of
    /// `current` bytes is `average` bytes on average.
    fn extra(&mut self, current: u64, average: u64) -> String {
        if current > average {
            return String::new();
        }
        let wanted = average - current;
        let delta = (wanted as f64 * 0.2).round() as u64;
        let len = wanted - delta + if delta == 0 { 0 } else { self.below(2 * delta) };
        (0..len).map(|_| char::from(b'a' + self.below(26) as u8)).collect()
    }
}

/// `round(6 * log2(10) * 2^59)`: `6 * log2(10)` in fixed point.
const SIX_LOG2_10_Q59: u64 = 0x9f73_da38_d9d4_a83f;

/// `10^(6u)` for uniform `u` in plain IEEE arithmetic (no libm, so the
/// same bits on every platform), several times faster than `exp`.
///
/// `10^(6u) = 2^y` with `y = 6 * log2(10) * u` in `[0, 19.94)`, computed in
/// fixed point from the random bits: `2^floor(y)` exactly, times `2^(j/64)`
/// for the next 6 bits of `y` from a table, times a degree-5 polynomial of
/// `exp` for the remaining `r < 1/64` (relative error below 1e-14).
struct Pow2 {
    /// `2^(j/64)` for `j` in `0..64`.
    sixty_fourths: [f64; 64],
}

impl Pow2 {
    fn new() -> Self {
        let mut sixty_fourths = [0.0; 64];
        for (j, t) in sixty_fourths.iter_mut().enumerate() {
            // exp(x) by its Taylor series: x < ln 2, 30 terms are exact to
            // the last bit.
            let x = j as f64 / 64.0 * std::f64::consts::LN_2;
            let (mut term, mut sum) = (1.0f64, 1.0f64);
            for k in 1..30 {
                term *= x / k as f64;
                sum += term;
            }
            *t = sum;
        }
        Pow2 { sixty_fourths }
    }

    /// `10^(6u)` for `u = bits / 2^64`.
    #[inline]
    fn ten_to_6u(&self, bits: u64) -> f64 {
        // y * 2^59, below 2^64.
        let y = ((u128::from(bits) * u128::from(SIX_LOG2_10_Q59)) >> 64) as u64;
        let whole = y >> 59;
        let j = ((y >> 53) & 63) as usize;
        // The low 53 bits are exact in an f64.
        let r = (y & ((1 << 53) - 1)) as i64 as f64 * (std::f64::consts::LN_2 / (1u64 << 59) as f64);
        // exp(r) for r < ln(2) / 64.
        let poly = 1.0 + r * (1.0 + r * (1.0 / 2.0 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0)))));
        self.sixty_fourths[j] * poly * f64::from_bits((1023 + whole) << 52)
    }
}

/// A pool string, kept for the process's lifetime: pools are built once
/// per process (see [`pools`]), so this leaks a bounded set.
fn leak(s: impl Into<String>) -> &'static str {
    Box::leak(s.into().into_boxed_str())
}

/// The pools, built on first use and shared by every generator: they depend
/// on nothing but the fixed vocabulary seed.
fn pools() -> &'static Pools {
    static POOLS: OnceLock<Pools> = OnceLock::new();
    POOLS.get_or_init(Pools::new)
}

/// The shared strings events are made of.
struct Pools {
    names: Vec<&'static str>,
    emails: Vec<&'static str>,
    credit_cards: Vec<&'static str>,
    cities: Vec<&'static str>,
    states: Vec<&'static str>,
    item_names: Vec<&'static str>,
    descriptions: Vec<&'static str>,
    person_extras: Vec<&'static str>,
    auction_extras: Vec<&'static str>,
    bid_extras: Vec<&'static str>,
    hot_channels: Vec<(&'static str, &'static str)>,
    channels: Vec<(&'static str, &'static str)>,
    pow2: Pow2,
}

impl Pools {
    fn new() -> Self {
        let mut r = Rng(VOCABULARY_SEED);
        let names = FIRST_NAMES
            .iter()
            .flat_map(|f| LAST_NAMES.iter().map(move |l| leak(format!("{f} {l}"))))
            .collect();
        let emails = (0..POOL)
            .map(|_| leak(format!("{}@{}.com", r.string(7, ' '), r.string(5, ' '))))
            .collect();
        let credit_cards = (0..POOL)
            .map(|_| {
                let g: Vec<String> = (0..4).map(|_| format!("{:04}", r.below(10_000))).collect();
                leak(g.join(" "))
            })
            .collect();
        let item_names = (0..POOL).map(|_| leak(r.string(20, ' '))).collect();
        let descriptions = (0..POOL).map(|_| leak(r.string(100, ' '))).collect();
        // Average record sizes of the reference (avgPersonByteSize 200,
        // avgAuctionByteSize 500, avgBidByteSize 100) and the typical size
        // of the other fields it subtracts.
        let person_extras = (0..EXTRA_POOL).map(|_| leak(r.extra(64, 200))).collect();
        let auction_extras = (0..EXTRA_POOL).map(|_| leak(r.extra(108, 500))).collect();
        let bid_extras = (0..EXTRA_POOL).map(|_| leak(r.extra(32, 100))).collect();
        let base_url = |r: &mut Rng| {
            format!(
                "https://www.nexmark.com/{}/{}/{}/item.htm?query=1",
                r.string(5, '_'),
                r.string(5, '_'),
                r.string(5, '_')
            )
        };
        let hot_channels = HOT_CHANNELS.iter().map(|c| (*c, leak(base_url(&mut r)))).collect();
        let channels = (0..CHANNELS_NUMBER)
            .map(|k| {
                let mut url = base_url(&mut r);
                if r.below(10) > 0 {
                    url.push_str(&format!("&channel_id={}", (k as i32).reverse_bits().unsigned_abs()));
                }
                (leak(format!("channel-{k}")), leak(url))
            })
            .collect();
        Pools {
            names,
            emails,
            credit_cards,
            cities: US_CITIES.to_vec(),
            states: US_STATES.to_vec(),
            item_names,
            descriptions,
            person_extras,
            auction_extras,
            bid_extras,
            hot_channels,
            channels,
            pow2: Pow2::new(),
        }
    }
}

/// A Nexmark event factory: a validated [`NexmarkConfig`] and the process's
/// string pools. Generators with equal configs make equal events.
///
/// Every generator of the process shares one set of pools, built on first
/// use; events point into them.
///
/// ```
/// use weir_io::nexmark::{Event, NexmarkConfig, NexmarkGenerator};
/// let g = NexmarkGenerator::new(NexmarkConfig { seed: 7, ..Default::default() }).unwrap();
/// let Event::Person(p) = g.event(0) else { panic!("event 0 is a person") };
/// assert_eq!(p.id, 1000);
/// ```
pub struct NexmarkGenerator {
    cfg: NexmarkConfig,
    seed_mix: u64,
    pools: &'static Pools,
}

impl std::fmt::Debug for NexmarkGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NexmarkGenerator")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl NexmarkGenerator {
    /// A generator for `cfg`; fails if the config is invalid.
    pub fn new(cfg: NexmarkConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(NexmarkGenerator {
            cfg,
            seed_mix: splitmix64(cfg.seed),
            pools: pools(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &NexmarkConfig {
        &self.cfg
    }

    /// Event number `n`.
    #[inline]
    pub fn event(&self, n: u64) -> Event {
        make_event(&self.cfg, self.seed_mix, self.pools, n, self.cfg.timestamp(n))
    }

    /// Appends events `first, first + stride, ...`, `count` of them, to
    /// `out`: the same events as [`NexmarkGenerator::event`], made faster.
    ///
    /// Faster because it steps event times without a division.
    pub fn events_into(&self, first: u64, stride: u64, count: usize, out: &mut Vec<Event>) {
        let at = |i: usize| first.wrapping_add((i as u64).wrapping_mul(stride));
        // Event times without a division per event: the quotient and
        // remainder of n * 1000 / rate, stepped by stride * 1000.
        let mut clock = Clock::new(&self.cfg, first, stride);
        out.extend((0..count).map(|i| {
            let ts = clock.tick();
            make_event(&self.cfg, self.seed_mix, self.pools, at(i), ts)
        }));
    }
}

/// [`NexmarkConfig::timestamp`] of `first, first + stride, ...` in turn.
struct Clock {
    base: i64,
    rate: u64,
    /// `n * 1000 = quotient * rate + remainder` for the next n (the
    /// quotient saturating, where the time saturates anyway).
    quotient: u64,
    remainder: u64,
    step_quotient: u64,
    step_remainder: u64,
}

impl Clock {
    fn new(cfg: &NexmarkConfig, first: u64, stride: u64) -> Self {
        let rate = u128::from(cfg.events_per_second);
        let (start, step) = (u128::from(first) * 1000, u128::from(stride) * 1000);
        let saturate = |q: u128| u64::try_from(q).unwrap_or(u64::MAX);
        Clock {
            base: cfg.base_time_ms,
            rate: cfg.events_per_second,
            quotient: saturate(start / rate),
            remainder: (start % rate) as u64,
            step_quotient: saturate(step / rate),
            step_remainder: (step % rate) as u64,
        }
    }

    /// The time of the next event, then steps to the one after.
    #[inline]
    fn tick(&mut self) -> i64 {
        let ts = self
            .base
            .saturating_add(i64::try_from(self.quotient).unwrap_or(i64::MAX));
        // remainder + step_remainder >= rate, without overflow.
        let carry = self.remainder >= self.rate - self.step_remainder;
        self.remainder = if carry {
            self.remainder - (self.rate - self.step_remainder)
        } else {
            self.remainder + self.step_remainder
        };
        self.quotient = self
            .quotient
            .saturating_add(self.step_quotient)
            .saturating_add(u64::from(carry));
        ts
    }
}

/// Event number `n` of the stream configured by `cfg`: a pure function of
/// `(cfg, n)`. Uses process-wide string pools; for generating many events
/// on several threads, prefer one [`NexmarkGenerator`] per thread.
///
/// # Panics
/// If `cfg` is invalid ([`NexmarkConfig::validate`]).
pub fn event(cfg: &NexmarkConfig, n: u64) -> Event {
    static POOLS: OnceLock<Pools> = OnceLock::new();
    if let Err(e) = cfg.validate() {
        panic!("nexmark::event: {e}");
    }
    make_event(
        cfg,
        splitmix64(cfg.seed),
        POOLS.get_or_init(Pools::new),
        n,
        cfg.timestamp(n),
    )
}

#[inline]
fn make_event(cfg: &NexmarkConfig, seed_mix: u64, pools: &'static Pools, n: u64, ts: i64) -> Event {
    let mut r = Rng::new(seed_mix, n);
    match event_kind(n) {
        EventKind::Person => Event::Person(person(pools, &mut r, n, ts)),
        EventKind::Auction => Event::Auction(auction(cfg, pools, &mut r, n, ts)),
        EventKind::Bid => Event::Bid(bid(cfg, pools, &mut r, n, ts)),
    }
}

/// Uniform in `0..n` from 32 random bits, by multiply-shift (bias below
/// `n / 2^32`, negligible for the ranges used here).
#[inline]
fn below32(bits: u32, n: u32) -> u32 {
    ((u64::from(bits) * u64::from(n)) >> 32) as u32
}

/// Picks from a pool with 32 random bits.
#[inline]
fn pick(bits: u32, pool: &'static [&'static str]) -> Text {
    Text::Pooled(&pool[below32(bits, pool.len() as u32) as usize])
}

/// A random existing person (base 0), among the last `num_active_people`.
#[inline]
fn cold_person(cfg: &NexmarkConfig, bits: u32, n: u64) -> u64 {
    let people = last_base0_person_id(n) + 1;
    let active = people.min(u64::from(cfg.num_active_people));
    people - active + u64::from(below32(bits, active as u32))
}

/// A random existing auction (base 0), among the last
/// `num_in_flight_auctions + 1`.
#[inline]
fn cold_auction(cfg: &NexmarkConfig, bits: u32, n: u64) -> u64 {
    let last = last_base0_auction_id(n);
    let first = last.saturating_sub(u64::from(cfg.num_in_flight_auctions));
    // At most num_in_flight_auctions + 1 <= 2^32 choices.
    first + ((u64::from(bits) * (last - first + 1)) >> 32)
}

#[inline(never)]
fn person(pools: &'static Pools, r: &mut Rng, n: u64, ts: i64) -> Person {
    let (name, email) = r.pair();
    let (card, city) = r.pair();
    let (state, extra) = r.pair();
    Person {
        id: last_person_id(n),
        name: pick(name, &pools.names),
        email_address: pick(email, &pools.emails),
        credit_card: pick(card, &pools.credit_cards),
        city: pick(city, &pools.cities),
        state: pick(state, &pools.states),
        date_time: ts,
        extra: pick(extra, &pools.person_extras),
    }
}

#[inline(never)]
fn auction(cfg: &NexmarkConfig, pools: &'static Pools, r: &mut Rng, n: u64, ts: i64) -> Auction {
    let (hot, cold) = r.pair();
    let seller = if below32(hot, cfg.hot_sellers_ratio) > 0 {
        (last_base0_person_id(n) / HOT_BATCH) * HOT_BATCH
    } else {
        cold_person(cfg, cold, n)
    };
    let initial_bid = r.price(&pools.pow2);
    let reserve = initial_bid + r.price(&pools.pow2);
    // Span of event time in which the next num_in_flight_auctions auctions
    // appear; auctions last 1 + random(2 * horizon) ms, horizon on average.
    let events_ahead = u64::from(cfg.num_in_flight_auctions) * TOTAL_PROPORTION / AUCTION_PROPORTION;
    let horizon = cfg.timestamp(n.saturating_add(events_ahead)) - ts;
    let length = 1 + r.below((horizon as u64).saturating_mul(2).max(1)) as i64;
    let (item_name, description) = r.pair();
    let (category, extra) = r.pair();
    Auction {
        id: FIRST_AUCTION_ID + last_base0_auction_id(n),
        item_name: pick(item_name, &pools.item_names),
        description: pick(description, &pools.descriptions),
        initial_bid,
        reserve,
        date_time: ts,
        expires: ts.saturating_add(length),
        seller: FIRST_PERSON_ID + seller,
        category: FIRST_CATEGORY_ID + u64::from(below32(category, NUM_CATEGORIES as u32)),
        extra: pick(extra, &pools.auction_extras),
    }
}

#[inline]
fn bid(cfg: &NexmarkConfig, pools: &'static Pools, r: &mut Rng, n: u64, ts: i64) -> Bid {
    let (channel, url) = match channel_choice(r.0) {
        Channel::Hot(i) => &pools.hot_channels[i],
        Channel::Cold(k) => &pools.channels[k],
    };
    let (hot, cold) = r.pair();
    let auction = if below32(hot, cfg.hot_auction_ratio) > 0 {
        (last_base0_auction_id(n) / HOT_BATCH) * HOT_BATCH
    } else {
        cold_auction(cfg, cold, n)
    };
    let (hot, cold) = r.pair();
    let bidder = if below32(hot, cfg.hot_bidders_ratio) > 0 {
        let last = last_base0_person_id(n);
        ((last / HOT_BATCH) * HOT_BATCH + 1).min(last)
    } else {
        cold_person(cfg, cold, n)
    };
    let price = r.price(&pools.pow2);
    let (extra, _) = r.pair();
    Bid {
        auction: FIRST_AUCTION_ID + auction,
        bidder: FIRST_PERSON_ID + bidder,
        price,
        channel: Text::Pooled(channel),
        url: Text::Pooled(url),
        date_time: ts,
        extra: pick(extra, &pools.bid_extras),
    }
}

/// A bid's channel: one of the hot ones, or cold channel `k`.
enum Channel {
    Hot(usize),
    Cold(usize),
}

/// A bid's channel, from the word that seeds its random stream (itself a
/// SplitMix64 output, independent of the stream's draws for all practical
/// purposes): so a batch finds it ahead of time with one mix.
#[inline]
fn channel_choice(seed_word: u64) -> Channel {
    let (hot, which) = (seed_word as u32, (seed_word >> 32) as u32);
    if below32(hot, HOT_CHANNELS_RATIO) > 0 {
        Channel::Hot(below32(which, HOT_CHANNELS.len() as u32) as usize)
    } else {
        Channel::Cold(below32(which, CHANNELS_NUMBER as u32) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(seed: u64) -> NexmarkConfig {
        NexmarkConfig {
            seed,
            ..Default::default()
        }
    }

    #[test]
    fn an_event_is_a_function_of_config_and_number() {
        let a = NexmarkGenerator::new(cfg(5)).unwrap();
        let b = NexmarkGenerator::new(cfg(5)).unwrap();
        for n in (0..3000).chain([1 << 20, 1 << 40, u64::MAX / 2]) {
            let e = a.event(n);
            assert_eq!(e, b.event(n), "n={n}");
            assert_eq!(e, event(&cfg(5), n), "n={n}");
        }
        // Generating out of order changes nothing.
        let forward: Vec<_> = (0..500).map(|n| a.event(n)).collect();
        let backward: Vec<_> = (0..500).rev().map(|n| b.event(n)).collect();
        assert!(forward.iter().eq(backward.iter().rev()));
        // The seed matters.
        let other = NexmarkGenerator::new(cfg(6)).unwrap();
        let differing = (0..500).filter(|&n| a.event(n) != other.event(n)).count();
        assert!(differing > 450, "only {differing} of 500 events differ between seeds");
    }

    #[test]
    fn blocks_of_fifty_hold_one_person_three_auctions_and_46_bids() {
        let g = NexmarkGenerator::new(cfg(1)).unwrap();
        let (mut p, mut a, mut b) = (0, 0, 0);
        for n in 0..5000u64 {
            let e = g.event(n);
            let expected = match n % 50 {
                0 => EventKind::Person,
                1..=3 => EventKind::Auction,
                _ => EventKind::Bid,
            };
            assert_eq!(event_kind(n), expected);
            match e {
                Event::Person(_) => p += 1,
                Event::Auction(_) => a += 1,
                Event::Bid(_) => b += 1,
            }
            let kind = match g.event(n) {
                Event::Person(_) => EventKind::Person,
                Event::Auction(_) => EventKind::Auction,
                Event::Bid(_) => EventKind::Bid,
            };
            assert_eq!(kind, expected, "n={n}");
        }
        assert_eq!((p, a, b), (100, 300, 4600));
    }

    #[test]
    fn ids_count_up_from_1000() {
        let g = NexmarkGenerator::new(cfg(2)).unwrap();
        let mut people = Vec::new();
        let mut auctions = Vec::new();
        for n in 0..10_000 {
            match g.event(n) {
                Event::Person(p) => people.push(p.id),
                Event::Auction(a) => auctions.push(a.id),
                Event::Bid(_) => {}
            }
        }
        assert_eq!(people, (1000..1200).collect::<Vec<_>>());
        assert_eq!(auctions, (1000..1600).collect::<Vec<_>>());
        assert_eq!(last_person_id(0), 1000);
        assert_eq!(last_person_id(49), 1000);
        assert_eq!(last_person_id(50), 1001);
        assert_eq!(last_auction_id(0), None);
        assert_eq!(last_auction_id(1), Some(1000));
        assert_eq!(last_auction_id(3), Some(1002));
        assert_eq!(last_auction_id(4), Some(1002));
        assert_eq!(last_auction_id(50), Some(1002));
        assert_eq!(last_auction_id(51), Some(1003));
    }

    /// Generates `0..n` in order and checks every reference against what
    /// exists so far, and every field against its domain.
    #[test]
    fn references_and_fields_are_valid() {
        for seed in [0, 3] {
            let c = cfg(seed);
            let g = NexmarkGenerator::new(c).unwrap();
            let mut max_person = None;
            let mut auction_times = std::collections::HashMap::new();
            let mut categories = std::collections::BTreeSet::new();
            let mut states = std::collections::BTreeSet::new();
            let mut prev_time = i64::MIN;
            let mut hot_bids = 0;
            let mut bids = 0;
            for n in 0..200_000u64 {
                let e = g.event(n);
                assert!(e.date_time() >= prev_time, "time decreases at n={n}");
                prev_time = e.date_time();
                assert_eq!(e.date_time(), c.base_time_ms + (n * 1000 / c.events_per_second) as i64);
                match e {
                    Event::Person(p) => {
                        max_person = Some(p.id);
                        assert!(US_STATES.contains(&&*p.state), "{p:?}");
                        assert!(US_CITIES.contains(&&*p.city), "{p:?}");
                        assert_eq!(p.credit_card.len(), 19, "{p:?}");
                        states.insert(p.state.clone());
                    }
                    Event::Auction(a) => {
                        let seller_exists = max_person.is_some_and(|m| (1000..=m).contains(&a.seller));
                        assert!(seller_exists, "n={n}: seller {} of {a:?} does not exist", a.seller);
                        assert!((10..=14).contains(&a.category), "{a:?}");
                        categories.insert(a.category);
                        assert!(a.expires > a.date_time, "{a:?}");
                        assert!((100..=100_000_000).contains(&a.initial_bid), "{a:?}");
                        assert!(a.reserve > a.initial_bid, "{a:?}");
                        auction_times.insert(a.id, a.date_time);
                    }
                    Event::Bid(b) => {
                        let opened = auction_times.get(&b.auction);
                        assert!(
                            opened.is_some_and(|&t| t <= b.date_time),
                            "n={n}: {b:?} bids on a missing auction"
                        );
                        let bidder_exists = max_person.is_some_and(|m| (1000..=m).contains(&b.bidder));
                        assert!(bidder_exists, "n={n}: bidder of {b:?} does not exist");
                        assert!((100..=100_000_000).contains(&b.price), "{b:?}");
                        let last = last_auction_id(n).unwrap();
                        assert!(
                            b.auction + u64::from(c.num_in_flight_auctions) >= last || b.auction % 100 == 0,
                            "{b:?}"
                        );
                        bids += 1;
                        if b.auction == FIRST_AUCTION_ID + ((last - FIRST_AUCTION_ID) / 100) * 100 {
                            hot_bids += 1;
                        }
                    }
                }
            }
            assert_eq!(categories.len(), 5);
            assert_eq!(states.len(), 6);
            // Half of the bids go to the hot auction, plus the cold bids that
            // happen to pick it: expect a bit over 50%.
            let share = hot_bids as f64 / bids as f64;
            assert!((0.5..0.56).contains(&share), "hot auction share {share}");
        }
    }

    #[test]
    fn prices_and_channels_follow_the_reference_distribution() {
        let g = NexmarkGenerator::new(cfg(9)).unwrap();
        let bids: Vec<Bid> = (0..100_000).filter_map(|n| g.event(n).as_bid().cloned()).collect();
        // log10(price / 100) is uniform in [0, 6): each decade holds ~1/6.
        for decade in 0..6 {
            let (lo, hi) = (100 * 10u64.pow(decade), 100 * 10u64.pow(decade + 1));
            let share = bids.iter().filter(|b| (lo..hi).contains(&b.price)).count() as f64 / bids.len() as f64;
            assert!((0.15..0.18).contains(&share), "decade {decade}: {share}");
        }
        let hot = bids.iter().filter(|b| HOT_CHANNELS.contains(&&*b.channel)).count() as f64 / bids.len() as f64;
        assert!((0.48..0.52).contains(&hot), "hot channel share {hot}");
        assert!(bids.iter().all(|b| b.url.starts_with("https://www.nexmark.com/")));
        let cold = bids.iter().find(|b| b.channel.starts_with("channel-")).unwrap();
        // A channel always has the same URL.
        assert!(bids
            .iter()
            .filter(|b| b.channel == cold.channel)
            .all(|b| b.url == cold.url));
    }

    #[test]
    fn batches_make_the_same_events_as_one_by_one() {
        for rate in [1, 3, 7, 10_000, 1_000_003] {
            let g = NexmarkGenerator::new(NexmarkConfig {
                events_per_second: rate,
                ..cfg(rate)
            })
            .unwrap();
            for (first, stride, count) in [
                (0, 1, 2000),
                (5, 3, 700),
                (1 << 40, 7, 100),
                (17, 2, 9),
                (0, 1, 0),
                // n * 1000 overflows u64 from the 6th event on.
                (u64::MAX / 1000 - 5, 1, 20),
                (u64::MAX - 100, 2, 50),
                (0, u64::MAX / 40, 30),
            ] {
                let mut batch = vec![g.event(999)];
                g.events_into(first, stride, count, &mut batch);
                let expected: Vec<Event> = std::iter::once(g.event(999))
                    .chain((0..count as u64).map(|i| g.event(first + i * stride)))
                    .collect();
                assert_eq!(
                    batch, expected,
                    "rate={rate} first={first} stride={stride} count={count}"
                );
            }
        }
    }

    #[test]
    fn prices_are_accurate_powers_of_ten() {
        let exact = (6.0 * std::f64::consts::LOG2_10) * (1u64 << 59) as f64;
        assert!((SIX_LOG2_10_Q59 as f64 - exact).abs() / exact < 1e-15);
        let pow2 = Pow2::new();
        assert_eq!(pow2.ten_to_6u(0), 1.0);
        let mut r = Rng(1);
        let mut worst = 0.0f64;
        for bits in (0..100_000).map(|_| r.next_u64()).chain([u64::MAX, 1 << 63, 1]) {
            let u = bits as f64 / 2f64.powi(64);
            let exact = (u * 6.0 * std::f64::consts::LN_10).exp();
            worst = worst.max(((pow2.ten_to_6u(bits) - exact) / exact).abs());
        }
        assert!(worst < 1e-14, "relative error {worst}");
        // Prices as with exp: equal but for (rare) values within 1e-6 of a
        // half cent.
        let (mut a, mut b) = (Rng(2), Rng(2));
        for _ in 0..100_000 {
            let price = a.price(&pow2);
            let x = 100.0 * (b.next_u64() as f64 / 2f64.powi(64) * 6.0 * std::f64::consts::LN_10).exp();
            assert!(
                price == (x + 0.5) as u64 || (x.fract() - 0.5).abs() < 1e-6,
                "{price} vs {x}"
            );
        }
        assert_eq!(Rng(3).price(&pow2).clamp(100, 100_000_000), Rng(3).price(&pow2));
    }

    #[test]
    fn timestamps_are_exact_integer_math() {
        let c = NexmarkConfig {
            events_per_second: 3,
            base_time_ms: 10,
            ..cfg(0)
        };
        let got: Vec<i64> = (0..7).map(|n| c.timestamp(n)).collect();
        assert_eq!(got, vec![10, 343, 676, 1010, 1343, 1676, 2010]);
        // No overflow for the largest event numbers.
        assert_eq!(c.timestamp(u64::MAX), i64::MAX);
        let fast = NexmarkConfig {
            events_per_second: 1_000_000,
            ..cfg(0)
        };
        assert_eq!(fast.timestamp(999), fast.base_time_ms);
        assert_eq!(fast.timestamp(1000), fast.base_time_ms + 1);
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let cases: [(NexmarkConfig, &str); 4] = [
            (
                NexmarkConfig {
                    events_per_second: 0,
                    ..cfg(0)
                },
                "events_per_second",
            ),
            (
                NexmarkConfig {
                    hot_auction_ratio: 0,
                    ..cfg(0)
                },
                "hot_auction_ratio",
            ),
            (
                NexmarkConfig {
                    num_active_people: 0,
                    ..cfg(0)
                },
                "num_active_people",
            ),
            (
                NexmarkConfig {
                    base_time_ms: -1,
                    ..cfg(0)
                },
                "base_time_ms",
            ),
        ];
        for (c, setting) in cases {
            let e = NexmarkGenerator::new(c).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidConfig { setting: s, .. } if *s == setting),
                "{e}"
            );
            assert!(e.to_string().contains(setting), "{e}");
        }
        let panic = std::panic::catch_unwind(|| {
            event(
                &NexmarkConfig {
                    events_per_second: 0,
                    ..cfg(0)
                },
                1,
            )
        });
        assert!(panic.is_err());
    }

    /// CPU seconds used by this thread so far (user + system), from
    /// `/proc/thread-self/stat`; `None` where that does not exist.
    fn thread_cpu_seconds() -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        // Fields after the command name (which is in parentheses): state is
        // field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        Some(ticks as f64 / 100.0)
    }

    /// Release-mode speed of the generator on one core, events made and
    /// dropped in batches of 1024, by wall time and by this thread's CPU
    /// time (which other processes on the machine do not inflate):
    /// `cargo test --release -p weir-io nexmark_generator_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run by hand in release mode"]
    fn nexmark_generator_speed() {
        let g = NexmarkGenerator::new(cfg(1)).unwrap();
        let n = 50_000_000;
        let mut batch = Vec::with_capacity(1024);
        let mut checksum = 0u64;
        let (mut making, mut dropping) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
        let cpu0 = thread_cpu_seconds();
        let start = std::time::Instant::now();
        let mut i = 0;
        while i < n {
            let t0 = std::time::Instant::now();
            g.events_into(i, 1, 1024, &mut batch);
            let t1 = std::time::Instant::now();
            checksum = checksum.wrapping_add(batch.iter().map(|e| e.date_time() as u64).sum::<u64>());
            let t2 = std::time::Instant::now();
            batch.clear();
            dropping += t2.elapsed();
            making += t1 - t0;
            i += 1024;
        }
        let wall = start.elapsed().as_secs_f64();
        let cpu = cpu0.zip(thread_cpu_seconds()).map(|(a, b)| b - a);
        let m = |secs: f64| i as f64 / secs / 1e6;
        let cpu_rate = cpu.map_or("unknown".to_string(), |c| format!("{:.1}", m(c)));
        println!(
            "nexmark generator: {i} events, made and dropped at {:.1} M events/s wall, {cpu_rate} M per CPU second; \
             making alone {:.1} M/s, dropping alone {:.1} M/s (checksum {checksum})",
            m(wall),
            m(making.as_secs_f64()),
            m(dropping.as_secs_f64()),
        );
        assert!(m(wall) > 1.0, "{} M events/s", m(wall));
    }

    /// Release-mode speed of making events on one thread and dropping them
    /// on another, as a pipeline does (with reference-counted strings, the
    /// counts then moved between cores).
    /// `cargo test --release -p weir-io nexmark_cross_thread_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run by hand in release mode"]
    fn nexmark_cross_thread_speed() {
        let g = NexmarkGenerator::new(cfg(1)).unwrap();
        let n = 20_000_000u64;
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Event>>(4);
        let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<Event>>();
        let start = std::time::Instant::now();
        let consumer = std::thread::spawn(move || {
            let mut seen = 0u64;
            for mut batch in rx {
                seen += batch.len() as u64;
                batch.clear();
                let _ = back_tx.send(batch);
            }
            seen
        });
        let mut i = 0;
        while i < n {
            let mut batch = back_rx.try_recv().unwrap_or_else(|_| Vec::with_capacity(1024));
            g.events_into(i, 1, 1024, &mut batch);
            tx.send(batch).unwrap();
            i += 1024;
        }
        drop(tx);
        let seen = consumer.join().unwrap();
        let wall = start.elapsed().as_secs_f64();
        println!(
            "nexmark generator, dropped on another thread: {seen} events at {:.1} M events/s",
            seen as f64 / wall / 1e6
        );
        assert_eq!(seen, i);
    }
}
