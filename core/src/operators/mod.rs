//! The operators a pipeline is made of, on top of the runtime's calling
//! convention ([`crate::runtime::collector`]): stateless ones
//! ([`stateless`]: map, filter, flat_map, the sink at a chain's end), keyed
//! processing with per-key state ([`keyed`], [`process`] with its
//! [`timers`]), event time ([`time`]), windows ([`window`]) and joins
//! ([`join`]). [`stores`] hosts an operator's state stores through
//! checkpoints.

pub mod join;
pub mod keyed;
pub mod process;
pub(crate) mod stateless;
pub(crate) mod stores;
pub mod time;
pub mod timers;
pub mod window;
