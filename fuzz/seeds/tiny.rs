#![no_std]
#[repr(C)]
pub struct Slot { pub tag: u8, pub value: u64, pub flags: u16 }
#[unsafe(no_mangle)]
pub static RF_SEED_SLOT: Slot = Slot { tag: 1, value: 2, flags: 3 };
