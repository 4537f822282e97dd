//! Cross-thread tests of the ring handoff (Outbox -> Inbox).
