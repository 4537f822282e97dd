//! The Nexmark event file format: JSON Lines, one event per line.
//!
//! This module exists so that event files can be written once, read by any
//! system under comparison, and read back here, with one exact definition:
//! every line is one JSON object with every key of its type present and no
//! other key, times as integer epoch milliseconds and prices as integer
//! cents:
//!
//! ```text
//! {"type":"person","id":1000,"name":"…","emailAddress":"…","creditCard":"…","city":"…","state":"OR","dateTime":1700000000000,"extra":"…"}
//! {"type":"auction","id":1000,"itemName":"…","description":"…","initialBid":123,"reserve":456,"dateTime":…,"expires":…,"seller":1000,"category":10,"extra":"…"}
//! {"type":"bid","auction":1000,"bidder":1001,"price":789,"channel":"Google","url":"…","dateTime":…,"extra":"…"}
//! ```
//!
//! [`write_event`] writes keys in that order; [`parse_event`] accepts them
//! in any order and names what is wrong with a bad line (unknown type,
//! missing, unexpected or repeated key, wrong value type). [`parse_line`]
//! is the same parser in the shape [`crate::FileSource`] wants.

use std::fmt;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Serialize;

use super::generator::{NexmarkConfig, NexmarkGenerator};
use super::model::{Auction, Bid, Event, Person, Text};
use crate::error::IoContext;
use crate::lines::{malformed, LineInfo, ParseError};
use crate::{fsutil, Error, Result};

/// Fault point passed before the written events file's folder is fsynced.
const FAULT_EVENTS_DIRSYNC: &str = "nexmark.events_file.dirsync";

#[derive(Serialize)]
struct PersonLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: u64,
    name: &'a str,
    #[serde(rename = "emailAddress")]
    email_address: &'a str,
    #[serde(rename = "creditCard")]
    credit_card: &'a str,
    city: &'a str,
    state: &'a str,
    #[serde(rename = "dateTime")]
    date_time: i64,
    extra: &'a str,
}

#[derive(Serialize)]
struct AuctionLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: u64,
    #[serde(rename = "itemName")]
    item_name: &'a str,
    description: &'a str,
    #[serde(rename = "initialBid")]
    initial_bid: u64,
    reserve: u64,
    #[serde(rename = "dateTime")]
    date_time: i64,
    expires: i64,
    seller: u64,
    category: u64,
    extra: &'a str,
}

#[derive(Serialize)]
struct BidLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    auction: u64,
    bidder: u64,
    price: u64,
    channel: &'a str,
    url: &'a str,
    #[serde(rename = "dateTime")]
    date_time: i64,
    extra: &'a str,
}

/// Appends `event` to `out` as one line of the event file format, `\n`
/// included.
///
/// ```
/// use weir_io::nexmark::{event, parse_event, write_event, NexmarkConfig};
/// let e = event(&NexmarkConfig::default(), 7);
/// let mut line = Vec::new();
/// write_event(&e, &mut line);
/// assert!(line.starts_with(br#"{"type":"bid","auction":"#) && line.ends_with(b"}\n"));
/// assert_eq!(parse_event(&line).unwrap(), e);
/// ```
pub fn write_event(event: &Event, out: &mut Vec<u8>) {
    let written = match event {
        Event::Person(p) => serde_json::to_writer(
            &mut *out,
            &PersonLine {
                kind: "person",
                id: p.id,
                name: &p.name,
                email_address: &p.email_address,
                credit_card: &p.credit_card,
                city: &p.city,
                state: &p.state,
                date_time: p.date_time,
                extra: &p.extra,
            },
        ),
        Event::Auction(a) => serde_json::to_writer(
            &mut *out,
            &AuctionLine {
                kind: "auction",
                id: a.id,
                item_name: &a.item_name,
                description: &a.description,
                initial_bid: a.initial_bid,
                reserve: a.reserve,
                date_time: a.date_time,
                expires: a.expires,
                seller: a.seller,
                category: a.category,
                extra: &a.extra,
            },
        ),
        Event::Bid(b) => serde_json::to_writer(
            &mut *out,
            &BidLine {
                kind: "bid",
                auction: b.auction,
                bidder: b.bidder,
                price: b.price,
                channel: &b.channel,
                url: &b.url,
                date_time: b.date_time,
                extra: &b.extra,
            },
        ),
    };
    written.expect("serializing plain fields into memory cannot fail");
    out.push(b'\n');
}

/// The keys of the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Type,
    Id,
    Name,
    EmailAddress,
    CreditCard,
    City,
    State,
    DateTime,
    Extra,
    ItemName,
    Description,
    InitialBid,
    Reserve,
    Expires,
    Seller,
    Category,
    Auction,
    Bidder,
    Price,
    Channel,
    Url,
}

const KEYS: [Key; 21] = [
    Key::Type,
    Key::Id,
    Key::Name,
    Key::EmailAddress,
    Key::CreditCard,
    Key::City,
    Key::State,
    Key::DateTime,
    Key::Extra,
    Key::ItemName,
    Key::Description,
    Key::InitialBid,
    Key::Reserve,
    Key::Expires,
    Key::Seller,
    Key::Category,
    Key::Auction,
    Key::Bidder,
    Key::Price,
    Key::Channel,
    Key::Url,
];

const PERSON_KEYS: [Key; 9] = [
    Key::Type,
    Key::Id,
    Key::Name,
    Key::EmailAddress,
    Key::CreditCard,
    Key::City,
    Key::State,
    Key::DateTime,
    Key::Extra,
];
const AUCTION_KEYS: [Key; 11] = [
    Key::Type,
    Key::Id,
    Key::ItemName,
    Key::Description,
    Key::InitialBid,
    Key::Reserve,
    Key::DateTime,
    Key::Expires,
    Key::Seller,
    Key::Category,
    Key::Extra,
];
const BID_KEYS: [Key; 8] = [
    Key::Type,
    Key::Auction,
    Key::Bidder,
    Key::Price,
    Key::Channel,
    Key::Url,
    Key::DateTime,
    Key::Extra,
];

/// What JSON value a key holds.
enum ValueType {
    Unsigned,
    Signed,
    Text,
}

impl Key {
    fn name(self) -> &'static str {
        match self {
            Key::Type => "type",
            Key::Id => "id",
            Key::Name => "name",
            Key::EmailAddress => "emailAddress",
            Key::CreditCard => "creditCard",
            Key::City => "city",
            Key::State => "state",
            Key::DateTime => "dateTime",
            Key::Extra => "extra",
            Key::ItemName => "itemName",
            Key::Description => "description",
            Key::InitialBid => "initialBid",
            Key::Reserve => "reserve",
            Key::Expires => "expires",
            Key::Seller => "seller",
            Key::Category => "category",
            Key::Auction => "auction",
            Key::Bidder => "bidder",
            Key::Price => "price",
            Key::Channel => "channel",
            Key::Url => "url",
        }
    }

    fn from_name(name: &str) -> Option<Key> {
        Some(match name {
            "type" => Key::Type,
            "id" => Key::Id,
            "name" => Key::Name,
            "emailAddress" => Key::EmailAddress,
            "creditCard" => Key::CreditCard,
            "city" => Key::City,
            "state" => Key::State,
            "dateTime" => Key::DateTime,
            "extra" => Key::Extra,
            "itemName" => Key::ItemName,
            "description" => Key::Description,
            "initialBid" => Key::InitialBid,
            "reserve" => Key::Reserve,
            "expires" => Key::Expires,
            "seller" => Key::Seller,
            "category" => Key::Category,
            "auction" => Key::Auction,
            "bidder" => Key::Bidder,
            "price" => Key::Price,
            "channel" => Key::Channel,
            "url" => Key::Url,
            _ => return None,
        })
    }

    fn value_type(self) -> ValueType {
        match self {
            Key::Id
            | Key::InitialBid
            | Key::Reserve
            | Key::Seller
            | Key::Category
            | Key::Auction
            | Key::Bidder
            | Key::Price => ValueType::Unsigned,
            Key::DateTime | Key::Expires => ValueType::Signed,
            _ => ValueType::Text,
        }
    }
}

#[derive(Debug, Clone)]
enum Value {
    Unsigned(u64),
    Signed(i64),
    Text(Arc<str>),
}

/// The values of one line, by key.
struct Fields([Option<Value>; 21]);

impl Fields {
    fn unsigned(&mut self, kind: &str, k: Key) -> Result<u64, String> {
        match self.take(kind, k)? {
            Value::Unsigned(v) => Ok(v),
            _ => unreachable!("key {} holds an unsigned integer", k.name()),
        }
    }

    fn signed(&mut self, kind: &str, k: Key) -> Result<i64, String> {
        match self.take(kind, k)? {
            Value::Signed(v) => Ok(v),
            _ => unreachable!("key {} holds an integer", k.name()),
        }
    }

    fn text(&mut self, kind: &str, k: Key) -> Result<Text, String> {
        match self.take(kind, k)? {
            Value::Text(v) => Ok(Text::Shared(v)),
            _ => unreachable!("key {} holds a string", k.name()),
        }
    }

    fn take(&mut self, kind: &str, k: Key) -> Result<Value, String> {
        self.0[k as usize]
            .take()
            .ok_or_else(|| format!("{kind}: missing key \"{}\"", k.name()))
    }

    /// Fails on a key that is present but not one of `allowed`.
    fn check_only(&self, kind: &str, allowed: &[Key]) -> Result<(), String> {
        for k in KEYS {
            if self.0[k as usize].is_some() && !allowed.contains(&k) {
                return Err(format!("{kind}: unexpected key \"{}\"", k.name()));
            }
        }
        Ok(())
    }

    fn into_event(mut self) -> Result<Event, String> {
        let kind = match self.0[Key::Type as usize].take() {
            Some(Value::Text(t)) => t,
            Some(_) => unreachable!("type holds a string"),
            None => return Err("missing key \"type\"".to_string()),
        };
        match &*kind {
            "person" => {
                self.check_only("person", &PERSON_KEYS)?;
                Ok(Event::Person(Person {
                    id: self.unsigned("person", Key::Id)?,
                    name: self.text("person", Key::Name)?,
                    email_address: self.text("person", Key::EmailAddress)?,
                    credit_card: self.text("person", Key::CreditCard)?,
                    city: self.text("person", Key::City)?,
                    state: self.text("person", Key::State)?,
                    date_time: self.signed("person", Key::DateTime)?,
                    extra: self.text("person", Key::Extra)?,
                }))
            }
            "auction" => {
                self.check_only("auction", &AUCTION_KEYS)?;
                Ok(Event::Auction(Auction {
                    id: self.unsigned("auction", Key::Id)?,
                    item_name: self.text("auction", Key::ItemName)?,
                    description: self.text("auction", Key::Description)?,
                    initial_bid: self.unsigned("auction", Key::InitialBid)?,
                    reserve: self.unsigned("auction", Key::Reserve)?,
                    date_time: self.signed("auction", Key::DateTime)?,
                    expires: self.signed("auction", Key::Expires)?,
                    seller: self.unsigned("auction", Key::Seller)?,
                    category: self.unsigned("auction", Key::Category)?,
                    extra: self.text("auction", Key::Extra)?,
                }))
            }
            "bid" => {
                self.check_only("bid", &BID_KEYS)?;
                Ok(Event::Bid(Bid {
                    auction: self.unsigned("bid", Key::Auction)?,
                    bidder: self.unsigned("bid", Key::Bidder)?,
                    price: self.unsigned("bid", Key::Price)?,
                    channel: self.text("bid", Key::Channel)?,
                    url: self.text("bid", Key::Url)?,
                    date_time: self.signed("bid", Key::DateTime)?,
                    extra: self.text("bid", Key::Extra)?,
                }))
            }
            other => Err(format!(
                "unknown type {other:?}: expected \"person\", \"auction\" or \"bid\""
            )),
        }
    }
}

/// A key of the format, read without allocating.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
        Key::from_name(s).ok_or_else(|| E::custom(format!("unknown key {s:?}")))
    }
}

/// A string value, straight into an `Arc<str>`.
struct TextSeed;

impl<'de> DeserializeSeed<'de> for TextSeed {
    type Value = Arc<str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Arc<str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for TextSeed {
    type Value = Arc<str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Arc<str>, E> {
        Ok(Arc::from(s))
    }
}

/// The top-level object of a line.
struct LineVisitor;

impl<'de> Visitor<'de> for LineVisitor {
    type Value = Fields;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
        let mut fields = Fields(Default::default());
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if fields.0[key as usize].is_some() {
                return Err(de::Error::custom(format!("repeated key \"{}\"", key.name())));
            }
            let in_key = |e: A::Error| de::Error::custom(format!("key \"{}\": {e}", key.name()));
            let value = match key.value_type() {
                ValueType::Unsigned => Value::Unsigned(map.next_value::<u64>().map_err(in_key)?),
                ValueType::Signed => Value::Signed(map.next_value::<i64>().map_err(in_key)?),
                ValueType::Text => Value::Text(map.next_value_seed(TextSeed).map_err(in_key)?),
            };
            fields.0[key as usize] = Some(value);
        }
        Ok(fields)
    }
}

/// Parses one line of the event file format (a trailing `\n` or `\r\n` is
/// allowed). The error names what is wrong: not JSON, unknown type, a
/// missing, unexpected or repeated key, or a value of the wrong type.
///
/// ```
/// use weir_io::nexmark::parse_event;
/// let e = parse_event(br#"{"type":"bid","auction":1000,"bidder":1001,"price":"12"}"#).unwrap_err();
/// assert!(e.contains("key \"price\"") && e.contains("expected u64"), "{e}");
/// ```
pub fn parse_event(line: &[u8]) -> Result<Event, String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err("empty line: expected a JSON object".to_string());
    }
    let mut de = serde_json::Deserializer::from_slice(line);
    let fields = de.deserialize_map(LineVisitor).map_err(json_error)?;
    de.end()
        .map_err(|e| format!("unexpected text after the JSON object: {}", json_error(e)))?;
    fields.into_event()
}

/// serde_json's message with the position as a column of the line (its
/// "line 1" would be misleading for a line of a file).
fn json_error(e: serde_json::Error) -> String {
    let shown = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    match shown.strip_suffix(&position) {
        Some(message) if e.column() > 0 => format!("{message} (column {})", e.column()),
        Some(message) => message.to_string(),
        None => shown,
    }
}

/// [`parse_event`] as a [`crate::FileSource`] parse function.
///
/// ```no_run
/// use weir_io::{nexmark, FileSource};
/// let src: FileSource<nexmark::Event, _> = FileSource::new("events.jsonl", 0, 1, nexmark::parse_line);
/// # let _ = src;
/// ```
pub fn parse_line(line: &[u8], _: &LineInfo<'_>) -> Result<Event, ParseError> {
    parse_event(line).map_err(ParseError::from)
}

/// Writes events `0..n_events` of the stream configured by `cfg` to `path`,
/// one line each, durably: into a temporary file beside it, fsynced, renamed
/// over `path`, and the folder fsynced. `path` is complete or unchanged.
pub fn write_events_file(path: impl AsRef<Path>, cfg: &NexmarkConfig, n_events: u64) -> Result<()> {
    let path = path.as_ref();
    let generator = NexmarkGenerator::new(*cfg)?;
    let name = path.file_name().ok_or_else(|| Error::InvalidConfig {
        setting: "path",
        value: path.display().to_string(),
        reason: "must name a file",
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(".tmp");
    let temp = dir.join(temp_name);
    let written = (|| {
        let mut file = File::create(&temp).ctx("create", &temp)?;
        let mut buf = Vec::with_capacity(crate::files::READ_CHUNK + 4096);
        for n in 0..n_events {
            write_event(&generator.event(n), &mut buf);
            if buf.len() >= crate::files::READ_CHUNK {
                file.write_all(&buf).ctx("write", &temp)?;
                buf.clear();
            }
        }
        file.write_all(&buf).ctx("write", &temp)?;
        weir_core::disk::sync_all(&file).ctx("fsync", &temp)
    })();
    if let Err(e) = written {
        let _ = fsutil::remove_if_exists(&temp);
        return Err(e);
    }
    std::fs::rename(&temp, path).map_err(|e| {
        let _ = fsutil::remove_if_exists(&temp);
        Error::io(format!("rename {} to", temp.display()), path, e)
    })?;
    fsutil::sync_dir(dir, FAULT_EVENTS_DIRSYNC)
}

/// Reads an event file written by [`write_events_file`] (or any file of the
/// format). A bad line fails with [`Error::Malformed`] naming the file, the
/// line number and the reason.
pub fn read_events_file(path: impl AsRef<Path>) -> Result<Vec<Event>> {
    let path = path.as_ref();
    let data = std::fs::read(path).ctx("read", path)?;
    let mut events = Vec::with_capacity(data.len() / 160);
    let mut lines = data.split(|&b| b == b'\n').peekable();
    let mut number = 0u64;
    while let Some(line) = lines.next() {
        number += 1;
        if line.is_empty() && lines.peek().is_none() {
            break; // After the last '\n'.
        }
        let event = parse_event(line).map_err(|reason| malformed(&path.display().to_string(), number, reason, line))?;
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::nexmark::generator::{event, NexmarkGenerator};

    fn line_of(e: &Event) -> String {
        let mut out = Vec::new();
        write_event(e, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn sample_bid() -> Bid {
        Bid {
            auction: 1001,
            bidder: 1002,
            price: 12345,
            channel: "Google".into(),
            url: "https://x/\"q\"".into(),
            date_time: 1_700_000_000_123,
            extra: "".into(),
        }
    }

    #[test]
    fn lines_have_exactly_the_documented_keys_in_order() {
        let person = Event::Person(Person {
            id: 1000,
            name: "Peter Shultz".into(),
            email_address: "ab@cd.com".into(),
            credit_card: "0001 0002 0003 0004".into(),
            city: "Bend".into(),
            state: "OR".into(),
            date_time: 1_700_000_000_000,
            extra: "xyz".into(),
        });
        assert_eq!(
            line_of(&person),
            r#"{"type":"person","id":1000,"name":"Peter Shultz","emailAddress":"ab@cd.com","creditCard":"0001 0002 0003 0004","city":"Bend","state":"OR","dateTime":1700000000000,"extra":"xyz"}"#
                .to_string()
                + "\n"
        );
        let auction = Event::Auction(Auction {
            id: 1003,
            item_name: "thing".into(),
            description: "a thing".into(),
            initial_bid: 100,
            reserve: 250,
            date_time: 5,
            expires: 9,
            seller: 1000,
            category: 12,
            extra: "".into(),
        });
        assert_eq!(
            line_of(&auction),
            r#"{"type":"auction","id":1003,"itemName":"thing","description":"a thing","initialBid":100,"reserve":250,"dateTime":5,"expires":9,"seller":1000,"category":12,"extra":""}"#
                .to_string()
                + "\n"
        );
        assert_eq!(
            line_of(&Event::Bid(sample_bid())),
            r#"{"type":"bid","auction":1001,"bidder":1002,"price":12345,"channel":"Google","url":"https://x/\"q\"","dateTime":1700000000123,"extra":""}"#
                .to_string()
                + "\n"
        );
        for e in [person, auction, Event::Bid(sample_bid())] {
            assert_eq!(parse_event(line_of(&e).as_bytes()).unwrap(), e);
        }
    }

    #[test]
    fn keys_may_come_in_any_order() {
        let line = br#" {"extra":"","dateTime":1700000000123,"url":"https://x/\"q\"","channel":"Google","price":12345,"bidder":1002,"auction":1001,"type":"bid"} "#;
        assert_eq!(parse_event(line).unwrap(), Event::Bid(sample_bid()));
        assert_eq!(
            parse_event(format!("{}\r\n", line_of(&Event::Bid(sample_bid())).trim_end()).as_bytes()).unwrap(),
            Event::Bid(sample_bid())
        );
    }

    fn error_of(line: &str) -> String {
        parse_event(line.as_bytes()).expect_err(line)
    }

    #[test]
    fn bad_lines_are_refused_with_a_clear_reason() {
        let good = line_of(&Event::Bid(sample_bid()));
        let good = good.trim_end();
        let cases: Vec<(String, &str)> = vec![
            (
                good.replace(r#""type":"bid""#, r#""type":"bet""#),
                r#"unknown type "bet""#,
            ),
            (good.replace(r#""type":"bid","#, ""), r#"missing key "type""#),
            (good.replace(r#""price":12345,"#, ""), r#"bid: missing key "price""#),
            (
                good.replace(r#""extra":"""#, r#""extra":"","id":3"#),
                r#"bid: unexpected key "id""#,
            ),
            (
                good.replace(r#""extra":"""#, r#""extra":"","colour":3"#),
                r#"unknown key "colour""#,
            ),
            (
                good.replace(r#""extra":"""#, r#""extra":"","price":3"#),
                r#"repeated key "price""#,
            ),
            (
                good.replace("12345", r#""12345""#),
                r#"key "price": invalid type: string "12345", expected u64"#,
            ),
            (
                good.replace("12345", "123.5"),
                r#"key "price": invalid type: floating point"#,
            ),
            (
                good.replace("12345", "-5"),
                r#"key "price": invalid value: integer `-5`, expected u64"#,
            ),
            (
                good.replace(r#""Google""#, "null"),
                r#"key "channel": invalid type: null, expected a string"#,
            ),
            (
                good.replace("1700000000123", r#""2023-11-14""#),
                r#"key "dateTime": invalid type: string"#,
            ),
            (
                format!("{good} x"),
                "unexpected text after the JSON object: trailing characters (column 138)",
            ),
            (format!("[{good}]"), "expected a JSON object"),
            (good[..40].to_string(), "EOF while parsing"),
            (String::new(), "empty line"),
            ("   ".to_string(), "empty line"),
        ];
        for (line, expected) in cases {
            let e = error_of(&line);
            assert!(
                e.contains(expected),
                "line {line:?}: got {e:?}, expected it to contain {expected:?}"
            );
        }
        // Every key of each type is required.
        for e in [event(&NexmarkConfig::default(), 0), event(&NexmarkConfig::default(), 1)] {
            let line = line_of(&e);
            let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&line).unwrap();
            for key in object.keys().filter(|k| *k != "type") {
                let mut without = object.clone();
                without.remove(key);
                let e = error_of(&serde_json::to_string(&without).unwrap());
                assert!(e.contains(&format!("missing key \"{key}\"")), "{e}");
            }
        }
    }

    #[test]
    fn parse_line_fits_file_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let cfg = NexmarkConfig {
            seed: 4,
            ..Default::default()
        };
        write_events_file(&path, &cfg, 1234).unwrap();
        let mut src = crate::FileSource::new(&path, 0, 1, parse_line);
        let mut h = weir_core::harness::Harness::new(0, 1);
        let mut got = Vec::new();
        loop {
            let mut out = Vec::new();
            let status = h.poll_source(&mut src, &mut out, 100).unwrap();
            got.extend(out);
            if status == weir_core::SourcePoll::Done {
                break;
            }
        }
        let expected: Vec<Event> = (0..1234).map(|n| event(&cfg, n)).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn events_files_round_trip_durably() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let cfg = NexmarkConfig {
            seed: 8,
            events_per_second: 777,
            ..Default::default()
        };
        write_events_file(&path, &cfg, 5000).unwrap();
        let expected: Vec<Event> = (0..5000).map(|n| event(&cfg, n)).collect();
        assert_eq!(read_events_file(&path).unwrap(), expected);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 5000);
        assert!(text.ends_with('\n'));
        // Only the file itself is left in the folder; writing again replaces it.
        write_events_file(&path, &cfg, 10).unwrap();
        assert_eq!(read_events_file(&path).unwrap(), expected[..10]);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("events.jsonl")]);
        // An empty stream is an empty file.
        write_events_file(&path, &cfg, 0).unwrap();
        assert_eq!(read_events_file(&path).unwrap(), vec![]);
        // A bad config writes nothing.
        let bad = NexmarkConfig {
            events_per_second: 0,
            ..cfg
        };
        let other = dir.path().join("other.jsonl");
        assert!(write_events_file(&other, &bad, 10).is_err());
        assert!(!other.exists());
    }

    #[test]
    fn a_bad_line_in_a_file_is_named_by_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.jsonl");
        let good = line_of(&Event::Bid(sample_bid()));
        std::fs::write(&path, format!("{good}{good}{{\"type\":\"bid\"}}\n{good}")).unwrap();
        let e = read_events_file(&path).unwrap_err();
        match &e {
            Error::Malformed { file, line, reason, .. } => {
                assert_eq!((file.as_str(), *line), (path.to_str().unwrap(), 3));
                assert!(reason.contains("bid: missing key \"auction\""), "{reason}");
            }
            other => panic!("expected Malformed, got {other}"),
        }
        let shown = e.to_string();
        assert!(shown.contains("bad.jsonl, line 3"), "{shown}");
        // A missing file is named too.
        let e = read_events_file(dir.path().join("absent.jsonl"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("absent.jsonl"), "{e}");
        // A last line without '\n' counts; an empty line in the middle does not parse.
        std::fs::write(&path, format!("{good}{}", good.trim_end())).unwrap();
        assert_eq!(read_events_file(&path).unwrap().len(), 2);
        std::fs::write(&path, format!("{good}\n{good}")).unwrap();
        let e = read_events_file(&path).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("empty line"), "{e}");
    }

    fn text() -> impl Strategy<Value = Text> {
        any::<String>().prop_map(Text::from)
    }

    fn any_event() -> impl Strategy<Value = Event> {
        let person = (
            any::<u64>(),
            text(),
            text(),
            text(),
            text(),
            text(),
            any::<i64>(),
            text(),
        )
            .prop_map(
                |(id, name, email_address, credit_card, city, state, date_time, extra)| {
                    Event::Person(Person {
                        id,
                        name,
                        email_address,
                        credit_card,
                        city,
                        state,
                        date_time,
                        extra,
                    })
                },
            );
        let auction = (
            (any::<u64>(), text(), text(), any::<u64>(), any::<u64>()),
            (any::<i64>(), any::<i64>(), any::<u64>(), any::<u64>(), text()),
        )
            .prop_map(
                |(
                    (id, item_name, description, initial_bid, reserve),
                    (date_time, expires, seller, category, extra),
                )| {
                    Event::Auction(Auction {
                        id,
                        item_name,
                        description,
                        initial_bid,
                        reserve,
                        date_time,
                        expires,
                        seller,
                        category,
                        extra,
                    })
                },
            );
        let bid = (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            text(),
            text(),
            any::<i64>(),
            text(),
        )
            .prop_map(|(auction, bidder, price, channel, url, date_time, extra)| {
                Event::Bid(Bid {
                    auction,
                    bidder,
                    price,
                    channel,
                    url,
                    date_time,
                    extra,
                })
            });
        prop_oneof![person, auction, bid]
    }

    proptest! {
        #[test]
        fn generated_events_round_trip(seed in any::<u64>(), n in prop_oneof![0..1_000_000u64, any::<u64>()], rate in 1..100_000_000u64) {
            let cfg = NexmarkConfig { seed, events_per_second: rate, ..Default::default() };
            let e = event(&cfg, n);
            let line = line_of(&e);
            prop_assert!(line.ends_with('\n'));
            prop_assert_eq!(line.matches('\n').count(), 1);
            prop_assert_eq!(parse_event(line.as_bytes()).unwrap(), e);
        }

        #[test]
        fn any_event_round_trips(e in any_event()) {
            let line = line_of(&e);
            prop_assert_eq!(line.matches('\n').count(), 1, "{}", line);
            prop_assert_eq!(parse_event(line.as_bytes()).unwrap(), e);
        }
    }

    /// Release-mode speed of writing and parsing event lines:
    /// `cargo test --release -p weir-io nexmark_json_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run by hand in release mode"]
    fn nexmark_json_speed() {
        let g = NexmarkGenerator::new(NexmarkConfig::default()).unwrap();
        let n = 2_000_000;
        let mut events = Vec::with_capacity(n);
        g.events_into(0, 1, n, &mut events);
        let start = std::time::Instant::now();
        let mut text = Vec::with_capacity(n * 200);
        for e in &events {
            write_event(e, &mut text);
        }
        let wrote = start.elapsed().as_secs_f64();
        // Parsed events are checked and dropped at once, as a source's
        // consumer would.
        let start = std::time::Instant::now();
        let mut lines = 0;
        for (line, expected) in text.split(|&b| b == b'\n').zip(&events) {
            assert!(parse_event(line).unwrap() == *expected);
            lines += 1;
        }
        let read = start.elapsed().as_secs_f64();
        assert_eq!(lines, n);
        let start = std::time::Instant::now();
        let _ = NexmarkGenerator::new(NexmarkConfig::default()).unwrap();
        let pools = start.elapsed().as_secs_f64();
        println!(
            "nexmark JSON: {n} events, {:.0} bytes/event; write {:.2} M events/s ({:.0} MB/s), parse {:.2} M events/s ({:.0} MB/s); a generator's pools take {:.1} ms",
            text.len() as f64 / n as f64,
            n as f64 / wrote / 1e6,
            text.len() as f64 / wrote / 1e6,
            n as f64 / read / 1e6,
            text.len() as f64 / read / 1e6,
            pools * 1e3,
        );
    }
}
