//! The Nexmark benchmark's data: its event model, a deterministic
//! generator, a replayable source and the event file format.
//!
//! Nexmark models an online auction site: people register, open auctions
//! and bid on them. Its queries (selections, joins, windowed aggregates)
//! are the common yardstick of stream processors; this module makes the
//! input they run on.
//!
//! - [`model`]: [`Person`], [`Auction`], [`Bid`] and [`Event`].
//! - [`generator`]: event number `n` as a pure function of
//!   ([`NexmarkConfig`], `n`), following the public Nexmark generator.
//! - [`source`]: [`NexmarkSource`], the generator as a replayable weir
//!   source split across parallel subtasks by event number.
//! - [`json`]: the JSON Lines event file format, [`write_events_file`] and
//!   [`read_events_file`], and [`parse_line`] for [`crate::FileSource`].
//!
//! ```
//! use weir_io::nexmark::{event, Event, NexmarkConfig};
//! let cfg = NexmarkConfig { seed: 1, ..Default::default() };
//! // Blocks of 50 events: 1 person, 3 auctions, 46 bids.
//! assert!(matches!(event(&cfg, 50), Event::Person(_)));
//! assert!(matches!(event(&cfg, 51), Event::Auction(_)));
//! assert!(matches!(event(&cfg, 54), Event::Bid(_)));
//! ```

pub mod generator;
pub mod json;
pub mod model;
pub mod source;

pub use generator::{event, event_kind, EventKind, NexmarkConfig, NexmarkGenerator};
pub use json::{parse_event, parse_line, read_events_file, write_event, write_events_file};
pub use model::{Auction, Bid, Event, Person, Text};
pub use source::NexmarkSource;
