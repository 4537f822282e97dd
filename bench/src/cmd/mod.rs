//! The production commands: what a user runs jobs and inspects their
//! checkpoints with. They build on [`crate::cli`], weir-core and weir-io
//! only, never on the lab (`lab/`).

pub mod checkpoints;
pub mod nexmark;
pub mod run;
