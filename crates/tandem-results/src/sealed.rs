//! Binary results files that are read back (`checkpoint.bin`, `model.bin`) carry a header with
//! their length and a CRC-32 of their contents, so a file changed after Tandem wrote it (a
//! flipped bit, bytes cut off or appended) is refused on load instead of resuming or
//! predicting silently from other values. Files written before the header existed have none and
//! are read as they are ([`Opened::Unsealed`]).
//!
//! Layout: the 8 bytes `TANDEMS1`, the contents' length (u64, little endian), the CRC-32 of the
//! length's 8 bytes followed by the contents (u32, little endian), then the contents.

use std::path::{Path, PathBuf};

/// The first bytes of a sealed file (the format's version is its last character).
const MAGIC: &[u8; 8] = b"TANDEMS1";
const HEADER: usize = MAGIC.len() + 8 + 4;

/// `contents` behind a header with their length and checksum.
pub fn seal(contents: &[u8]) -> Vec<u8> {
    let length = (contents.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(HEADER + contents.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&length);
    out.extend_from_slice(&checksum(&length, contents).to_le_bytes());
    out.extend_from_slice(contents);
    out
}

/// The length of `contents` bytes sealed.
pub(crate) fn sealed_len(contents: usize) -> usize {
    HEADER + contents
}

fn checksum(length: &[u8], contents: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(length);
    hasher.update(contents);
    hasher.finalize()
}

/// A file's contents, checked or (written before files were sealed) as they are.
#[derive(Debug, PartialEq)]
pub enum Opened<'a> {
    Sealed(&'a [u8]),
    Unsealed(&'a [u8]),
}

impl<'a> Opened<'a> {
    pub fn contents(&self) -> &'a [u8] {
        match self {
            Opened::Sealed(contents) | Opened::Unsealed(contents) => contents,
        }
    }
}

/// Why a sealed file's bytes are not what was written.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SealError {
    #[error("it is truncated: {held} of its {written} bytes are there")]
    Truncated { written: u64, held: u64 },
    #[error("{extra} bytes were appended after the {written} bytes written")]
    Appended { written: u64, extra: u64 },
    #[error("its contents differ from what was written (checksum mismatch)")]
    Checksum,
    #[error("its header is damaged or cut short")]
    Header,
    #[error("its format `{0}` is not this build's: written by a newer Tandem, or damaged")]
    Newer(String),
}

/// The contents of a file's `bytes`: checked against the header when there is one.
pub fn open(bytes: &[u8]) -> Result<Opened<'_>, SealError> {
    let start = &bytes[..bytes.len().min(MAGIC.len())];
    if start != MAGIC {
        let differing = start.iter().zip(MAGIC).filter(|(a, b)| a != b).count();
        let whole = start.len() == MAGIC.len();
        return match differing {
            _ if !whole && MAGIC.starts_with(start) => Err(SealError::Header),
            // A newer version of the format: the same name, another version character.
            1 if whole && start[..7] == MAGIC[..7] => {
                Err(SealError::Newer(String::from_utf8_lossy(start).into_owned()))
            }
            // One or two bytes of the name changed: a sealed file whose header was damaged;
            // files that were never sealed (Burn records, part lists) start far from it.
            1 | 2 if whole => Err(SealError::Header),
            _ => Ok(Opened::Unsealed(bytes)),
        };
    }
    let Some(header) = bytes.get(..HEADER) else { return Err(SealError::Header) };
    let length: [u8; 8] = header[MAGIC.len()..MAGIC.len() + 8].try_into().expect("8 bytes");
    let recorded = u32::from_le_bytes(header[MAGIC.len() + 8..].try_into().expect("4 bytes"));
    let (written, held) = (u64::from_le_bytes(length), (bytes.len() - HEADER) as u64);
    let contents = &bytes[HEADER..];
    if checksum(&length, contents) == recorded {
        return Ok(Opened::Sealed(contents));
    }
    if held != written && checksum(&held.to_le_bytes(), contents) == recorded {
        // The contents are whole; the length in the header changed.
        return Err(SealError::Header);
    }
    match usize::try_from(written).ok().and_then(|w| contents.get(..w)) {
        Some(prefix) if held > written && checksum(&length, prefix) == recorded => {
            Err(SealError::Appended { written, extra: held - written })
        }
        _ if held < written => Err(SealError::Truncated { written, held }),
        _ => Err(SealError::Checksum),
    }
}

/// A sealed file that cannot be used as it is, named.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {problem}")]
    Damaged { path: PathBuf, problem: SealError },
    /// A patch ([`crate::patched`]) that is whole but does not apply.
    #[error("{path}: {problem}")]
    Patch { path: PathBuf, problem: &'static str },
}

/// Reads the file at `path` and checks it ([`open`]); returns its contents and whether it was
/// sealed.
pub fn read_sealed(path: &Path) -> Result<(Vec<u8>, bool), ReadError> {
    let mut bytes = std::fs::read(path).map_err(|source| ReadError::Io { path: path.to_path_buf(), source })?;
    let header = match open(&bytes).map_err(|problem| ReadError::Damaged { path: path.to_path_buf(), problem })? {
        Opened::Sealed(contents) => bytes.len() - contents.len(),
        Opened::Unsealed(_) => 0,
    };
    bytes.drain(..header);
    Ok((bytes, header > 0))
}

/// Writes `contents` sealed to `path`, atomically.
pub fn write_sealed(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    crate::write_atomic(path, &seal(contents))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_contents_come_back() {
        for contents in [&b""[..], b"x", &[7u8; 1000]] {
            assert_eq!(open(&seal(contents)), Ok(Opened::Sealed(contents)));
        }
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let contents: Vec<u8> = (0..97u8).map(|i| i.wrapping_mul(31)).collect();
        let sealed = seal(&contents);
        for bit in 0..sealed.len() * 8 {
            let mut damaged = sealed.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(open(&damaged).is_err(), "bit {bit} flipped went unnoticed");
        }
    }

    #[test]
    fn cut_and_appended_bytes_are_named_as_such() {
        let sealed = seal(&[1, 2, 3, 4]);
        assert_eq!(open(&sealed[..sealed.len() - 1]), Err(SealError::Truncated { written: 4, held: 3 }));
        assert_eq!(open(&sealed[..HEADER - 1]), Err(SealError::Header));
        assert_eq!(open(&sealed[..3]), Err(SealError::Header));
        let mut longer = sealed.clone();
        longer.extend([0, 0]);
        assert_eq!(open(&longer), Err(SealError::Appended { written: 4, extra: 2 }));
        let mut newer = sealed;
        newer[7] = b'2';
        assert!(matches!(open(&newer), Err(SealError::Newer(_))));
    }

    #[test]
    fn files_written_before_sealing_are_read_as_they_are() {
        // A part list (a checkpoint) and a Burn record start far from the header's name.
        for bytes in [&[11u8, 0, 0, 0, 0, 0, 0, 0, b'p'][..], b"{\"metadata\""] {
            assert_eq!(open(bytes), Ok(Opened::Unsealed(bytes)));
        }
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.bin");
        write_sealed(&path, b"parameters").unwrap();
        assert_eq!(read_sealed(&path).unwrap(), (b"parameters".to_vec(), true));
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 4;
        std::fs::write(&path, bytes).unwrap();
        let message = read_sealed(&path).unwrap_err().to_string();
        assert!(message.contains("model.bin") && message.contains("checksum"), "{message}");
    }
}
