//! Helpers shared by the integration tests.
#![deny(missing_docs)]
