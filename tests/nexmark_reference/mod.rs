//! Reference results of the Nexmark queries q0–q8, computed the obvious way.
//!
//! This module exists to check weir's Nexmark queries (and any other
//! system's) against an independent computation: plain loops and ordered
//! maps over the whole bounded input, no weir runtime, no incremental
//! state, no watermarks. Its results are the exact contents of each query's
//! CSV output file:
//!
//! - a header line with the column names, then the rows sorted bytewise
//!   (as `LC_ALL=C sort` does), `\n` after every line including the last;
//! - fields separated by `,`, never quoted or padded; integers plain;
//!   decimals with exactly two digits after the point, rounded half up;
//!   times as epoch milliseconds.
//!
//! Money is integer cents in the events, and decimals are in the same unit
//! (cents) with two more digits: q1's `0.908 * 125` cents is `113.50`.
//!
//! Windows are aligned to epoch 0 and half-open, `[start, start + size)`;
//! only windows holding at least one event exist.
//!
//! | query | columns | rows |
//! |---|---|---|
//! | q0 | `auction,bidder,price,dateTime` | every bid |
//! | q1 | `auction,bidder,price,dateTime` | every bid, price × 0.908 |
//! | q2 | `auction,price` | bids with `auction % 123 == 0` |
//! | q3 | `name,city,state,id` | auctions of category 10 joined with their seller when in OR, ID or CA |
//! | q4 | `category,avg_price` | average closing price per category |
//! | q5 | `auction,num,window_start,window_end` | most-bid auctions per sliding window (10 s every 2 s) |
//! | q6 | `seller,avg_price` | average of each seller's last 10 closing prices |
//! | q7 | `auction,price,bidder,dateTime` | highest bids per tumbling 10 s window |
//! | q8 | `id,name,window_start` | people who opened an auction in the 10 s window they registered in |
//!
//! The closing price of an auction (q4, q6) is its highest bid among the
//! bids on it with `auction.dateTime <= bid.dateTime <= auction.expires`
//! (both ends included); an auction without such a bid has none and is
//! left out. Each auction event is one auction (ids are unique in the
//! generated data).

use std::collections::{BTreeMap, BTreeSet};

use weir_io::nexmark::{Auction, Bid, Event, Person};

/// The queries [`reference`] computes.
pub const QUERIES: [&str; 9] = ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8"];

/// Tumbling window size of q7 and q8, and sliding window size of q5.
const WINDOW_MS: i64 = 10_000;
/// Slide of q5's windows.
const SLIDE_MS: i64 = 2_000;

/// The exact CSV output of `query` (`"q0"` to `"q8"`) over `events`.
///
/// # Panics
/// On an unknown query name.
pub fn reference(query: &str, events: &[Event]) -> String {
    let bids = || events.iter().filter_map(Event::as_bid);
    let auctions = || events.iter().filter_map(Event::as_auction);
    let persons = || events.iter().filter_map(Event::as_person);
    match query {
        "q0" => csv(
            "auction,bidder,price,dateTime",
            bids().map(|b| format!("{},{},{},{}", b.auction, b.bidder, b.price, b.date_time)),
        ),
        // 0.908 * price cents = price * 908 / 1000 cents, rounded half up
        // to hundredths of a cent, in exact integer arithmetic.
        "q1" => csv(
            "auction,bidder,price,dateTime",
            bids().map(|b| {
                let price = fmt_cents_half_up(u128::from(b.price) * 908, 1000);
                format!("{},{},{},{}", b.auction, b.bidder, price, b.date_time)
            }),
        ),
        "q2" => csv(
            "auction,price",
            bids()
                .filter(|b| b.auction % 123 == 0)
                .map(|b| format!("{},{}", b.auction, b.price)),
        ),
        "q3" => q3(persons().collect(), auctions().collect()),
        "q4" => q4(auctions().collect(), bids().collect()),
        "q5" => q5(bids().collect()),
        "q6" => q6(auctions().collect(), bids().collect()),
        "q7" => q7(bids().collect()),
        "q8" => q8(persons().collect(), auctions().collect()),
        other => panic!("unknown Nexmark query {other:?}; expected one of {QUERIES:?}"),
    }
}

/// `numerator / denominator` cents with two decimals, rounded half up:
/// `fmt_cents_half_up(5, 1000)` (0.005) is `"0.01"`.
///
/// # Panics
/// If `denominator` is 0, or `numerator * 200` overflows.
pub fn fmt_cents_half_up(numerator: u128, denominator: u128) -> String {
    assert!(denominator > 0, "fmt_cents_half_up: denominator 0");
    // floor(100 * n / d + 1/2) = floor((200 n + d) / 2d)
    let twice = numerator
        .checked_mul(200)
        .expect("fmt_cents_half_up: numerator too large");
    let hundredths = (twice + denominator) / (2 * denominator);
    format!("{}.{:02}", hundredths / 100, hundredths % 100)
}

/// The file contents: header, rows sorted bytewise, `\n` after each line.
fn csv(header: &str, rows: impl IntoIterator<Item = String>) -> String {
    let mut rows: Vec<String> = rows.into_iter().collect();
    rows.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    let mut out = String::with_capacity(header.len() + 1 + rows.iter().map(|r| r.len() + 1).sum::<usize>());
    out.push_str(header);
    out.push('\n');
    for r in rows {
        out.push_str(&r);
        out.push('\n');
    }
    out
}

/// Start of the tumbling window of size [`WINDOW_MS`] holding `t`.
fn tumble(t: i64) -> i64 {
    t.div_euclid(WINDOW_MS) * WINDOW_MS
}

/// Starts of the sliding windows (size [`WINDOW_MS`], slide [`SLIDE_MS`])
/// holding `t`: every multiple of the slide in `(t - size, t]`.
fn slides(t: i64) -> impl Iterator<Item = i64> {
    let last = t.div_euclid(SLIDE_MS) * SLIDE_MS;
    (0..WINDOW_MS / SLIDE_MS).map(move |k| last - k * SLIDE_MS)
}

/// Unwindowed inner join of category-10 auctions with their sellers in
/// OR, ID or CA: one row per (auction, person) pair, whatever the order
/// of arrival; person ids are unique, so one row per matching auction.
fn q3(persons: Vec<&Person>, auctions: Vec<&Auction>) -> String {
    let mut by_id: BTreeMap<u64, Vec<&Person>> = BTreeMap::new();
    for p in persons {
        by_id.entry(p.id).or_default().push(p);
    }
    let mut rows = Vec::new();
    for a in auctions.into_iter().filter(|a| a.category == 10) {
        for p in by_id.get(&a.seller).into_iter().flatten() {
            if matches!(&*p.state, "OR" | "ID" | "CA") {
                rows.push(format!("{},{},{},{}", p.name, p.city, p.state, a.id));
            }
        }
    }
    csv("name,city,state,id", rows)
}

/// Closing price of each auction that has one, by index into `auctions`.
fn closing_prices(auctions: &[&Auction], bids: &[&Bid]) -> Vec<Option<u64>> {
    let mut by_auction: BTreeMap<u64, Vec<&Bid>> = BTreeMap::new();
    for b in bids {
        by_auction.entry(b.auction).or_default().push(b);
    }
    auctions
        .iter()
        .map(|a| {
            by_auction
                .get(&a.id)
                .into_iter()
                .flatten()
                .filter(|b| a.date_time <= b.date_time && b.date_time <= a.expires)
                .map(|b| b.price)
                .max()
        })
        .collect()
}

/// Per category, the average closing price.
fn q4(auctions: Vec<&Auction>, bids: Vec<&Bid>) -> String {
    let closing = closing_prices(&auctions, &bids);
    let mut per_category: BTreeMap<u64, (u128, u128)> = BTreeMap::new();
    for (a, price) in auctions.iter().zip(closing) {
        if let Some(price) = price {
            let (sum, count) = per_category.entry(a.category).or_default();
            *sum += u128::from(price);
            *count += 1;
        }
    }
    csv(
        "category,avg_price",
        per_category
            .into_iter()
            .map(|(category, (sum, count))| format!("{category},{}", fmt_cents_half_up(sum, count))),
    )
}

/// Per sliding window, every auction with the window's highest bid count.
fn q5(bids: Vec<&Bid>) -> String {
    let mut counts: BTreeMap<i64, BTreeMap<u64, u64>> = BTreeMap::new();
    for b in bids {
        for start in slides(b.date_time) {
            *counts.entry(start).or_default().entry(b.auction).or_default() += 1;
        }
    }
    let mut rows = Vec::new();
    for (start, per_auction) in counts {
        let max = per_auction.values().copied().max().expect("a window holds a bid");
        for (auction, num) in per_auction {
            if num == max {
                rows.push(format!("{auction},{num},{start},{}", start + WINDOW_MS));
            }
        }
    }
    csv("auction,num,window_start,window_end", rows)
}

/// Per seller, the average closing price of its last 10 auctions that have
/// one, in order of `(expires, id)`: at the end of the bounded input every
/// auction is closed.
fn q6(auctions: Vec<&Auction>, bids: Vec<&Bid>) -> String {
    let closing = closing_prices(&auctions, &bids);
    let mut per_seller: BTreeMap<u64, Vec<(i64, u64, u64)>> = BTreeMap::new();
    for (a, price) in auctions.iter().zip(closing) {
        if let Some(price) = price {
            per_seller.entry(a.seller).or_default().push((a.expires, a.id, price));
        }
    }
    let rows = per_seller.into_iter().map(|(seller, mut closed)| {
        closed.sort_unstable();
        let last = &closed[closed.len().saturating_sub(10)..];
        let sum: u128 = last.iter().map(|&(_, _, price)| u128::from(price)).sum();
        format!("{seller},{}", fmt_cents_half_up(sum, last.len() as u128))
    });
    csv("seller,avg_price", rows)
}

/// Per tumbling window, every bid at the window's highest price.
fn q7(bids: Vec<&Bid>) -> String {
    let mut max: BTreeMap<i64, u64> = BTreeMap::new();
    for b in &bids {
        let m = max.entry(tumble(b.date_time)).or_default();
        *m = (*m).max(b.price);
    }
    csv(
        "auction,price,bidder,dateTime",
        bids.iter()
            .filter(|b| b.price == max[&tumble(b.date_time)])
            .map(|b| format!("{},{},{},{}", b.auction, b.price, b.bidder, b.date_time)),
    )
}

/// People who opened an auction in the tumbling window they registered in:
/// one row per (person, window).
fn q8(persons: Vec<&Person>, auctions: Vec<&Auction>) -> String {
    let opened: BTreeSet<(u64, i64)> = auctions.iter().map(|a| (a.seller, tumble(a.date_time))).collect();
    let rows: BTreeSet<String> = persons
        .iter()
        .filter(|p| opened.contains(&(p.id, tumble(p.date_time))))
        .map(|p| format!("{},{},{}", p.id, p.name, tumble(p.date_time)))
        .collect();
    csv("id,name,window_start", rows)
}

// ---------------------------------------------------------------------------
// Self-check on hand-made events with hand-computed results
// ---------------------------------------------------------------------------

fn person(id: u64, name: &str, city: &str, state: &str, date_time: i64) -> Event {
    Event::Person(Person {
        id,
        name: name.into(),
        email_address: "x@y.com".into(),
        credit_card: "0000 0000 0000 0000".into(),
        city: city.into(),
        state: state.into(),
        date_time,
        extra: "".into(),
    })
}

fn auction(id: u64, seller: u64, category: u64, date_time: i64, expires: i64) -> Event {
    Event::Auction(Auction {
        id,
        item_name: "item".into(),
        description: "desc".into(),
        initial_bid: 1,
        reserve: 2,
        date_time,
        expires,
        seller,
        category,
        extra: "".into(),
    })
}

fn bid(auction: u64, bidder: u64, price: u64, date_time: i64) -> Event {
    Event::Bid(Bid {
        auction,
        bidder,
        price,
        channel: "Google".into(),
        url: "https://www.nexmark.com/a/b/c/item.htm?query=1".into(),
        date_time,
        extra: "".into(),
    })
}

fn check(query: &str, events: &[Event], expected_lines: &[&str]) {
    let expected: String = expected_lines.iter().map(|l| format!("{l}\n")).collect();
    let got = reference(query, events);
    assert_eq!(
        got, expected,
        "reference {query} disagrees with the hand-computed result"
    );
}

/// Runs every query on small hand-made inputs and compares with results
/// computed by hand; panics on the first difference. Covers ties (q5, q7),
/// both ends of an auction's bidding interval (q4), window boundaries
/// (q5, q7, q8), half-up rounding, order of arrival (q3) and the "last 10"
/// of q6.
pub fn self_check() {
    // Rounding.
    for (n, d, s) in [
        (5, 1000, "0.01"),
        (4_999, 1_000_000, "0.00"),
        (1, 8, "0.13"),
        (3, 8, "0.38"),
        (1, 3, "0.33"),
        (2, 3, "0.67"),
        (0, 7, "0.00"),
        (12_345, 1, "12345.00"),
        (100_000_000 * 908, 1000, "90800000.00"),
    ] {
        assert_eq!(fmt_cents_half_up(n, d), s, "fmt_cents_half_up({n}, {d})");
    }

    // No events: headers only.
    let headers = [
        "auction,bidder,price,dateTime",
        "auction,bidder,price,dateTime",
        "auction,price",
        "name,city,state,id",
        "category,avg_price",
        "auction,num,window_start,window_end",
        "seller,avg_price",
        "auction,price,bidder,dateTime",
        "id,name,window_start",
    ];
    for (q, h) in QUERIES.iter().zip(headers) {
        check(q, &[], &[h]);
    }

    // q0, q1, q2: sorted bytewise ("1000" < "1107" < "246").
    let events = [
        person(1, "Ann A", "Bend", "OR", 5),
        bid(1107, 2000, 1, 10),
        auction(1107, 1, 10, 6, 100),
        bid(1000, 2001, 3, 20),
        bid(0, 5, 125, 30),
        bid(246, 7, 100_000_000, 40),
    ];
    check(
        "q0",
        &events,
        &[
            "auction,bidder,price,dateTime",
            "0,5,125,30",
            "1000,2001,3,20",
            "1107,2000,1,10",
            "246,7,100000000,40",
        ],
    );
    // 0.908 * 1 = 0.908 -> 0.91 (up); 0.908 * 3 = 2.724 -> 2.72 (down).
    check(
        "q1",
        &events,
        &[
            "auction,bidder,price,dateTime",
            "0,5,113.50,30",
            "1000,2001,2.72,20",
            "1107,2000,0.91,10",
            "246,7,90800000.00,40",
        ],
    );
    check("q2", &events, &["auction,price", "0,125", "1107,1", "246,100000000"]);

    // q3: auction 16 arrives before its seller; AZ, category 11 and a
    // missing seller are left out.
    let events = [
        auction(16, 1, 10, 0, 10),
        person(1, "Ann A", "Bend", "OR", 1),
        person(2, "Bob B", "Boise", "ID", 2),
        person(3, "Cat C", "Phoenix", "AZ", 3),
        person(4, "Dan D", "Los Angeles", "CA", 4),
        auction(10, 1, 10, 5, 10),
        auction(11, 2, 10, 5, 10),
        auction(12, 3, 10, 5, 10),
        auction(13, 4, 11, 5, 10),
        auction(14, 4, 10, 5, 10),
        auction(15, 9, 10, 5, 10),
    ];
    check(
        "q3",
        &events,
        &[
            "name,city,state,id",
            "Ann A,Bend,OR,10",
            "Ann A,Bend,OR,16",
            "Bob B,Boise,ID,11",
            "Dan D,Los Angeles,CA,14",
        ],
    );

    // q4 and q6.
    let mut events = vec![
        // Auction 1 (seller 100, category 11) is open over [1000, 5000]:
        // bids at 1000 (7) and 5000 (9) count, 999 (200) and 5001 (100)
        // do not: closing price 9.
        auction(1, 100, 11, 1000, 5000),
        bid(1, 1, 200, 999),
        bid(1, 1, 7, 1000),
        bid(1, 1, 9, 5000),
        bid(1, 1, 100, 5001),
        // Auction 2 has no bid in time: no closing price.
        auction(2, 100, 11, 2000, 3000),
        bid(2, 1, 50, 3001),
        // Auction 3 (seller 101, category 11): 4. Category 11: (9 + 4) / 2.
        auction(3, 101, 11, 2000, 8000),
        bid(3, 1, 4, 2500),
        // Category 12, seller 101: 3 (two bids of 3), 1, 1: 5 / 3.
        auction(4, 101, 12, 0, 10),
        bid(4, 1, 3, 1),
        bid(4, 2, 3, 2),
        auction(5, 101, 12, 0, 10),
        bid(5, 1, 1, 1),
        auction(6, 101, 12, 0, 10),
        bid(6, 1, 1, 1),
    ];
    // Category 10, seller 102: seven auctions closing at 1, one at 2:
    // 9 / 8 = 1.125, rounded half up to 1.13.
    for id in 20..=27 {
        events.push(auction(id, 102, 10, 0, 100 + id as i64));
        events.push(bid(id, 1, if id == 27 { 2 } else { 1 }, 50));
    }
    // Category 13, seller 103: auctions 40..=51 close at id - 39 (1..=12),
    // and expire in the opposite order of their ids: the last 10 by expiry
    // are 40..=49 (prices 1..=10).
    for id in 40..=51 {
        events.push(auction(id, 103, 13, 0, 1000 - id as i64));
        events.push(bid(id, 1, id - 39, 0));
    }
    // Category 14, seller 104: auctions 60..=70 all expire at 500 and close
    // at id - 59 (1..=11): ties broken by id, the last 10 are 61..=70.
    for id in 60..=70 {
        events.push(auction(id, 104, 14, 0, 500));
        events.push(bid(id, 1, id - 59, 0));
    }
    check(
        "q4",
        &events,
        &[
            "category,avg_price",
            "10,1.13", // 9 / 8
            "11,6.50", // (9 + 4) / 2
            "12,1.67", // (3 + 1 + 1) / 3
            "13,6.50", // 78 / 12
            "14,6.00", // 66 / 11
        ],
    );
    check(
        "q6",
        &events,
        &[
            "seller,avg_price",
            "100,9.00", // auction 1 only
            "101,2.25", // (4 + 3 + 1 + 1) / 4
            "102,1.13", // 9 / 8
            "103,5.50", // (1 + ... + 10) / 10
            "104,6.50", // (2 + ... + 11) / 10
        ],
    );

    // q5: windows [s, s + 10000) for every multiple s of 2000. Bids at
    // 100000 (auctions 1 and 2), 103000 (1) and 111000 (3). The window
    // [90000, 100000) does not hold 100000; [92000, 102000) ties 1 and 2 at
    // one bid; [102000, 112000) ties 1 and 3.
    let events = [
        bid(1, 1, 10, 100_000),
        bid(2, 1, 10, 100_000),
        bid(1, 1, 10, 103_000),
        bid(3, 1, 10, 111_000),
    ];
    check(
        "q5",
        &events,
        &[
            "auction,num,window_start,window_end",
            "1,1,102000,112000",
            "1,1,92000,102000",
            "1,2,100000,110000",
            "1,2,94000,104000",
            "1,2,96000,106000",
            "1,2,98000,108000",
            "2,1,92000,102000",
            "3,1,102000,112000",
            "3,1,104000,114000",
            "3,1,106000,116000",
            "3,1,108000,118000",
            "3,1,110000,120000",
        ],
    );

    // q7: [100000, 110000) ties at 80 (79 is not the highest); 110000 opens
    // the next window, where 90 wins; 120000 is alone in its window.
    let events = [
        bid(1, 7, 79, 100_000),
        bid(2, 8, 80, 105_000),
        bid(3, 9, 80, 109_999),
        bid(4, 10, 90, 110_000),
        bid(5, 11, 10, 119_999),
        bid(6, 12, 5, 120_000),
    ];
    check(
        "q7",
        &events,
        &[
            "auction,price,bidder,dateTime",
            "2,80,8,105000",
            "3,80,9,109999",
            "4,90,10,110000",
            "6,5,12,120000",
        ],
    );

    // q8: Ann opens an auction at 109999, in her window [100000, 110000);
    // Bob's at 110000 is in the next one; Cat's two auctions give one row;
    // Dan opens none; seller 5 never registered; Ann's auction at 99999 is
    // before her window.
    let events = [
        auction(1, 1, 10, 99_999, 200_000),
        person(1, "Ann", "Bend", "OR", 100_000),
        person(2, "Bob", "Bend", "OR", 105_000),
        auction(2, 1, 10, 109_999, 200_000),
        auction(3, 2, 10, 110_000, 200_000),
        person(3, "Cat", "Bend", "OR", 120_000),
        auction(4, 3, 10, 121_000, 200_000),
        auction(5, 3, 10, 125_000, 200_000),
        person(4, "Dan", "Bend", "OR", 130_000),
        auction(6, 5, 10, 140_000, 200_000),
    ];
    check("q8", &events, &["id,name,window_start", "1,Ann,100000", "3,Cat,120000"]);
}
