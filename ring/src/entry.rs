//! What may live in a ring slot.

/// A fixed-size, plain-old-data ring entry: [`Sqe`](crate::Sqe) or
/// [`Cqe`](crate::Cqe).
///
/// This trait is sealed: ring slots live in memory that another process (or
/// C code) writes, so the only types allowed in them are ones for which every
/// bit pattern is a valid value.
///
/// # Safety
/// Implementors are `#[repr(C)]`, contain only integers, have no padding
/// whose value matters, and are valid for every bit pattern. Only this crate
/// implements the trait.
pub unsafe trait Entry: Copy + Send + Sync + 'static + private::Sealed {
    /// The all-zero entry, written into slots that are handed out for
    /// filling in place.
    const ZERO: Self;
}

pub(crate) mod private {
    pub trait Sealed {}
}
