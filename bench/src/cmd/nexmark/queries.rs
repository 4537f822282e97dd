//! The Nexmark queries q0-q8 as weir pipelines.
//!
//! Each query takes a stream of [`Event`]s that already carries event time
//! (watermarks by `dateTime`) and returns a stream of [`Row`]s, the lines
//! of its CSV output. Records are projected to the fields a query needs
//! before any exchange, as a query planner would, so that rings and state
//! carry a few words instead of whole events.
//!
//! | query | what | operators |
//! |---|---|---|
//! | q0 | every bid | `flat_map` |
//! | q1 | every bid, price × 0.908 | `flat_map` |
//! | q2 | bids on auctions `id % 123 == 0` | `flat_map` |
//! | q3 | category-10 auctions with their seller in OR, ID, CA | unwindowed `inner_join` |
//! | q4 | average closing price per category | keyed process function over auctions and bids (`Either`) with timers and a buffer, then per-category sums to end of input |
//! | q5 | most-bid auctions per sliding window (10 s / 2 s) | sliding window count, then per-window top counts (process function) |
//! | q6 | average of each seller's last 10 closing prices | as q4, per seller |
//! | q7 | highest bids per tumbling 10 s window | top bids per (auction, window), then per window (process functions) |
//! | q8 | people who opened an auction in their registration window | process function keyed by (person, window) over persons and auctions |

use std::io::Write;

use serde::{Deserialize, Serialize};
use weir_core::join::Either;
use weir_core::process::{KeyedProcessFunction, TimerContext};
use weir_core::state::StateKey;
use weir_core::time::MAX_WATERMARK;
use weir_core::timers::TimeDomain;
use weir_core::window::{AggregateFunction, Window, Windowed, Windows};
use weir_core::Stream;
use weir_io::nexmark::{Event, Text};

/// Size of the tumbling windows of q7 and q8 and of the sliding windows of q5.
pub const WINDOW_MS: i64 = 10_000;
/// Slide of q5's windows.
pub const SLIDE_MS: i64 = 2_000;

/// A Nexmark query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Query {
    /// Passthrough of bids.
    Q0,
    /// Currency conversion.
    Q1,
    /// Selection.
    Q2,
    /// Local item suggestion (join).
    Q3,
    /// Average price per category.
    Q4,
    /// Hot items.
    Q5,
    /// Average selling price by seller.
    Q6,
    /// Highest bid.
    Q7,
    /// Monitor new users.
    Q8,
}

impl Query {
    /// `q0` .. `q8`.
    pub fn name(self) -> &'static str {
        ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8"][self as usize]
    }

    /// The CSV header line (without `\n`).
    pub fn header(self) -> &'static str {
        match self {
            Query::Q0 | Query::Q1 => "auction,bidder,price,dateTime",
            Query::Q2 => "auction,price",
            Query::Q3 => "name,city,state,id",
            Query::Q4 => "category,avg_price",
            Query::Q5 => "auction,num,window_start,window_end",
            Query::Q6 => "seller,avg_price",
            Query::Q7 => "auction,price,bidder,dateTime",
            Query::Q8 => "id,name,window_start",
        }
    }
}

/// One output line of a query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Row {
    /// q0, q7: `auction,bidder,price,dateTime` or `auction,price,bidder,dateTime`.
    Bid {
        /// Auction id.
        auction: u64,
        /// Bidder id.
        bidder: u64,
        /// Price in cents.
        price: u64,
        /// Event time.
        date_time: i64,
        /// q7's column order (price before bidder).
        price_first: bool,
    },
    /// q1: the price in thousandths of cents (price × 908).
    Converted {
        /// Auction id.
        auction: u64,
        /// Bidder id.
        bidder: u64,
        /// Price × 0.908 in thousandths of a cent.
        milli_cents: u64,
        /// Event time.
        date_time: i64,
    },
    /// q2.
    Selected {
        /// Auction id.
        auction: u64,
        /// Price in cents.
        price: u64,
    },
    /// q3.
    Local {
        /// Seller name.
        name: Text,
        /// Seller city.
        city: Text,
        /// Seller state.
        state: Text,
        /// Auction id.
        id: u64,
    },
    /// q4, q6: `key,avg` with the average of `count` prices summing to `sum`.
    Average {
        /// Category (q4) or seller (q6).
        key: u64,
        /// Sum of the closing prices, cents.
        sum: u64,
        /// Number of closing prices.
        count: u64,
    },
    /// q5.
    Hot {
        /// Auction id.
        auction: u64,
        /// Bids in the window.
        num: u64,
        /// Window start.
        start: i64,
        /// Window end.
        end: i64,
    },
    /// q8.
    NewUser {
        /// Person id.
        id: u64,
        /// Person name.
        name: Text,
        /// Window start.
        start: i64,
    },
}

/// `numerator / denominator` cents with two decimals, rounded half up.
pub fn write_decimal(out: &mut Vec<u8>, numerator: u128, denominator: u128) {
    debug_assert!(denominator > 0);
    let hundredths = (numerator * 200 + denominator) / (2 * denominator);
    let _ = write!(out, "{}.{:02}", hundredths / 100, hundredths % 100);
}

impl Row {
    /// Appends the CSV line of this row, with `\n`.
    pub fn write_csv(&self, out: &mut Vec<u8>) {
        let _ = match self {
            Row::Bid {
                auction,
                bidder,
                price,
                date_time,
                price_first: false,
            } => writeln!(out, "{auction},{bidder},{price},{date_time}"),
            Row::Bid {
                auction,
                bidder,
                price,
                date_time,
                price_first: true,
            } => writeln!(out, "{auction},{price},{bidder},{date_time}"),
            Row::Converted {
                auction,
                bidder,
                milli_cents,
                date_time,
            } => {
                let _ = write!(out, "{auction},{bidder},");
                write_decimal(out, u128::from(*milli_cents), 1000);
                writeln!(out, ",{date_time}")
            }
            Row::Selected { auction, price } => writeln!(out, "{auction},{price}"),
            Row::Local { name, city, state, id } => writeln!(out, "{name},{city},{state},{id}"),
            Row::Average { key, sum, count } => {
                let _ = write!(out, "{key},");
                write_decimal(out, u128::from(*sum), u128::from(*count));
                writeln!(out)
            }
            Row::Hot {
                auction,
                num,
                start,
                end,
            } => writeln!(out, "{auction},{num},{start},{end}"),
            Row::NewUser { id, name, start } => writeln!(out, "{id},{name},{start}"),
        };
    }
}

/// A late record reached a window: the input was more out of order than
/// its watermark allowed. Fails the job with the record.
fn on_time<O, T: std::fmt::Debug>(w: Windowed<O, T>) -> Option<O> {
    match w {
        Windowed::Result(o) => Some(o),
        Windowed::Late(t) => {
            panic!("late record {t:?}: the input is more out of order than --out-of-orderness-ms allows; raise it")
        }
    }
}

/// Builds query `q` over `events`; keyed operators run with `parallelism`.
pub fn build(q: Query, events: Stream<Event>, parallelism: usize) -> Stream<Row> {
    match q {
        Query::Q0 | Query::Q1 | Query::Q2 => events.flat_map(move |e: Event| match e {
            Event::Bid(b) => match q {
                Query::Q0 => Some(Row::Bid {
                    auction: b.auction,
                    bidder: b.bidder,
                    price: b.price,
                    date_time: b.date_time,
                    price_first: false,
                }),
                Query::Q1 => Some(Row::Converted {
                    auction: b.auction,
                    bidder: b.bidder,
                    milli_cents: b.price * 908,
                    date_time: b.date_time,
                }),
                _ => (b.auction % 123 == 0).then_some(Row::Selected {
                    auction: b.auction,
                    price: b.price,
                }),
            },
            _ => None,
        }),
        Query::Q3 => q3(events, parallelism),
        Query::Q4 => closing_prices(events, parallelism)
            .key_by(|c: &Closed| c.category)
            .parallelism(parallelism)
            .process_function(Average)
            .name("average"),
        Query::Q6 => closing_prices(events, parallelism)
            .key_by(|c: &Closed| c.seller)
            .parallelism(parallelism)
            .process_function(LastTen)
            .name("last_ten"),
        Query::Q5 => q5(events, parallelism),
        Query::Q7 => q7(events, parallelism),
        Query::Q8 => q8(events, parallelism),
    }
}

/// A person's fields that q3 and q8 need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Who {
    id: u64,
    name: Text,
    city: Text,
    state: Text,
    date_time: i64,
}

/// An auction's fields that q3, q4, q6 and q8 need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Lot {
    id: u64,
    seller: u64,
    category: u64,
    date_time: i64,
    expires: i64,
}

fn q3(events: Stream<Event>, parallelism: usize) -> Stream<Row> {
    events
        .flat_map(|e: Event| match e {
            Event::Person(p) if matches!(&*p.state, "OR" | "ID" | "CA") => Some(Either::Left(Who {
                id: p.id,
                name: p.name,
                city: p.city,
                state: p.state,
                date_time: p.date_time,
            })),
            Event::Auction(a) if a.category == 10 => Some(Either::Right(lot(&a))),
            _ => None,
        })
        .key_by(|e: &Either<Who, Lot>| match e {
            Either::Left(p) => p.id,
            Either::Right(a) => a.seller,
        })
        .parallelism(parallelism)
        .inner_join(|p: &Who, a: &Lot| Row::Local {
            name: p.name.clone(),
            city: p.city.clone(),
            state: p.state.clone(),
            id: a.id,
        })
}

fn lot(a: &weir_io::nexmark::Auction) -> Lot {
    Lot {
        id: a.id,
        seller: a.seller,
        category: a.category,
        date_time: a.date_time,
        expires: a.expires,
    }
}

/// A closed auction with its closing price.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Closed {
    id: u64,
    seller: u64,
    category: u64,
    expires: i64,
    price: u64,
}

/// Per auction: the auction once seen and its highest bid in
/// `[dateTime, expires]`; bids that came before their auction wait in the
/// key's buffer, `buffered` of them (so that an auction without early bids
/// never reads its buffer).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Bidding {
    lot: Option<Lot>,
    best: Option<u64>,
    buffered: u32,
}

/// The closing price of each auction, emitted when the watermark passes
/// its `expires`.
#[derive(Clone)]
struct Closing;

impl KeyedProcessFunction<u64, Either<Lot, (u64, i64, u64)>, Closed> for Closing {
    type State = Bidding;
    const MAX_STATE_BYTES: usize = 80;
    /// `(dateTime, price)` of a bid that came before its auction.
    type Buffered = (i64, u64);
    const MAX_BUFFERED_BYTES: usize = 64;

    fn process(
        &mut self,
        e: Either<Lot, (u64, i64, u64)>,
        st: &mut Bidding,
        ctx: &mut TimerContext<'_, u64, Closed, (i64, u64)>,
    ) {
        match e {
            Either::Left(a) => {
                let mut best = None;
                if st.buffered > 0 {
                    ctx.buffer_for_each(|(ts, price)| {
                        if a.date_time <= ts && ts <= a.expires {
                            best = Some(best.map_or(price, |b: u64| b.max(price)));
                        }
                    });
                    ctx.buffer_clear();
                    st.buffered = 0;
                }
                st.best = best;
                st.lot = Some(a);
                ctx.register_event_timer(a.expires);
            }
            Either::Right((_, ts, price)) => match st.lot {
                Some(a) => {
                    if a.date_time <= ts && ts <= a.expires {
                        st.best = Some(st.best.map_or(price, |b| b.max(price)));
                    }
                }
                None => {
                    // Kept until the watermark rules the auction out: one
                    // timer per key, at the earliest buffered time it knows
                    // of (a bid buffered later with an earlier time waits
                    // for that timer; the auction filters by time anyway).
                    if st.buffered == 0 {
                        ctx.register_event_timer(ts);
                    }
                    ctx.buffer_push(&(ts, price));
                    st.buffered += 1;
                }
            },
        }
    }

    fn on_timer(
        &mut self,
        time: i64,
        _: TimeDomain,
        st: &mut Bidding,
        ctx: &mut TimerContext<'_, u64, Closed, (i64, u64)>,
    ) {
        match st.lot {
            Some(a) if time >= a.expires => {
                if let Some(price) = st.best {
                    ctx.emit(Closed {
                        id: a.id,
                        seller: a.seller,
                        category: a.category,
                        expires: a.expires,
                        price,
                    });
                }
                ctx.clear_state();
            }
            Some(_) => {}
            None => {
                // An auction arriving from now on has dateTime above the
                // watermark: it cannot take bids at or below it.
                let wm = ctx.watermark();
                ctx.buffer_retain(|&(ts, _)| ts > wm);
                let (mut left, mut earliest) = (0, i64::MAX);
                ctx.buffer_for_each(|(ts, _)| {
                    left += 1;
                    earliest = earliest.min(ts);
                });
                if left == 0 {
                    ctx.clear_state();
                } else {
                    st.buffered = left;
                    ctx.register_event_timer(earliest);
                }
            }
        }
    }
}

fn closing_prices(events: Stream<Event>, parallelism: usize) -> Stream<Closed> {
    events
        .flat_map(|e: Event| match e {
            Event::Auction(a) => Some(Either::Left(lot(&a))),
            Event::Bid(b) => Some(Either::Right((b.auction, b.date_time, b.price))),
            Event::Person(_) => None,
        })
        .name("project")
        .key_by(|e: &Either<Lot, (u64, i64, u64)>| match e {
            Either::Left(a) => a.id,
            Either::Right(b) => b.0,
        })
        .parallelism(parallelism)
        .process_function(Closing)
        .name("closing_price")
}

/// Sum and count per key, emitted at end of input (q4).
#[derive(Clone)]
struct Average;

impl KeyedProcessFunction<u64, Closed, Row> for Average {
    type State = (u64, u64);
    const MAX_STATE_BYTES: usize = 64;
    type Buffered = ();
    fn process(&mut self, c: Closed, st: &mut (u64, u64), ctx: &mut TimerContext<'_, u64, Row>) {
        // The key's timer goes with its first record (see `NewUsers`).
        if st.1 == 0 {
            ctx.register_event_timer(MAX_WATERMARK);
        }
        st.0 += c.price;
        st.1 += 1;
    }
    fn on_timer(&mut self, _: i64, _: TimeDomain, st: &mut (u64, u64), ctx: &mut TimerContext<'_, u64, Row>) {
        ctx.emit(Row::Average {
            key: *ctx.key(),
            sum: st.0,
            count: st.1,
        });
    }
}

/// A seller's last ten closing prices by `(expires, id)` (q6).
#[derive(Clone)]
struct LastTen;

impl KeyedProcessFunction<u64, Closed, Row> for LastTen {
    type State = Vec<(i64, u64, u64)>;
    type Buffered = ();
    fn process(&mut self, c: Closed, st: &mut Self::State, ctx: &mut TimerContext<'_, u64, Row>) {
        if st.is_empty() {
            ctx.register_event_timer(MAX_WATERMARK);
        }
        st.push((c.expires, c.id, c.price));
        st.sort_unstable();
        if st.len() > 10 {
            st.remove(0);
        }
    }
    fn on_timer(&mut self, _: i64, _: TimeDomain, st: &mut Self::State, ctx: &mut TimerContext<'_, u64, Row>) {
        ctx.emit(Row::Average {
            key: *ctx.key(),
            sum: st.iter().map(|c| c.2).sum(),
            count: st.len() as u64,
        });
    }
}

#[derive(Clone)]
struct Count;

impl<T> AggregateFunction<T> for Count {
    type Acc = u64;
    type Output = u64;
    fn add(&self, acc: &mut u64, _: &T) {
        *acc += 1;
    }
    fn result(&self, acc: &u64) -> u64 {
        *acc
    }
    fn merge(&self, acc: &mut u64, other: u64) {
        *acc += other;
    }
}

/// `(auction, count, start, end)` of one window.
type Counted = (u64, u64, i64, i64);

fn q5(events: Stream<Event>, parallelism: usize) -> Stream<Row> {
    events
        .flat_map(|e: Event| match e {
            Event::Bid(b) => Some((b.auction, b.date_time)),
            _ => None,
        })
        .name("project")
        .key_by(|b: &(u64, i64)| b.0)
        .parallelism(parallelism)
        .window(Windows::sliding(WINDOW_MS, SLIDE_MS), |b: &(u64, i64)| b.1)
        .aggregate(Count, |a: &u64, w: Window, n: u64| (*a, n, w.start, w.end))
        .flat_map(on_time)
        .name("on_time")
        .key_by(|c: &Counted| c.2)
        .parallelism(parallelism)
        .process_function(MostBids)
        .name("most_bids")
}

/// Stage two of q5, keyed by window start: the auctions with the most
/// bids in the window (the count in the state, the auctions in the
/// buffer), emitted when the window is complete.
#[derive(Clone)]
struct MostBids;

impl KeyedProcessFunction<i64, Counted, Row> for MostBids {
    type State = Option<u64>;
    const MAX_STATE_BYTES: usize = 64;
    type Buffered = u64;
    const MAX_BUFFERED_BYTES: usize = 64;
    fn process(
        &mut self,
        (auction, num, _, end): Counted,
        best: &mut Option<u64>,
        ctx: &mut TimerContext<'_, i64, Row, u64>,
    ) {
        if best.is_none() {
            ctx.register_event_timer(end - 1);
        }
        offer(best, num, auction, ctx);
    }
    fn on_timer(
        &mut self,
        time: i64,
        _: TimeDomain,
        best: &mut Option<u64>,
        ctx: &mut TimerContext<'_, i64, Row, u64>,
    ) {
        if let Some(num) = *best {
            let (start, end) = (*ctx.key(), time + 1);
            ctx.emit_buffered(|auction| Row::Hot {
                auction,
                num,
                start,
                end,
            });
        }
        ctx.clear_state();
    }
}

/// A bid of q7: `(auction, bidder, dateTime)`.
type BidRef = (u64, u64, i64);

/// The highest price of a window among some bids, and the bids at it:
/// `(window start, price, bids)`.
type Top = (i64, u64, Vec<BidRef>);

/// Keeps the highest value (price, bid count) in `best` and the items at
/// it in the key's buffer.
fn offer<K: StateKey, O, B: weir_core::Data>(
    best: &mut Option<u64>,
    value: u64,
    item: B,
    ctx: &mut TimerContext<'_, K, O, B>,
) {
    match *best {
        Some(m) if value < m => {}
        Some(m) if value == m => ctx.buffer_push(&item),
        _ => {
            ctx.buffer_clear();
            *best = Some(value);
            ctx.buffer_push(&item);
        }
    }
}

/// A record of window `start` arrived after the window was complete.
fn check_on_time(start: i64, watermark: i64) {
    assert!(
        start + WINDOW_MS - 1 > watermark,
        "a late bid for window {start}: the input is more out of order than --out-of-orderness-ms allows; raise it"
    );
}

/// Stage one of q7, keyed by (auction, window start): the auction's top
/// bids in the window.
#[derive(Clone)]
struct TopOfAuction;

impl KeyedProcessFunction<(u64, i64), (u64, u64, u64, i64), Top> for TopOfAuction {
    type State = Option<u64>;
    const MAX_STATE_BYTES: usize = 64;
    type Buffered = BidRef;
    const MAX_BUFFERED_BYTES: usize = 64;
    fn process(
        &mut self,
        (auction, bidder, price, ts): (u64, u64, u64, i64),
        best: &mut Option<u64>,
        ctx: &mut TimerContext<'_, (u64, i64), Top, BidRef>,
    ) {
        let start = ctx.key().1;
        check_on_time(start, ctx.watermark());
        if best.is_none() {
            ctx.register_event_timer(start + WINDOW_MS - 1);
        }
        offer(best, price, (auction, bidder, ts), ctx);
    }
    fn on_timer(
        &mut self,
        _: i64,
        _: TimeDomain,
        best: &mut Option<u64>,
        ctx: &mut TimerContext<'_, (u64, i64), Top, BidRef>,
    ) {
        let mut bids = Vec::new();
        ctx.buffer_for_each(|b| bids.push(b));
        if let Some(price) = *best {
            ctx.emit((ctx.key().1, price, bids));
        }
        ctx.clear_state();
    }
}

/// Stage two of q7, keyed by window start: the window's top bids over
/// every auction.
#[derive(Clone)]
struct TopOfWindow;

impl KeyedProcessFunction<i64, Top, Row> for TopOfWindow {
    type State = Option<u64>;
    const MAX_STATE_BYTES: usize = 64;
    type Buffered = BidRef;
    const MAX_BUFFERED_BYTES: usize = 64;
    fn process(
        &mut self,
        (start, price, bids): Top,
        best: &mut Option<u64>,
        ctx: &mut TimerContext<'_, i64, Row, BidRef>,
    ) {
        if best.is_none() {
            ctx.register_event_timer(start + WINDOW_MS - 1);
        }
        for b in bids {
            offer(best, price, b, ctx);
        }
    }
    fn on_timer(
        &mut self,
        _: i64,
        _: TimeDomain,
        best: &mut Option<u64>,
        ctx: &mut TimerContext<'_, i64, Row, BidRef>,
    ) {
        if let Some(price) = *best {
            ctx.emit_buffered(|(auction, bidder, date_time)| Row::Bid {
                auction,
                bidder,
                price,
                date_time,
                price_first: true,
            });
        }
        ctx.clear_state();
    }
}

fn q7(events: Stream<Event>, parallelism: usize) -> Stream<Row> {
    events
        .flat_map(|e: Event| match e {
            Event::Bid(b) => Some((b.auction, b.bidder, b.price, b.date_time)),
            _ => None,
        })
        .name("project")
        .key_by(|b: &(u64, u64, u64, i64)| (b.0, b.3 - b.3.rem_euclid(WINDOW_MS)))
        .parallelism(parallelism)
        .process_function(TopOfAuction)
        .name("top_of_auction")
        .key_by(|t: &Top| t.0)
        .parallelism(parallelism)
        .process_function(TopOfWindow)
        .name("top_of_window")
}

/// q8's input: a person `(id, name, dateTime)` or an auction `(seller, dateTime)`.
type Q8In = Either<(u64, Text, i64), (u64, i64)>;

/// Per (person, tumbling window): the person's name once they registered
/// in it, whether they opened an auction in it, and whether the row went
/// out. The row goes out as soon as both happened; the state goes when
/// the window is complete.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct NewUser {
    name: Option<Text>,
    opened: bool,
    emitted: bool,
}

#[derive(Clone)]
struct NewUsers;

impl KeyedProcessFunction<(u64, i64), Q8In, Row> for NewUsers {
    type State = NewUser;
    const MAX_STATE_BYTES: usize = 64;
    type Buffered = ();
    fn process(&mut self, e: Q8In, st: &mut NewUser, ctx: &mut TimerContext<'_, (u64, i64), Row>) {
        let (id, start) = *ctx.key();
        check_on_time(start, ctx.watermark());
        // A key's first record registers its timer: state and timer are
        // made, checkpointed and cleared together, so a later record
        // (state not empty) finds it registered and skips a lookup.
        if *st == NewUser::default() {
            ctx.register_event_timer(start + WINDOW_MS - 1);
        }
        match e {
            Either::Left((_, name, _)) => st.name = Some(name),
            Either::Right(_) => st.opened = true,
        }
        if let (Some(name), true, false) = (&st.name, st.opened, st.emitted) {
            ctx.emit(Row::NewUser {
                id,
                name: name.clone(),
                start,
            });
            st.emitted = true;
        }
    }
    fn on_timer(&mut self, _: i64, _: TimeDomain, _: &mut NewUser, ctx: &mut TimerContext<'_, (u64, i64), Row>) {
        ctx.clear_state();
    }
}

fn q8(events: Stream<Event>, parallelism: usize) -> Stream<Row> {
    let window = |ts: i64| ts - ts.rem_euclid(WINDOW_MS);
    events
        .flat_map(|e: Event| match e {
            Event::Person(p) => Some(Either::Left((p.id, p.name, p.date_time))),
            Event::Auction(a) => Some(Either::Right((a.seller, a.date_time))),
            Event::Bid(_) => None,
        })
        .name("project")
        .key_by(move |e: &Q8In| match e {
            Either::Left(p) => (p.0, window(p.2)),
            Either::Right(a) => (a.0, window(a.1)),
        })
        .parallelism(parallelism)
        .process_function(NewUsers)
        .name("new_users")
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use weir_core::time::WatermarkStrategy;
    use weir_core::{CollectSink, Pipeline, RuntimeConfig, VecSource};
    use weir_io::nexmark::{Auction, Bid};

    use super::*;

    fn bid(auction: u64, date_time: i64, price: u64) -> Event {
        Event::Bid(Bid {
            auction,
            bidder: 1,
            price,
            channel: Text::from("c"),
            url: Text::from("u"),
            date_time,
            extra: Text::from(""),
        })
    }

    fn auction(id: u64, date_time: i64, expires: i64) -> Event {
        Event::Auction(Auction {
            id,
            item_name: Text::from("i"),
            description: Text::from("d"),
            initial_bid: 1,
            reserve: 1,
            date_time,
            expires,
            seller: 7,
            category: 10,
            extra: Text::from(""),
        })
    }

    /// Closing prices of `events`, in this order, with a watermark after
    /// every event (batches of one) 1 s behind the latest time seen.
    fn closing(events: Vec<Event>) -> Vec<(u64, u64)> {
        let events = Arc::new(events);
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink_out = out.clone();
        let p = Pipeline::new("closing");
        let stream = p
            .source("events", 1, move |i, n| VecSource::new(events.clone(), i, n))
            .assign_watermarks(WatermarkStrategy::bounded(999, |e: &Event| e.date_time()));
        closing_prices(stream, 1)
            .map(|c: Closed| (c.id, c.price))
            .sink("collect", move |_| CollectSink::new(sink_out.clone()));
        let cfg = RuntimeConfig {
            batch_size: 1,
            ..RuntimeConfig::default()
        };
        p.run(cfg).unwrap().join().unwrap();
        let mut got = out.lock().unwrap().clone();
        got.sort_unstable();
        got
    }

    /// Bids that come before their auction wait in the key's buffer under
    /// one timer; when the watermark passes it, the bids at or below the
    /// watermark go (an auction arriving later cannot take them) and the
    /// rest wait under a new timer at the earliest of them.
    #[test]
    fn bids_before_their_auction_wait_until_the_watermark_rules_them_out() {
        let got = closing(vec![
            // Auction 1: three early bids, the third with the earliest time
            // (one timer, at 1150).
            bid(1, 1150, 10),
            bid(1, 1300, 20),
            bid(1, 1120, 40),
            // Auction 5: two early bids (timer at 1100).
            bid(5, 1100, 3),
            bid(5, 1280, 6),
            // Auction 2: two early bids, then the auction takes both.
            bid(2, 1210, 5),
            bid(2, 1220, 9),
            auction(2, 1200, 1400),
            // Watermark 1260: auction 1 keeps its bid at 1300 only (new
            // timer at 1300), auction 5 its bid at 1280 (timer at 1280).
            bid(3, 2260, 1),
            // A late auction 1 takes the one bid left: 20, not 40.
            auction(1, 1100, 1500),
            // Watermark 1290: auction 5's second timer drops its last bid,
            // so the late auction 5 closes without a price (no row).
            bid(3, 2290, 1),
            auction(5, 1000, 1600),
            // Past every expiry: auctions 1 and 2 close.
            bid(4, 10_000, 1),
        ]);
        assert_eq!(got, vec![(1, 20), (2, 9)]);
    }
}
