//! The only code in this crate allowed to be unsafe: raw memory access on
//! behalf of RMA operations. Everything here takes addresses that the caller
//! has validated against a live registration.
#![allow(unsafe_code)]

pub(crate) mod mem;
pub(crate) mod notify;
pub(crate) mod peer;
