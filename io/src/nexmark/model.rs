//! The three Nexmark record types (people, auctions, bids) and the event
//! that carries one of them.
//!
//! This module exists so that the generator, the JSON file format, the
//! queries and the reference implementation all share one definition of
//! what an event is. Times are event-time epoch milliseconds, money is
//! integer cents, and every string is an `Arc<str>`: the generator hands out
//! clones of pooled strings, so making an event allocates nothing.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A person registering with the auction site.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Person {
    /// Person id, unique, from 1000 on.
    pub id: u64,
    /// First and last name.
    pub name: Arc<str>,
    /// E-mail address.
    pub email_address: Arc<str>,
    /// Credit card number, four groups of four digits.
    pub credit_card: Arc<str>,
    /// City of residence.
    pub city: Arc<str>,
    /// US state of residence, two capital letters.
    pub state: Arc<str>,
    /// Registration time, epoch milliseconds.
    pub date_time: i64,
    /// Padding to a realistic record size.
    pub extra: Arc<str>,
}

/// An auction opened by a seller.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Auction {
    /// Auction id, unique, from 1000 on.
    pub id: u64,
    /// Name of the item on sale.
    pub item_name: Arc<str>,
    /// Description of the item.
    pub description: Arc<str>,
    /// Starting price, cents.
    pub initial_bid: u64,
    /// Reserve price, cents.
    pub reserve: u64,
    /// Opening time, epoch milliseconds.
    pub date_time: i64,
    /// Closing time, epoch milliseconds, after `date_time`.
    pub expires: i64,
    /// Id of the selling [`Person`].
    pub seller: u64,
    /// Category id.
    pub category: u64,
    /// Padding to a realistic record size.
    pub extra: Arc<str>,
}

/// A bid on an auction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Bid {
    /// Id of the [`Auction`] bid on.
    pub auction: u64,
    /// Id of the bidding [`Person`].
    pub bidder: u64,
    /// Offered price, cents.
    pub price: u64,
    /// Channel the bid came through.
    pub channel: Arc<str>,
    /// URL the bid came from.
    pub url: Arc<str>,
    /// Bid time, epoch milliseconds.
    pub date_time: i64,
    /// Padding to a realistic record size.
    pub extra: Arc<str>,
}

/// One Nexmark event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Event {
    /// A new person.
    Person(Person),
    /// A new auction.
    Auction(Auction),
    /// A new bid.
    Bid(Bid),
}

impl Event {
    /// The event time, epoch milliseconds.
    #[inline]
    pub fn date_time(&self) -> i64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }

    /// The person, if this is a person event.
    pub fn as_person(&self) -> Option<&Person> {
        match self {
            Event::Person(p) => Some(p),
            _ => None,
        }
    }

    /// The auction, if this is an auction event.
    pub fn as_auction(&self) -> Option<&Auction> {
        match self {
            Event::Auction(a) => Some(a),
            _ => None,
        }
    }

    /// The bid, if this is a bid event.
    pub fn as_bid(&self) -> Option<&Bid> {
        match self {
            Event::Bid(b) => Some(b),
            _ => None,
        }
    }
}
