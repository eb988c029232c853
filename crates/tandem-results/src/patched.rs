//! A file rewritten at every evaluation point whose contents change only in part (a run's
//! checkpoint: the protocols' per-sample caches and replay buffers change where samples were
//! seen): written once whole, as a sealed base, then as sealed patches `NAME.patch-1`,
//! `NAME.patch-2`, … that each say how to make the new contents from the previous ones (copy
//! these bytes, add those), so a write costs in proportion to what changed. The contents are cut
//! into chunks where their bytes say (a rolling hash, as rsync and backup tools do): bytes
//! inserted or removed early move the chunk boundaries after them along, so what follows is still
//! found. The patches are folded into a new base when together they would outgrow it. Every
//! file is written atomically; a patch names the base it applies to and the checksum of the
//! contents it makes, so a patch left from another base is never applied and a damaged one is
//! refused.
//!
//! Patch layout (the contents of a sealed file): `TANDEMP2`; the base's length (u64) and CRC-32
//! (u32); the patch's number (u64, from 1); the length (u64) and CRC-32 (u32) of the contents
//! after it; then operations to the end: `0`, offset and length (u64 each): copy that range of
//! the previous contents; `1`, length (u64) and the bytes: add them. Little endian throughout.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::sealed::{read_sealed, write_sealed, ReadError};

const MAGIC: &[u8; 8] = b"TANDEMP2";
/// Chunks are at least this long, at most [`MAX_CHUNK`], about a KiB more than this on average.
const MIN_CHUNK: usize = 256;
const MAX_CHUNK: usize = 8192;
/// A chunk ends where the rolling hash's top 10 bits are zero.
const BOUNDARY_SHIFT: u32 = 64 - 10;
const COPY: u8 = 0;
const ADD: u8 = 1;

/// Writes a file as a base and patches. Its first write is always a base (what is on disk from
/// an earlier process is replaced).
#[derive(Debug)]
pub struct PatchedFile {
    path: PathBuf,
    last: Option<Written>,
}

/// What this writer last wrote.
#[derive(Debug)]
struct Written {
    base: Identity,
    patches: u64,
    patch_bytes: u64,
    /// The chunks of the contents as last written: a hash of each, and where it lies.
    chunks: HashMap<u64, Range<usize>>,
}

/// A version of the contents: its length and CRC-32.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Identity {
    len: u64,
    crc: u32,
}

impl Identity {
    fn of(contents: &[u8]) -> Self {
        Self { len: contents.len() as u64, crc: crc32fast::hash(contents) }
    }
}

/// What one write put on disk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriteCost {
    /// Bytes written: the sealed base or patch.
    pub bytes: u64,
    /// A whole base (else a patch).
    pub whole: bool,
}

impl PatchedFile {
    /// The writer of the file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), last: None }
    }

    /// The base's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes `contents` what [`read_patched`] returns: a patch from the last write's contents,
    /// or a new base where there was none or the patches would outgrow it.
    pub fn write(&mut self, contents: &[u8]) -> std::io::Result<WriteCost> {
        let (now, chunks) = (Identity::of(contents), hashed_chunks(contents));
        if let Some(last) = &mut self.last {
            let patch = patch_bytes(last, contents, now, &chunks);
            let sealed_len = crate::sealed::sealed_len(patch.len()) as u64;
            if last.patch_bytes + sealed_len <= last.base.len {
                write_sealed(&patch_path(&self.path, last.patches + 1), &patch)?;
                last.patches += 1;
                last.patch_bytes += sealed_len;
                last.chunks = index(chunks);
                return Ok(WriteCost { bytes: sealed_len, whole: false });
            }
        }
        // Patches go first: should the process stop before the new base is written, the old
        // base alone (an earlier, consistent point) is what is read. Should this fail, the next
        // write is a base again.
        self.last = None;
        remove_patches(&self.path)?;
        write_sealed(&self.path, contents)?;
        self.last = Some(Written { base: now, patches: 0, patch_bytes: 0, chunks: index(chunks) });
        Ok(WriteCost { bytes: crate::sealed::sealed_len(contents.len()) as u64, whole: true })
    }

    /// Removes the base and its patches.
    pub fn remove(&mut self) -> std::io::Result<()> {
        self.last = None;
        remove_patches(&self.path)?;
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// The contents [`PatchedFile::write`] last wrote to `path`: the base (sealed, or a file written
/// before sealing, as it is) with its patches applied in order, each checked; and whether the
/// base was sealed. Patches of another base, left by a process stopped while it replaced them,
/// are not applied.
pub fn read_patched(path: &Path) -> Result<(Vec<u8>, bool), ReadError> {
    let (mut contents, sealed) = read_sealed(path)?;
    let base = Identity::of(&contents);
    for number in 1.. {
        let patch = patch_path(path, number);
        if !patch.is_file() {
            break;
        }
        let (bytes, _) = read_sealed(&patch)?;
        match apply(&mut contents, &bytes, base, number) {
            Ok(true) => {}
            Ok(false) => break,
            Err(problem) => return Err(ReadError::Patch { path: patch, problem }),
        }
    }
    Ok((contents, sealed))
}

/// Applies patch `number` of `base` to `contents`: `Ok(false)` (contents untouched) when the
/// patch belongs to another base or has another number.
fn apply(contents: &mut Vec<u8>, patch: &[u8], base: Identity, number: u64) -> Result<bool, &'static str> {
    let mut input = Fields(patch);
    if input.take(MAGIC.len())? != MAGIC {
        return Err("not a patch of this format");
    }
    let of = Identity { len: input.u64()?, crc: input.u32()? };
    if of != base || input.u64()? != number {
        return Ok(false);
    }
    let after = Identity { len: input.u64()?, crc: input.u32()? };
    let mut made = Vec::with_capacity(usize::try_from(after.len).unwrap_or(0).min(contents.len() * 2 + (1 << 20)));
    while !input.0.is_empty() {
        let op = input.take(1)?[0];
        let len = usize::try_from(input.u64()?).map_err(|_| "a length does not fit this machine")?;
        match op {
            COPY => {
                let from = usize::try_from(input.u64()?).map_err(|_| "an offset does not fit this machine")?;
                let copied = from.checked_add(len).and_then(|end| contents.get(from..end));
                made.extend_from_slice(copied.ok_or("it copies bytes past the end of the contents before it")?);
            }
            ADD => made.extend_from_slice(input.take(len)?),
            _ => return Err("an operation is neither copy nor add"),
        }
    }
    if Identity::of(&made) != after {
        return Err("applied, it does not give the contents that were written (checksum mismatch)");
    }
    *contents = made;
    Ok(true)
}

/// A patch of `last`'s base making `contents` (whose identity is `after`, cut into `chunks`) from
/// the contents `last` wrote: each chunk found there copied, the others added.
fn patch_bytes(last: &Written, contents: &[u8], after: Identity, chunks: &[(u64, Range<usize>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&last.base.len.to_le_bytes());
    out.extend_from_slice(&last.base.crc.to_le_bytes());
    out.extend_from_slice(&(last.patches + 1).to_le_bytes());
    out.extend_from_slice(&after.len.to_le_bytes());
    out.extend_from_slice(&after.crc.to_le_bytes());
    // Runs of adjacent copies, and of added chunks, become one operation each.
    let mut pending: Option<(u8, Range<usize>)> = None;
    let flush = |out: &mut Vec<u8>, (op, range): (u8, Range<usize>)| {
        out.push(op);
        out.extend_from_slice(&(range.len() as u64).to_le_bytes());
        match op {
            COPY => out.extend_from_slice(&(range.start as u64).to_le_bytes()),
            _ => out.extend_from_slice(&contents[range]),
        }
    };
    for (hash, chunk) in chunks {
        let (op, range) = match last.chunks.get(hash).filter(|r| r.len() == chunk.len()) {
            Some(previous) => (COPY, previous.clone()),
            None => (ADD, chunk.clone()),
        };
        pending = match pending {
            Some((o, r)) if o == op && r.end == range.start => Some((op, r.start..range.end)),
            Some(done) => {
                flush(&mut out, done);
                Some((op, range))
            }
            None => Some((op, range)),
        };
    }
    if let Some(done) = pending {
        flush(&mut out, done);
    }
    out
}

/// Where `contents` are cut: after a byte where a rolling hash of the bytes before it (a gear
/// hash: each byte's random value, shifted a place per byte after it) has its top bits zero, so
/// the same bytes are cut the same way wherever they lie.
fn chunks(contents: &[u8]) -> Vec<Range<usize>> {
    let mut cuts = Vec::with_capacity(contents.len() / 1024 + 1);
    let (mut start, mut rolling) = (0, 0u64);
    for (i, &byte) in contents.iter().enumerate() {
        rolling = (rolling << 1).wrapping_add(GEAR[byte as usize]);
        let len = i + 1 - start;
        if (len >= MIN_CHUNK && rolling >> BOUNDARY_SHIFT == 0) || len >= MAX_CHUNK {
            cuts.push(start..i + 1);
            (start, rolling) = (i + 1, 0);
        }
    }
    if start < contents.len() {
        cuts.push(start..contents.len());
    }
    cuts
}

/// The chunks of `contents`, each with its hash.
fn hashed_chunks(contents: &[u8]) -> Vec<(u64, Range<usize>)> {
    chunks(contents).into_iter().map(|chunk| (hash(&contents[chunk.clone()]), chunk)).collect()
}

/// Chunks by their hash (the first where two are the same).
fn index(chunks: Vec<(u64, Range<usize>)>) -> HashMap<u64, Range<usize>> {
    let mut index = HashMap::with_capacity(chunks.len());
    for (hash, chunk) in chunks {
        index.entry(hash).or_insert(chunk);
    }
    index
}

/// A chunk's 64-bit hash (SipHash: two chunks of the same length taken for each other with odds
/// of 2⁻⁶⁴, and then the patch's checksum refuses it when read).
fn hash(chunk: &[u8]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    chunk.hash(&mut hasher);
    hasher.finish()
}

/// A random value per byte value (SplitMix64 from a fixed seed), for the rolling hash.
const GEAR: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut state = 0u64;
    let mut i = 0;
    while i < 256 {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        table[i] = z ^ (z >> 31);
        i += 1;
    }
    table
};

/// Patch `number` of the file at `path`.
pub fn patch_path(path: &Path, number: u64) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".patch-{number}"));
    path.with_file_name(name)
}

/// Removes every patch of the file at `path` (whatever its number: a stopped process may have
/// left some).
fn remove_patches(path: &Path) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let prefix = format!("{}.patch-", path.file_name().unwrap_or_default().to_string_lossy());
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        entries => entries?,
    };
    let mut patches: Vec<(u64, PathBuf)> = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(number) = name.to_str().and_then(|n| n.strip_prefix(&prefix)).and_then(|n| n.parse().ok()) {
            patches.push((number, entry.path()));
        }
    }
    // The first first: a stop part-way leaves a gap at 1, so none of the rest is read.
    patches.sort();
    for (_, patch) in patches {
        std::fs::remove_file(patch)?;
    }
    Ok(())
}

/// Reads a patch's fields in order.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("it is cut short");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` pseudo-random bytes (xorshift from `seed`).
    fn random(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn a_write_costs_about_what_changed_even_when_bytes_before_it_move() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.bin");
        let mut file = PatchedFile::new(&path);
        let mut state = random(1 << 20, 1);
        let first = file.write(&state).unwrap();
        assert!(first.whole && first.bytes > 1 << 20);
        // Three bytes changed; 40 bytes inserted near the start (a longer number in a part
        // before the large ones); 10 KiB rewritten; a tail cut off.
        type Edit = fn(&mut Vec<u8>);
        let edits: [(&str, Edit); 4] = [
            ("three bytes", |s| [1000, 500_000, 1_000_000].iter().for_each(|&i| s[i] ^= 0x5A)),
            ("40 bytes inserted", |s| drop(s.splice(100..100, [7u8; 40]))),
            ("10 KiB rewritten", |s| s[300_000..310_240].copy_from_slice(&random(10_240, 9))),
            ("the tail cut", |s| s.truncate(900_000)),
        ];
        for (what, edit) in edits {
            edit(&mut state);
            let cost = file.write(&state).unwrap();
            assert!(!cost.whole, "{what}");
            // Each change costs the chunks around it: at most two of the longest on each side.
            let bound = if what.starts_with("10 KiB") { 10_240 + 4 * MAX_CHUNK } else { 12 * MAX_CHUNK };
            assert!(cost.bytes < bound as u64, "{what}: {} bytes written", cost.bytes);
            assert_eq!(read_patched(&path).unwrap(), (state.clone(), true), "{what}");
        }
        assert!(patch_path(&path, 4).is_file() && !patch_path(&path, 5).exists());
    }

    #[test]
    fn patches_fold_into_a_new_base_when_they_would_outgrow_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.bin");
        let mut file = PatchedFile::new(&path);
        let mut costs = Vec::new();
        for (state, seed) in [(0, 1), (1, 1), (2, 2), (3, 3)] {
            // Half rewritten each time: a base, a patch, then a base again.
            let mut contents = random(100_000, 1);
            contents[..50_000].copy_from_slice(&random(50_000, 10 + seed + state));
            costs.push(file.write(&contents).unwrap().whole);
            assert_eq!(read_patched(&path).unwrap().0, contents);
        }
        assert_eq!(costs, [true, false, true, false]);
        assert!(patch_path(&path, 1).is_file() && !patch_path(&path, 2).exists());
        file.remove().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn patches_of_another_base_are_not_applied_and_damaged_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.bin");
        let mut file = PatchedFile::new(&path);
        let (a, mut b) = (random(20_000, 1), random(20_000, 1));
        file.write(&a).unwrap();
        b[5] ^= 1;
        file.write(&b).unwrap();
        // A stale patch: another base's, or left beside a base a later process rewrote.
        let stale = std::fs::read(patch_path(&path, 1)).unwrap();
        let mut other = PatchedFile::new(&path);
        other.write(&random(20_000, 3)).unwrap();
        assert!(!patch_path(&path, 1).exists());
        std::fs::write(patch_path(&path, 1), &stale).unwrap();
        assert_eq!(read_patched(&path).unwrap().0, random(20_000, 3));
        // A patch of this base whose added bytes were changed after it was written.
        std::fs::remove_file(patch_path(&path, 1)).unwrap();
        let mut c = random(20_000, 3);
        c[15_000] ^= 1;
        other.write(&c).unwrap();
        let sealed = std::fs::read(patch_path(&path, 1)).unwrap();
        let contents = crate::sealed::open(&sealed).unwrap().contents().to_vec();
        let mut forged = contents.clone();
        let added = forged.iter().rposition(|_| true).unwrap() - 100;
        forged[added] ^= 1;
        std::fs::write(patch_path(&path, 1), crate::sealed::seal(&forged)).unwrap();
        let err = read_patched(&path).unwrap_err().to_string();
        assert!(err.contains("c.bin.patch-1") && err.contains("checksum"), "{err}");
        // Cut short, or a flipped bit in the file (the seal's to find).
        std::fs::write(patch_path(&path, 1), crate::sealed::seal(&contents[..contents.len() - 3])).unwrap();
        assert!(read_patched(&path).unwrap_err().to_string().contains("cut short"));
        let mut flipped = sealed.clone();
        flipped[40] ^= 1;
        std::fs::write(patch_path(&path, 1), flipped).unwrap();
        assert!(read_patched(&path).unwrap_err().to_string().contains("c.bin.patch-1"));
    }

    #[test]
    fn a_gap_in_the_patches_ends_what_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.bin");
        let mut file = PatchedFile::new(&path);
        let mut state = random(40_000, 5);
        file.write(&state).unwrap();
        let mut after_one = Vec::new();
        for round in 1..=3 {
            state[round * 9_000] ^= 1;
            file.write(&state).unwrap();
            if round == 1 {
                after_one = state.clone();
            }
        }
        // A process stopped while removing patches 1 to 3 first removes 1; had it removed 2
        // only, reading stops there too.
        std::fs::remove_file(patch_path(&path, 2)).unwrap();
        assert_eq!(read_patched(&path).unwrap().0, after_one);
    }

    #[test]
    fn the_same_bytes_are_cut_the_same_way_wherever_they_lie() {
        let data = random(200_000, 4);
        let cuts = chunks(&data);
        assert!(cuts.iter().all(|c| c.len() <= MAX_CHUNK) && cuts.iter().rev().skip(1).all(|c| c.len() >= MIN_CHUNK));
        let mean = data.len() / cuts.len();
        assert!((700..2500).contains(&mean), "chunks of {mean} bytes on average");
        let mut shifted = random(333, 8);
        shifted.extend_from_slice(&data);
        let ends = |c: &[Range<usize>], offset: usize| -> Vec<usize> { c.iter().map(|r| r.end - offset).collect() };
        let (before, after) = (ends(&cuts, 0), ends(&chunks(&shifted), 333));
        let shared = after.iter().filter(|e| before.contains(e)).count();
        assert!(shared + 3 >= before.len(), "{shared} of {} cuts found again", before.len());
    }
}
