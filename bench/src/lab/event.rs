//! The benchmark's record: 32 bytes, plain data.

/// One benchmark event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[repr(C)]
pub struct Event {
    /// Partitioning key, in `0..keys`.
    pub key: u64,
    /// Payload; the keyed pipeline replaces it by the key's running sum.
    pub value: u64,
    /// Emission time on `weir_core::clock` (scheduled time when rated).
    pub emitted_ns: u64,
    /// Global sequence number from the generator.
    pub seq: u64,
}

const _: () = assert!(std::mem::size_of::<Event>() == 32);
