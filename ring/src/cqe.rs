//! The completion queue entry: 16 bytes.

use crate::entry::{Entry, private::Sealed};
use crate::value::{CqeFlags, UnknownValue};
use crate::{Status, status::UnknownStatus};
use static_assertions::{assert_eq_size, const_assert_eq};

/// A completion queue entry: the result of one operation, exactly 16 bytes.
///
/// ABI (mirrored by `struct rf_cqe` in C); offsets are pinned below.
///
/// # Examples
/// ```
/// use ringfence_ring::{Cqe, Status};
/// let ok = Cqe::new(7, 4096, 0);
/// assert_eq!(ok.result(), Ok(4096));
/// let failed = Cqe::new(8, Status::OutOfBounds.as_raw(), 0);
/// assert_eq!(failed.result(), Err(Ok(Status::OutOfBounds)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Cqe {
    /// The `user_data` of the SQE this completes (or of the notification
    /// buffer, for an incoming notification).
    pub user_data: u64,
    /// Zero or more: success (bytes moved where that applies). Negative: a
    /// [`Status`].
    pub res: i32,
    /// [`CqeFlags`], raw, with a buffer id in the upper 16 bits.
    pub flags: u32,
}

assert_eq_size!(Cqe, [u8; 16]);
const_assert_eq!(core::mem::align_of::<Cqe>(), 8);
const_assert_eq!(core::mem::offset_of!(Cqe, user_data), 0);
const_assert_eq!(core::mem::offset_of!(Cqe, res), 8);
const_assert_eq!(core::mem::offset_of!(Cqe, flags), 12);

impl Sealed for Cqe {}

// SAFETY: `Cqe` is `repr(C)`, made only of integers, with no padding (8 + 4 +
// 4 bytes at the offsets above), so every bit pattern is a valid value.
unsafe impl Entry for Cqe {
    const ZERO: Cqe = Cqe::new(0, 0, 0);
}

/// Bits 16..32 of [`Cqe::flags`]: a notification's buffer id.
pub const CQE_BUFFER_SHIFT: u32 = 16;

impl Cqe {
    /// A CQE with these raw fields.
    #[inline]
    pub const fn new(user_data: u64, res: i32, flags: u32) -> Cqe {
        Cqe {
            user_data,
            res,
            flags,
        }
    }

    /// A CQE reporting `status` for the operation tagged `user_data`.
    #[inline]
    pub const fn error(user_data: u64, status: Status) -> Cqe {
        Cqe::new(user_data, status.as_raw(), 0)
    }

    /// `Ok(res)` for a success; `Err` with the decoded status otherwise
    /// (itself an `Err` if the value is not one this version knows).
    #[inline]
    pub fn result(&self) -> Result<u32, Result<Status, UnknownStatus>> {
        if self.res >= 0 {
            Ok(self.res as u32)
        } else {
            Err(Status::try_from(self.res))
        }
    }

    /// The decoded flags.
    ///
    /// # Errors
    /// [`UnknownValue`] if an unknown flag bit is set.
    #[inline]
    pub fn flags(&self) -> Result<CqeFlags, UnknownValue> {
        CqeFlags::try_from(self.flags)
    }

    /// The buffer id of an incoming notification, `None` for any other CQE.
    #[inline]
    pub const fn buffer_id(&self) -> Option<u16> {
        if self.flags & CqeFlags::NOTIFICATION.bits() != 0 {
            Some((self.flags >> CQE_BUFFER_SHIFT) as u16)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_and_results() {
        assert_eq!(core::mem::size_of::<Cqe>(), 16);
        assert_eq!(Cqe::ZERO, Cqe::default());
        assert_eq!(Cqe::new(1, 0, 0).result(), Ok(0));
        assert_eq!(
            Cqe::error(1, Status::Canceled).result(),
            Err(Ok(Status::Canceled))
        );
        assert_eq!(Cqe::new(1, -500, 0).result(), Err(Err(UnknownStatus(-500))));
    }

    #[test]
    fn notification_buffer_ids() {
        let note = Cqe::new(
            9,
            12,
            CqeFlags::NOTIFICATION.bits() | (0xbeef << CQE_BUFFER_SHIFT),
        );
        assert_eq!(note.buffer_id(), Some(0xbeef));
        assert_eq!(note.flags(), Ok(CqeFlags::try_from(note.flags).unwrap()));
        assert_eq!(Cqe::new(9, 0, 0xbeef << CQE_BUFFER_SHIFT).buffer_id(), None);
        assert!(Cqe::new(0, 0, 0x4).flags().is_err());
    }
}
