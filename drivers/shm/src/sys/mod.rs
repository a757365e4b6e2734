//! The only code in this crate allowed to be unsafe: raw access to shared
//! mappings, RMA on behalf of [`Driver::post`](ringfence::Driver::post)
//! (and through the hot key, which holds raw pointers into the mappings
//! it keeps alive),
//! adopting descriptors received with `SCM_RIGHTS`, and the memfd memory
//! handed to the worker as [`DriverMemory`](ringfence::DriverMemory).
//!
//! Every address that comes from the engine (an [`Op`](ringfence::Op)'s
//! local range) was validated against a live local registration, which the
//! engine holds until the operation completes: that is the `Driver::post`
//! contract, and the SAFETY comments below cite it. Every offset into a
//! shared mapping is bounds-checked here, whatever the caller checked.
#![allow(unsafe_code)]

pub(crate) mod alloc;
pub(crate) mod fdpass;
pub(crate) mod hot;
pub(crate) mod region;
pub(crate) mod rma;
pub(crate) mod robust;
