//! weir-io
