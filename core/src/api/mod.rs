//! The user's entry: [`pipeline`] builds a typed dataflow and runs it, with
//! event-time windows ([`window`]), joins ([`join`]) and keyed process
//! functions ([`process`]);
//! [`harness`] drives a source or a sink by hand, for unit tests of
//! connectors. The top layer: it uses every layer below, and none uses it.

pub mod harness;
pub mod join;
pub(crate) mod pipeline;
pub mod process;
pub mod window;
