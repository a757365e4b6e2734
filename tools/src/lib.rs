//! ringfence tools: `rflayout` (struct layout audit from DWARF) and, later,
//! `rfbench` (the nixlbench-style benchmark).
#![deny(unsafe_code, missing_docs)]
