//! Durability: the bottom layer of weir-core. Every byte weir writes to disk
//! goes through the virtual file system ([`vfs`]), so that the storage
//! simulation and the fault points ([`fault`]) see every durable step; syncs
//! are timed and counted ([`disk`]); damaged bytes found on the way back
//! are reported with file and position ([`corruption`]).
//!
//! Depends on nothing in weir-core but the crate root's base modules.

pub mod corruption;
pub mod disk;
pub mod fault;
pub mod vfs;
