//! Vocabulary: token ↔ id mapping built from training texts.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::DataError;
use crate::text::tokenize;

/// `[data] vocab`: how the vocabulary is built from the training texts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VocabConfig {
    /// Maximum number of entries, counting `<pad>` and `<unk>`.
    pub max_size: usize,
    /// Minimum number of occurrences in the training texts for a token to get its own id.
    pub min_freq: usize,
}

impl Default for VocabConfig {
    fn default() -> Self {
        Self { max_size: 20_000, min_freq: 2 }
    }
}

/// Token vocabulary with reserved ids [`Vocab::PAD`] (`<pad>`) and [`Vocab::UNK`] (`<unk>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vocab {
    tokens: Vec<String>,
    index: HashMap<String, u32>,
}

/// On-disk JSON form of a vocabulary.
#[derive(Serialize, Deserialize)]
struct VocabFile {
    format: String,
    version: u32,
    /// CRC-32 of the tokens (version 2 on; version 1 files have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    checksum: Option<String>,
    tokens: Vec<String>,
}

const FILE_FORMAT: &str = "tandem-vocab";
/// Version 2 adds the tokens' checksum; version 1 files are still read.
const FILE_VERSION: u32 = 2;

/// `crc32:` and the CRC-32, in hex, of every token's length (u64, little endian) and bytes.
fn tokens_checksum(tokens: &[String]) -> String {
    let mut hasher = crc32fast::Hasher::new();
    for token in tokens {
        hasher.update(&(token.len() as u64).to_le_bytes());
        hasher.update(token.as_bytes());
    }
    format!("crc32:{:08x}", hasher.finalize())
}

impl Vocab {
    /// Id of the padding token `<pad>`.
    pub const PAD: u32 = 0;
    /// Id of the unknown-token `<unk>`.
    pub const UNK: u32 = 1;
    /// Text of the padding token.
    pub const PAD_TOKEN: &'static str = "<pad>";
    /// Text of the unknown token.
    pub const UNK_TOKEN: &'static str = "<unk>";

    /// Builds a vocabulary from training texts (tokenized with [`tokenize`]).
    ///
    /// Tokens seen at least `min_freq` times are ranked by frequency (descending), ties broken
    /// by the token (ascending), and the first `max_size - 2` are kept after `<pad>` and `<unk>`.
    /// The result depends only on the multiset of texts, never on hashing order.
    pub fn build<I, S>(texts: I, config: &VocabConfig) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for text in texts {
            for token in tokenize(text.as_ref()) {
                *counts.entry(token).or_insert(0) += 1;
            }
        }
        let min_freq = config.min_freq.max(1);
        let mut ranked: Vec<(String, usize)> =
            counts.into_iter().filter(|(token, n)| *n >= min_freq && !Self::is_special(token)).collect();
        ranked.sort_unstable_by(|(ta, na), (tb, nb)| nb.cmp(na).then_with(|| ta.cmp(tb)));
        ranked.truncate(config.max_size.saturating_sub(2));

        let tokens = [Self::PAD_TOKEN.to_string(), Self::UNK_TOKEN.to_string()]
            .into_iter()
            .chain(ranked.into_iter().map(|(token, _)| token))
            .collect();
        Self::from_tokens_unchecked(tokens)
    }

    fn is_special(token: &str) -> bool {
        token == Self::PAD_TOKEN || token == Self::UNK_TOKEN
    }

    fn from_tokens_unchecked(tokens: Vec<String>) -> Self {
        let index = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        Self { tokens, index }
    }

    /// Number of entries, including `<pad>` and `<unk>`.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false: a vocabulary holds at least `<pad>` and `<unk>`.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Id of `token`, or [`Vocab::UNK`] when it is not in the vocabulary.
    pub fn id(&self, token: &str) -> u32 {
        self.index.get(token).copied().unwrap_or(Self::UNK)
    }

    /// The token with id `id`, if any.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// All tokens in id order.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// Tokenizes `text` and maps it to ids, truncated or padded with [`Vocab::PAD`] to exactly
    /// `max_len` (at least 1) ids.
    ///
    /// Returns the ids and the true length (number of non-pad positions). A text with no tokens
    /// becomes a single [`Vocab::UNK`] with length 1, so no row is entirely padding.
    pub fn encode(&self, text: &str, max_len: usize) -> (Vec<u32>, usize) {
        let max_len = max_len.max(1);
        let mut ids: Vec<u32> = tokenize(text).iter().take(max_len).map(|t| self.id(t)).collect();
        if ids.is_empty() {
            ids.push(Self::UNK);
        }
        let length = ids.len();
        ids.resize(max_len, Self::PAD);
        (ids, length)
    }

    /// Writes the vocabulary as JSON, atomically (a temporary file in the same directory is
    /// renamed over `path`). Creates the parent directory if needed.
    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        let file = VocabFile {
            format: FILE_FORMAT.to_string(),
            version: FILE_VERSION,
            checksum: Some(tokens_checksum(&self.tokens)),
            tokens: self.tokens.clone(),
        };
        let json = serde_json::to_vec_pretty(&file)
            .map_err(|e| DataError::Vocab { path: path.to_path_buf(), message: format!("cannot serialize: {e}") })?;
        write_atomic(path, &json)
    }

    /// Reads a vocabulary written by [`Vocab::save`], checking its structure.
    pub fn load(path: &Path) -> Result<Self, DataError> {
        let bytes = std::fs::read(path).map_err(|e| DataError::io(path, "cannot read", e))?;
        let invalid = |message: String| DataError::Vocab { path: path.to_path_buf(), message };
        let file: VocabFile = serde_json::from_slice(&bytes).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
        if file.format != FILE_FORMAT || !(1..=FILE_VERSION).contains(&file.version) {
            return Err(invalid(format!(
                "unsupported format {:?} version {} (expected {FILE_FORMAT:?} version 1 to {FILE_VERSION})",
                file.format, file.version
            )));
        }
        let expected = tokens_checksum(&file.tokens);
        match (file.version, &file.checksum) {
            (1, _) => {}
            (_, Some(checksum)) if *checksum == expected => {}
            (_, Some(checksum)) => {
                return Err(invalid(format!(
                    "its tokens differ from what was written (checksum {expected}, recorded {checksum}); \
                     restore it from a copy or train the run again"
                )))
            }
            (_, None) => return Err(invalid("`checksum` is missing".to_string())),
        }
        if file.tokens.first().map(String::as_str) != Some(Self::PAD_TOKEN)
            || file.tokens.get(1).map(String::as_str) != Some(Self::UNK_TOKEN)
        {
            return Err(invalid(format!(
                "the first two tokens must be {:?} and {:?}",
                Self::PAD_TOKEN,
                Self::UNK_TOKEN
            )));
        }
        if file.tokens.len() > u32::MAX as usize {
            return Err(invalid("too many tokens".to_string()));
        }
        let vocab = Self::from_tokens_unchecked(file.tokens);
        if vocab.index.len() != vocab.tokens.len() {
            return Err(invalid("duplicate tokens".to_string()));
        }
        Ok(vocab)
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(parent).map_err(|e| DataError::io(parent, "cannot create directory", e))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".tandem-tmp-")
        .tempfile_in(parent)
        .map_err(|e| DataError::io(parent, "cannot create temporary file", e))?;
    tmp.write_all(bytes).and_then(|()| tmp.as_file().sync_all()).map_err(|e| DataError::io(path, "cannot write", e))?;
    tmp.persist(path).map_err(|e| DataError::io(path, "cannot write", e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXTS: [&str; 4] = ["the cat sat on the mat", "the dog sat", "a cat and a dog", "zebra"];

    fn cfg(max_size: usize, min_freq: usize) -> VocabConfig {
        VocabConfig { max_size, min_freq }
    }

    #[test]
    fn specials_and_ordering() {
        let v = Vocab::build(TEXTS, &cfg(100, 1));
        assert_eq!(v.id("<pad>"), Vocab::PAD);
        assert_eq!(v.id("<unk>"), Vocab::UNK);
        assert_eq!(v.token(0), Some("<pad>"));
        assert_eq!(v.token(1), Some("<unk>"));
        // the:3; a,cat,dog,sat:2 (alphabetical); and,mat,on,zebra:1.
        assert_eq!(&v.tokens()[2..], ["the", "a", "cat", "dog", "sat", "and", "mat", "on", "zebra"]);
        assert_eq!(v.len(), 11);
        assert_eq!(v.id("the"), 2);
        assert_eq!(v.id("never-seen"), Vocab::UNK);
        assert_eq!(v.token(99), None);
    }

    #[test]
    fn min_freq_and_max_size() {
        let v = Vocab::build(TEXTS, &cfg(100, 2));
        assert_eq!(&v.tokens()[2..], ["the", "a", "cat", "dog", "sat"]);
        assert_eq!(v.id("zebra"), Vocab::UNK);
        let v = Vocab::build(TEXTS, &cfg(4, 1));
        assert_eq!(v.tokens(), ["<pad>", "<unk>", "the", "a"]);
        let v = Vocab::build(TEXTS, &cfg(0, 1));
        assert_eq!(v.len(), 2);
    }

    #[test]
    fn deterministic() {
        let a = Vocab::build(TEXTS, &VocabConfig::default());
        let mut reversed = TEXTS;
        reversed.reverse();
        let b = Vocab::build(reversed.iter().map(|s| s.to_string()), &VocabConfig::default());
        assert_eq!(a, b);
    }

    #[test]
    fn specials_in_text_are_not_duplicated() {
        let v = Vocab::build(["<pad> <unk> pad pad"], &cfg(100, 1));
        assert_eq!(v.tokens(), ["<pad>", "<unk>", "pad", "unk"]);
    }

    #[test]
    fn encode_pads_truncates_and_reports_length() {
        let v = Vocab::build(TEXTS, &cfg(100, 1));
        let (ids, len) = v.encode("The cat sat", 5);
        assert_eq!(ids, [2, 4, 6, 0, 0]);
        assert_eq!(len, 3);
        let (ids, len) = v.encode("the cat sat on the mat", 4);
        assert_eq!(ids, [2, 4, 6, 9]);
        assert_eq!(len, 4);
        let (ids, len) = v.encode("unknown words", 3);
        assert_eq!(ids, [1, 1, 0]);
        assert_eq!(len, 2);
        let (ids, len) = v.encode("", 3);
        assert_eq!(ids, [Vocab::UNK, Vocab::PAD, Vocab::PAD]);
        assert_eq!(len, 1);
        let (ids, len) = v.encode("the cat", 0);
        assert_eq!((ids, len), (vec![2], 1));
    }

    #[test]
    fn save_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/vocab.json");
        let v = Vocab::build(TEXTS, &cfg(100, 1));
        v.save(&path).unwrap();
        assert_eq!(Vocab::load(&path).unwrap(), v);
        // Overwrite in place; no temporary files left behind.
        v.save(&path).unwrap();
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["vocab.json"]);
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        let msg = Vocab::load(&missing).unwrap_err().to_string();
        assert!(msg.contains("missing.json"), "{msg}");

        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{not json").unwrap();
        let msg = Vocab::load(&bad).unwrap_err().to_string();
        assert!(msg.contains("bad.json") && msg.contains("JSON"), "{msg}");

        std::fs::write(&bad, r#"{"format":"tandem-vocab","version":1,"tokens":["a","b"]}"#).unwrap();
        let msg = Vocab::load(&bad).unwrap_err().to_string();
        assert!(msg.contains("bad.json") && msg.contains("<pad>"), "{msg}");

        std::fs::write(&bad, r#"{"format":"tandem-vocab","version":1,"tokens":["<pad>","<unk>","x","x"]}"#).unwrap();
        let msg = Vocab::load(&bad).unwrap_err().to_string();
        assert!(msg.contains("duplicate"), "{msg}");
    }

    #[test]
    fn a_changed_token_is_detected_and_version_1_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vocab.json");
        let vocab = Vocab::build(TEXTS, &cfg(100, 1));
        vocab.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        // One flipped bit in a token: `"cat"` becomes `"bat"`.
        std::fs::write(&path, text.replace("\"cat\"", "\"bat\"")).unwrap();
        let msg = Vocab::load(&path).unwrap_err().to_string();
        assert!(msg.contains("vocab.json") && msg.contains("checksum"), "{msg}");
        std::fs::write(&path, text.replace("\"checksum\"", "\"sum\"")).unwrap();
        assert!(Vocab::load(&path).unwrap_err().to_string().contains("`checksum` is missing"));
        let version_1 = r#"{"format":"tandem-vocab","version":1,"tokens":["<pad>","<unk>","cat"]}"#;
        std::fs::write(&path, version_1).unwrap();
        assert_eq!(Vocab::load(&path).unwrap().tokens(), ["<pad>", "<unk>", "cat"]);
    }
}
