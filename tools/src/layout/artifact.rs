//! Opening a built artifact and reading the DWARF of every object in it.
//!
//! Accepted inputs: anything the `object` crate reads (ELF executables,
//! shared objects and relocatable `.o` files; Mach-O, PE and COFF too) and
//! `ar` archives of them (`.rlib`, `.a`), whose object members are read one
//! by one. Relocatable objects (`.o`, archive members) keep their DWARF
//! cross-section offsets in relocations; they are applied while reading
//! (see [`Relocations`]), so `.debug_str` names resolve correctly.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use object::read::RelocationMap;
use object::read::archive::ArchiveFile;
use object::{FileKind, Object, ObjectSection};

use super::dwarf::TypeGraph;
use super::error::LayoutError;
use super::model::TypeLayout;
use super::pattern::TypePattern;

/// How many near matches an error lists.
const NEAR_MATCHES: usize = 5;

/// The relocations that apply to one DWARF section, for gimli's
/// [`RelocateReader`](gimli::RelocateReader). Empty for linked files.
#[derive(Debug, Clone, Copy)]
pub struct Relocations<'a>(&'a RelocationMap);

impl gimli::read::Relocate<usize> for Relocations<'_> {
    fn relocate_address(&self, offset: usize, value: u64) -> gimli::Result<u64> {
        Ok(self.0.relocate(offset as u64, value))
    }

    fn relocate_offset(&self, offset: usize, value: usize) -> gimli::Result<usize> {
        <usize as gimli::ReaderOffset>::from_u64(self.0.relocate(offset as u64, value as u64))
    }
}

/// The gimli reader over one relocated section.
type SectionReader<'a> =
    gimli::RelocateReader<gimli::EndianSlice<'a, gimli::RunTimeEndian>, Relocations<'a>>;

/// A built artifact with the types of every object in it.
#[derive(Debug)]
pub struct Binary {
    path: PathBuf,
    /// One graph per object file that has DWARF (one for an executable,
    /// one per codegen unit for an `.rlib`).
    objects: Vec<TypeGraph>,
}

impl Binary {
    /// Reads `path` and the DWARF of every object in it.
    ///
    /// # Errors
    ///
    /// [`LayoutError::Read`] if the file cannot be read,
    /// [`LayoutError::NotObject`] if it is not an object file or archive,
    /// [`LayoutError::Object`] or [`LayoutError::Dwarf`] if it is
    /// malformed, and [`LayoutError::NoDebugInfo`] if no object in it has
    /// DWARF.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LayoutError> {
        let path = path.as_ref();
        let data = std::fs::read(path).map_err(|source| LayoutError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &data)
    }

    /// Reads the DWARF of the artifact whose bytes are `data`; `path` only
    /// names it in errors.
    ///
    /// # Errors
    ///
    /// As [`Binary::open`], without [`LayoutError::Read`].
    pub fn parse(path: &Path, data: &[u8]) -> Result<Self, LayoutError> {
        let kind = FileKind::parse(data).map_err(|source| LayoutError::NotObject {
            path: path.to_owned(),
            source,
        })?;
        let mut objects = Vec::new();
        if kind == FileKind::Archive {
            check_archive_bounds(data).map_err(|message| LayoutError::Archive {
                path: path.to_owned(),
                message,
            })?;
            let malformed = |source| LayoutError::Object {
                path: path.to_owned(),
                member: None,
                source,
            };
            let archive = ArchiveFile::parse(data).map_err(malformed)?;
            for member in archive.members() {
                let member = member.map_err(malformed)?;
                let name = String::from_utf8_lossy(member.name()).into_owned();
                let bytes = member.data(data).map_err(|source| LayoutError::Object {
                    path: path.to_owned(),
                    member: Some(name.clone()),
                    source,
                })?;
                // Members that are not object files (raw metadata, text)
                // carry no DWARF: skip them.
                if matches!(FileKind::parse(bytes), Err(_) | Ok(FileKind::Archive)) {
                    continue;
                }
                objects.extend(read_object(path, Some(&name), bytes)?);
            }
        } else {
            objects.extend(read_object(path, None, data)?);
        }
        if objects.is_empty() {
            return Err(LayoutError::NoDebugInfo {
                path: path.to_owned(),
            });
        }
        Ok(Self {
            path: path.to_owned(),
            objects,
        })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The number of object files with DWARF in the artifact.
    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    /// The layouts of every type `pattern` matches, sorted by name, with
    /// identical definitions (the same type emitted by several compile
    /// units or codegen units) reported once. Two different layouts under
    /// one name (two versions of a crate) are both reported.
    pub fn find(&self, pattern: &TypePattern) -> Vec<TypeLayout> {
        let mut seen = HashSet::new();
        let mut found = Vec::new();
        for graph in &self.objects {
            for layout in graph.layouts_matching(pattern) {
                if !seen.contains(&layout) {
                    seen.insert(layout.clone());
                    found.push(layout);
                }
            }
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        found
    }

    /// As [`Binary::find`], but an empty result is an error.
    ///
    /// # Errors
    ///
    /// [`LayoutError::TypeNotFound`], listing near matches.
    pub fn find_required(&self, pattern: &TypePattern) -> Result<Vec<TypeLayout>, LayoutError> {
        let found = self.find(pattern);
        if found.is_empty() {
            return Err(LayoutError::TypeNotFound {
                path: self.path.clone(),
                pattern: pattern.as_str().to_owned(),
                near: self.near_matches(pattern),
            });
        }
        Ok(found)
    }

    /// Names in the artifact that look like what `pattern` asks for.
    pub fn near_matches(&self, pattern: &TypePattern) -> Vec<String> {
        let names: BTreeSet<&str> = self.objects.iter().flat_map(TypeGraph::names).collect();
        pattern.near_matches(names, NEAR_MATCHES)
    }
}

/// The magic of a common (GNU, BSD, COFF) `ar` archive.
const AR_MAGIC: &[u8] = b"!<arch>\n";
/// The size of an `ar` member header.
const AR_HEADER: usize = 60;

/// Checks that every member of a common `ar` archive lies inside the file.
///
/// The object crate reads an archive whose first member (the symbol table)
/// runs past the end of the file as an archive with no members; a
/// truncated `.rlib` must be reported as such, not as "no debug info".
/// Thin and AIX archives are left to the object crate.
fn check_archive_bounds(data: &[u8]) -> Result<(), String> {
    if !data.starts_with(AR_MAGIC) {
        return Ok(());
    }
    let mut offset = AR_MAGIC.len();
    while offset < data.len() {
        let header = data
            .get(offset..offset.saturating_add(AR_HEADER))
            .ok_or_else(|| format!("member header at byte {offset} is cut off"))?;
        if header.get(58..60) != Some(&b"`\n"[..]) {
            return Err(format!("bad member header at byte {offset}"));
        }
        let size: usize = header
            .get(48..58)
            .and_then(|field| std::str::from_utf8(field).ok())
            .and_then(|field| field.trim().parse().ok())
            .ok_or_else(|| format!("bad member size at byte {offset}"))?;
        let end = offset
            .checked_add(AR_HEADER)
            .and_then(|start| start.checked_add(size))
            .filter(|&end| end <= data.len())
            .ok_or_else(|| {
                format!(
                    "member at byte {offset} declares {size} bytes but the file ends at byte {} (truncated?)",
                    data.len()
                )
            })?;
        // Members are padded to an even offset.
        offset = end.saturating_add(end & 1);
    }
    Ok(())
}

/// Reads the types of one object file; `None` if it has no DWARF.
fn read_object(
    path: &Path,
    member: Option<&str>,
    data: &[u8],
) -> Result<Option<TypeGraph>, LayoutError> {
    let malformed = |source| LayoutError::Object {
        path: path.to_owned(),
        member: member.map(str::to_owned),
        source,
    };
    let file = object::File::parse(data).map_err(malformed)?;
    let has_dwarf = [".debug_info", ".debug_types"]
        .iter()
        .any(|name| file.section_by_name(name).is_some_and(|s| s.size() > 0));
    if !has_dwarf {
        return Ok(None);
    }
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let sections =
        gimli::DwarfSections::load(|id| load_section(&file, id)).map_err(|e| match e {
            SectionError::Object(source) => malformed(source),
            SectionError::TooLarge { section, size } => LayoutError::SectionTooLarge {
                path: path.to_owned(),
                member: member.map(str::to_owned),
                section,
                size,
                limit: MAX_UNCOMPRESSED,
            },
        })?;
    let dwarf = sections.borrow(|(data, relocations): &(Cow<'_, [u8]>, RelocationMap)| {
        SectionReader::new(
            gimli::EndianSlice::new(data, endian),
            Relocations(relocations),
        )
    });
    let graph = TypeGraph::read(&dwarf).map_err(|source| LayoutError::Dwarf {
        path: path.to_owned(),
        member: member.map(str::to_owned),
        source,
    })?;
    // Line-tables-only debug info has units but no types.
    Ok((!graph.is_empty()).then_some(graph))
}

/// The most bytes one compressed debug section may inflate to. Real ones
/// are megabytes; a header that claims more is corrupt, and inflating it
/// would ask the allocator for whatever it says.
const MAX_UNCOMPRESSED: u64 = 1 << 30;

/// Why a debug section could not be loaded.
#[derive(Debug)]
enum SectionError {
    /// The object parser refused it.
    Object(object::Error),
    /// A compressed section claims more than [`MAX_UNCOMPRESSED`] bytes.
    TooLarge { section: &'static str, size: u64 },
}

impl From<object::Error> for SectionError {
    fn from(e: object::Error) -> Self {
        SectionError::Object(e)
    }
}

/// The (decompressed) bytes of one DWARF section and its relocations; empty
/// if the object has no such section.
fn load_section<'data>(
    file: &object::File<'data>,
    id: gimli::SectionId,
) -> Result<(Cow<'data, [u8]>, RelocationMap), SectionError> {
    let Some(section) = file.section_by_name(id.name()) else {
        return Ok((Cow::Borrowed(&[]), RelocationMap::default()));
    };
    // The size a compressed section's header claims is checked before
    // anything is allocated for it.
    let compressed = section.compressed_data()?;
    if compressed.format != object::CompressionFormat::None
        && compressed.uncompressed_size > MAX_UNCOMPRESSED
    {
        return Err(SectionError::TooLarge {
            section: id.name(),
            size: compressed.uncompressed_size,
        });
    }
    let data = compressed.decompress()?;
    let mut relocations = RelocationMap::default();
    for (offset, relocation) in section.relocations() {
        // Only absolute relocations matter to the entries rflayout reads
        // (string, abbreviation and type offsets). Others, such as TLS
        // offsets inside variable location expressions, cannot be mapped
        // and are skipped: they never touch a type.
        if relocations.add(file, offset, relocation).is_err() {
            continue;
        }
    }
    Ok((data, relocations))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An input the fuzzer found: a compressed debug section whose header
    /// claims about 2^60 bytes uncompressed. Inflating it asked the
    /// allocator for that much (AddressSanitizer aborts on the request);
    /// it is refused before anything is allocated.
    #[test]
    fn a_compressed_section_claiming_too_much_is_refused() {
        let data = include_bytes!("../../tests/data/compressed_section_claims_too_much.elf");
        let err = parse(data).expect_err("refused");
        assert!(
            matches!(err, LayoutError::SectionTooLarge { size, .. } if size > MAX_UNCOMPRESSED),
            "{err}"
        );
        assert!(err.to_string().contains("claims"), "{err}");
    }

    fn parse(data: &[u8]) -> Result<Binary, LayoutError> {
        Binary::parse(Path::new("input.bin"), data)
    }

    #[test]
    fn empty_text_and_random_bytes_are_not_objects() {
        let random: Vec<u8> = (0u32..4096)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for data in [&b""[..], b"hello, world\n", b"\x00", &random] {
            let err = parse(data).expect_err("not an object");
            assert!(matches!(err, LayoutError::NotObject { .. }), "{err}");
            assert!(err.to_string().starts_with("input.bin: not an object file"));
        }
    }

    #[test]
    fn a_truncated_elf_header_is_malformed() {
        // The first bytes of an x86_64 ELF executable, cut short.
        let mut header = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
        header.resize(40, 0);
        let err = parse(&header).expect_err("truncated");
        assert!(
            matches!(err, LayoutError::Object { member: None, .. }),
            "{err}"
        );
    }

    #[test]
    fn an_archive_without_objects_has_no_debug_info() {
        let archive =
            b"!<arch>\nnotes.txt/      0           0     0     644     6         `\nhello\n";
        let err = parse(archive).expect_err("no DWARF");
        assert!(matches!(err, LayoutError::NoDebugInfo { .. }), "{err}");
    }

    #[test]
    fn a_corrupt_or_truncated_archive_is_malformed() {
        let archive =
            b"!<arch>\nnotes.txt/      0           0     0     644     999       `\nhello\n";
        let err = parse(archive).expect_err("corrupt");
        assert!(matches!(err, LayoutError::Archive { .. }), "{err}");
        assert!(err.to_string().contains("declares 999 bytes"), "{err}");
        let err = parse(&archive[..30]).expect_err("cut header");
        assert!(err.to_string().contains("cut off"), "{err}");
        let mut bad = archive.to_vec();
        bad[8 + 48..8 + 58].copy_from_slice(b"12x4      ");
        let err = parse(&bad).expect_err("bad size");
        assert!(err.to_string().contains("bad member size"), "{err}");
    }

    #[test]
    fn a_missing_file_names_the_file() {
        let err = Binary::open("/nonexistent/rflayout/libx.rlib").expect_err("missing");
        assert!(matches!(err, LayoutError::Read { .. }));
        assert!(
            err.to_string()
                .starts_with("/nonexistent/rflayout/libx.rlib: cannot read")
        );
    }
}
