//! The three Nexmark record types (people, auctions, bids) and the event
//! that carries one of them.
//!
//! This module exists so that the generator, the JSON file format, the
//! queries and the reference implementation all share one definition of
//! what an event is. Times are event-time epoch milliseconds, money is
//! integer cents, and every string is a [`Text`]: the generator hands out
//! pooled strings, so making an event allocates nothing and touches no
//! reference count.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A string of an event, in 16 bytes.
///
/// Generated events hold strings of the generator's pools, built once per
/// process and kept for its lifetime (a bounded set: they come from a fixed
/// vocabulary): a pooled text is the address of its pool entry, so making
/// one reads nothing, and copying one copies a pointer, with no reference
/// count to touch. With `Arc<str>` a bid cost three atomic increments where it was
/// made and three decrements where it was dropped, usually on another
/// core, so each count's cache line moved between the cores: q0-q3 and q8
/// run markedly faster without (docs/notebook/docs-2026-12.md, "Nexmark's
/// pooled strings").
/// Events read from a file hold shared heap strings. Equality, order and
/// hashing are those of the text.
#[derive(Clone)]
pub enum Text {
    /// A string of the generator's pools: the address of its entry (a thin
    /// pointer, so that the enum fits in the 16 bytes of `Arc<str>`).
    Pooled(&'static &'static str),
    /// A string read from elsewhere (a file).
    Shared(Arc<str>),
}

impl Text {
    /// The text.
    #[inline]
    pub fn as_str(&self) -> &str {
        match self {
            Text::Pooled(s) => s,
            Text::Shared(s) => s,
        }
    }
}

impl std::ops::Deref for Text {
    type Target = str;
    #[inline]
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::borrow::Borrow<str> for Text {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Text::Shared(Arc::from(s))
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Text::Shared(Arc::from(s))
    }
}

impl From<Arc<str>> for Text {
    fn from(s: Arc<str>) -> Self {
        Text::Shared(s)
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Text {}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::hash::Hash for Text {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

impl PartialOrd for Text {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Text {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Straight from the input's `str` into the shared text: one
        // allocation, where going through a `String` made two and a copy
        // (state decodes texts on the hot path of keyed queries).
        struct TextVisitor;
        impl serde::de::Visitor<'_> for TextVisitor {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text::Shared(Arc::from(v)))
            }
        }
        d.deserialize_str(TextVisitor)
    }
}

/// A person registering with the auction site.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Person {
    /// Person id, unique, from 1000 on.
    pub id: u64,
    /// First and last name.
    pub name: Text,
    /// E-mail address.
    pub email_address: Text,
    /// Credit card number, four groups of four digits.
    pub credit_card: Text,
    /// City of residence.
    pub city: Text,
    /// US state of residence, two capital letters.
    pub state: Text,
    /// Registration time, epoch milliseconds.
    pub date_time: i64,
    /// Padding to a realistic record size.
    pub extra: Text,
}

/// An auction opened by a seller.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Auction {
    /// Auction id, unique, from 1000 on.
    pub id: u64,
    /// Name of the item on sale.
    pub item_name: Text,
    /// Description of the item.
    pub description: Text,
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
    pub extra: Text,
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
    pub channel: Text,
    /// URL the bid came from.
    pub url: Text,
    /// Bid time, epoch milliseconds.
    pub date_time: i64,
    /// Padding to a realistic record size.
    pub extra: Text,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};

    fn hash(t: &Text) -> u64 {
        let mut h = DefaultHasher::new();
        t.hash(&mut h);
        h.finish()
    }

    /// A pooled and a shared string of the same text are the same value:
    /// equal, same hash (as `str`'s, for `Borrow<str>` lookups), same order,
    /// same serialized form; a shared one comes back from serde.
    #[test]
    fn pooled_and_shared_text_are_interchangeable() {
        let pooled = Text::Pooled(&"channel-7");
        assert_eq!(std::mem::size_of::<Text>(), 16);
        assert_eq!(std::mem::size_of::<Person>(), 112, "moved whole through batches");
        let shared = Text::from("channel-7");
        assert_eq!(pooled, shared);
        assert_eq!(hash(&pooled), hash(&shared));
        let mut h = DefaultHasher::new();
        "channel-7".hash(&mut h);
        assert_eq!(hash(&pooled), h.finish());
        let (a, b) = (Text::Pooled(&"a"), Text::from("b"));
        assert!(a < b);
        assert_eq!(b.cmp(&a), std::cmp::Ordering::Greater);
        assert_eq!(a.cmp(&Text::from("a")), std::cmp::Ordering::Equal);
        assert_eq!(pooled, "channel-7");
        assert_eq!(format!("{pooled} {shared:?}"), "channel-7 \"channel-7\"");
        let bytes = postcard::to_stdvec(&pooled).unwrap();
        assert_eq!(bytes, postcard::to_stdvec(&shared).unwrap());
        let back: Text = postcard::from_bytes(&bytes).unwrap();
        assert!(matches!(&back, Text::Shared(s) if &**s == "channel-7"));
        // JSON: borrowed from the input, or unescaped into a buffer first.
        let plain: Text = serde_json::from_str(r#""channel-7""#).unwrap();
        assert_eq!(plain, "channel-7");
        let escaped: Text = serde_json::from_str(r#""a\"b\u00e9""#).unwrap();
        assert_eq!(escaped, "a\"b\u{e9}");
        assert!(serde_json::from_str::<Text>("7").is_err());
    }
}
