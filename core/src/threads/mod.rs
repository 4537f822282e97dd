//! The threads weir runs besides the workers' loops, and how they find their
//! cores and each other: placement of helper threads ([`placement`]),
//! parking and waking ([`idle`], [`relay`]), a sink's own I/O thread
//! ([`io_thread`]) and work on a fixed grid of times ([`periodic`]).
//!
//! Below the checkpoint layer (its coordinator and snapshot spawner are such
//! threads) and the runtime; depends only on the crate root's base modules.

pub(crate) mod idle;
pub mod io_thread;
pub mod periodic;
pub(crate) mod placement;
pub(crate) mod relay;
