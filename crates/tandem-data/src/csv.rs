//! Reader for the AG News CSV layout.
//!
//! Each record has three fields: the class index (1 to 4), the title and the description.
//! Fields are usually double-quoted with internal quotes doubled (`""`), but unquoted fields,
//! quoted fields spanning several lines, CRLF line endings, a UTF-8 byte-order mark and blank
//! lines are accepted too.
//!
//! The text fields are cleaned by [`clean_text`]: the escapes the dataset uses for line breaks
//! and the HTML entities whose `&` was lost are decoded, and whitespace is collapsed.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::DataError;

/// Number of AG News classes.
pub const NUM_CLASSES: usize = 4;

/// Class names, indexed by the 0-based label (`classes.txt` order).
pub const CLASS_NAMES: [&str; NUM_CLASSES] = ["World", "Sports", "Business", "Sci/Tech"];

/// One labelled news item.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Sample {
    /// 0-based class label, in `0..NUM_CLASSES` (the CSV's class index minus one).
    pub label: usize,
    /// Cleaned title.
    pub title: String,
    /// Cleaned description.
    pub description: String,
}

impl Sample {
    /// The text a classifier sees: title, a space, description.
    pub fn text(&self) -> String {
        match (self.title.is_empty(), self.description.is_empty()) {
            (false, false) => format!("{} {}", self.title, self.description),
            (true, _) => self.description.clone(),
            (false, true) => self.title.clone(),
        }
    }
}

/// Reads an AG News CSV file.
///
/// Errors name the file and, for malformed content, the 1-based line number: a missing or
/// unreadable file, invalid UTF-8, an empty file, a record without exactly three fields, a class
/// index that is not a number in 1..=4, or an unterminated quoted field.
pub fn read_csv(path: &Path) -> Result<Vec<Sample>, DataError> {
    let bytes = std::fs::read(path).map_err(|e| DataError::io(path, "cannot read", e))?;
    parse_csv(&bytes, path)
}

/// Parses AG News CSV content held in memory; `path` is only used in error messages.
pub fn parse_csv(bytes: &[u8], path: &Path) -> Result<Vec<Sample>, DataError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let offset = e.valid_up_to();
        let line = 1 + bytes[..offset].iter().filter(|&&b| b == b'\n').count();
        parse_error(path, line, format!("invalid UTF-8 at byte offset {offset}"))
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let records = parse_records(text, path)?;
    if records.is_empty() {
        return Err(DataError::Empty { path: path.to_path_buf() });
    }
    records.into_iter().map(|record| to_sample(record, path)).collect()
}

fn parse_error(path: &Path, line: usize, message: impl Into<String>) -> DataError {
    DataError::Parse { path: path.to_path_buf(), line, message: message.into() }
}

/// One raw CSV record and the line it starts on.
struct Record {
    line: usize,
    fields: Vec<String>,
}

/// Splits `text` into records of raw (unescaped but not cleaned) fields.
///
/// Works on bytes: the structural characters are ASCII, so every slice boundary used below is a
/// character boundary of the (already validated) UTF-8 text.
fn parse_records(text: &str, path: &Path) -> Result<Vec<Record>, DataError> {
    let b = text.as_bytes();
    let is_crlf = |i: usize| b.get(i) == Some(&b'\r') && b.get(i + 1) == Some(&b'\n');
    let mut records = Vec::new();
    let mut i = 0;
    let mut line = 1;

    while i < b.len() {
        // Skip blank (or whitespace-only) lines.
        let mut j = i;
        while matches!(b.get(j), Some(b' ' | b'\t')) {
            j += 1;
        }
        if j == b.len() {
            break;
        }
        if b[j] == b'\n' {
            i = j + 1;
            line += 1;
            continue;
        }
        if is_crlf(j) {
            i = j + 2;
            line += 1;
            continue;
        }

        let start_line = line;
        let mut fields = Vec::new();
        loop {
            let mut field = String::new();
            if b.get(i) == Some(&b'"') {
                let quote_line = line;
                i += 1;
                let mut segment = i;
                loop {
                    match b.get(i) {
                        None => {
                            return Err(parse_error(path, quote_line, "unterminated quoted field (missing closing \")"))
                        }
                        Some(b'"') => {
                            field.push_str(&text[segment..i]);
                            if b.get(i + 1) == Some(&b'"') {
                                field.push('"');
                                i += 2;
                                segment = i;
                            } else {
                                i += 1;
                                break;
                            }
                        }
                        Some(b'\n') => {
                            line += 1;
                            i += 1;
                        }
                        Some(_) => i += 1,
                    }
                }
                let terminated = matches!(b.get(i), None | Some(b',' | b'\n')) || is_crlf(i);
                if !terminated {
                    return Err(parse_error(
                        path,
                        line,
                        "unexpected character after a closing quote (quotes inside a quoted field must be doubled)",
                    ));
                }
            } else {
                let start = i;
                while i < b.len() && b[i] != b',' && b[i] != b'\n' && !is_crlf(i) {
                    i += 1;
                }
                field.push_str(&text[start..i]);
            }
            fields.push(field);

            match b.get(i) {
                Some(b',') => i += 1,
                Some(b'\n') => {
                    i += 1;
                    line += 1;
                    break;
                }
                // The only other terminator a field stops at is CRLF.
                Some(_) => {
                    i += 2;
                    line += 1;
                    break;
                }
                None => break,
            }
        }
        records.push(Record { line: start_line, fields });
    }
    Ok(records)
}

fn to_sample(record: Record, path: &Path) -> Result<Sample, DataError> {
    let Record { line, fields } = record;
    let [class, title, description]: [String; 3] = fields.try_into().map_err(|f: Vec<String>| {
        parse_error(path, line, format!("expected 3 fields (class index, title, description), found {}", f.len()))
    })?;
    let class_str = class.trim();
    let class: usize = class_str.parse().map_err(|_| {
        parse_error(path, line, format!("class index {class_str:?} is not a number (expected 1 to {NUM_CLASSES})"))
    })?;
    if !(1..=NUM_CLASSES).contains(&class) {
        return Err(parse_error(
            path,
            line,
            format!("class index {class} is out of range (expected 1 to {NUM_CLASSES})"),
        ));
    }
    Ok(Sample { label: class - 1, title: clean_text(&title), description: clean_text(&description) })
}

/// Cleans one AG News text field.
///
/// - A backslash marks a line break in this dataset (the readme says `\n`, but most records
///   have a lone `\` between the words, e.g. `second\team`): `\n` not followed by a lowercase
///   letter, and any other backslash, become a space; `\$` becomes `$`.
/// - HTML entities are decoded, including the dataset's forms whose `&` was replaced by a
///   space or lost: ` #36;` → `$`, ` #39;` → `'`, ` quot;` → `"`, ` amp;` → `&`, `&lt;` → `<`,
///   `#151;` → `—` (codes 128–159 are read as Windows-1252, as the source intended).
/// - Runs of whitespace collapse to one space; leading and trailing whitespace is removed.
pub fn clean_text(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(c) = rest.chars().next() {
        if c == '\\' {
            let after = &rest[1..];
            match after.chars().next() {
                Some('$') => rest = after,
                Some('n') if !after[1..].starts_with(char::is_lowercase) => {
                    out.push(' ');
                    rest = &after[1..];
                }
                _ => {
                    out.push(' ');
                    rest = after;
                }
            }
            continue;
        }
        if matches!(c, '&' | '#' | ' ') {
            if let Some((decoded, consumed)) = decode_entity(rest) {
                out.push(decoded);
                rest = &rest[consumed..];
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Decodes an entity at the start of `s` (which starts with `&`, `#` or a space).
/// Returns the character and the number of bytes consumed.
fn decode_entity(s: &str) -> Option<(char, usize)> {
    let (prefix_len, body) = match s.as_bytes().first()? {
        b'&' | b' ' => (1, &s[1..]),
        b'#' => (0, s),
        _ => return None,
    };
    let semi = body.bytes().take(12).position(|b| b == b';')?;
    let name = &body[..semi];
    let decoded = match name.strip_prefix('#') {
        Some(number) => {
            let code = match number.strip_prefix(['x', 'X']) {
                Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    u32::from_str_radix(hex, 16).ok()?
                }
                Some(_) => return None,
                None if !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) => number.parse().ok()?,
                None => return None,
            };
            numeric_char(code)?
        }
        None if prefix_len == 1 => named_entity(name)?,
        None => return None,
    };
    Some((decoded, prefix_len + semi + 1))
}

/// Windows-1252 characters for codes 0x80..=0x9F (space where the code page has none).
const CP1252_HIGH: [char; 32] = [
    '€', ' ', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', ' ', 'Ž', ' ', //
    ' ', '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ', ' ', 'ž', 'Ÿ',
];

fn numeric_char(code: u32) -> Option<char> {
    match code {
        0 => None,
        0x80..=0x9F => Some(CP1252_HIGH[(code - 0x80) as usize]),
        c if c < 0x20 || c == 0x7F => Some(' '),
        c => char::from_u32(c),
    }
}

fn named_entity(name: &str) -> Option<char> {
    Some(match name {
        "quot" => '"',
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "apos" => '\'',
        "nbsp" => ' ',
        "ndash" => '–',
        "mdash" => '—',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "hellip" => '…',
        "pound" => '£',
        "euro" => '€',
        "yen" => '¥',
        "cent" => '¢',
        "copy" => '©',
        "reg" => '®',
        "trade" => '™',
        "deg" => '°',
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Vec<Sample>, DataError> {
        parse_csv(s.as_bytes(), Path::new("dir/sample.csv"))
    }

    fn err(s: &[u8]) -> String {
        match parse_csv(s, Path::new("dir/bad.csv")) {
            Ok(v) => panic!("expected an error, parsed {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn quoted_fields_and_doubled_quotes() {
        let s = parse("\"3\",\"Fears for T N\",\"Unions say \"\"no\"\", it's over.\"\n\"1\",\"a, b\",\"c\"\n").unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].label, 2);
        assert_eq!(s[0].title, "Fears for T N");
        assert_eq!(s[0].description, "Unions say \"no\", it's over.");
        assert_eq!(s[1].label, 0);
        assert_eq!(s[1].title, "a, b");
        assert_eq!(s[0].text(), "Fears for T N Unions say \"no\", it's over.");
    }

    #[test]
    fn unquoted_fields_crlf_bom_and_blank_lines() {
        let s = parse("\u{feff}2,Title one,Desc one\r\n\r\n  \n4,\"T2\",D2\r\n").unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].label, 1);
        assert_eq!(s[0].title, "Title one");
        assert_eq!(s[0].description, "Desc one");
        assert_eq!(s[1].label, 3);
        assert_eq!(s[1].description, "D2");
    }

    #[test]
    fn no_trailing_newline_and_multiline_quoted_field() {
        let s = parse("1,\"a\nb\",c\n2,d,\"e\"").unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].title, "a b");
        assert_eq!(s[1].description, "e");
    }

    #[test]
    fn backslash_escapes() {
        assert_eq!(clean_text("A second\\team of"), "A second team of");
        assert_eq!(clean_text("line one.\\nLine two"), "line one. Line two");
        assert_eq!(clean_text("end\\n"), "end");
        assert_eq!(clean_text("for social\\network"), "for social network");
        assert_eq!(clean_text("Grabs \\$1B"), "Grabs $1B");
        assert_eq!(clean_text("solution.\\\\I think"), "solution. I think");
    }

    #[test]
    fn entities() {
        assert_eq!(clean_text("competing for the  #36;10 million"), "competing for the $10 million");
        assert_eq!(clean_text("Ericsson doesn #39;t feel"), "Ericsson doesn't feel");
        assert_eq!(clean_text("said  quot;we will quot;"), "said \"we will\"");
        assert_eq!(clean_text("AT amp;T"), "AT&T");
        assert_eq!(clean_text("&lt;b&gt;bold&lt;/b&gt; &amp; &quot;x&quot;"), "<b>bold</b> & \"x\"");
        assert_eq!(clean_text("Newsday #146;s Steve"), "Newsday’s Steve");
        assert_eq!(clean_text("a#151;b &#x41; &#65;"), "a—b A A");
        // Not entities: left alone.
        assert_eq!(clean_text("R&D #1 win; it; &bogus; #;"), "R&D #1 win; it; &bogus; #;");
        assert_eq!(clean_text("  many   spaces\there "), "many spaces here");
    }

    #[test]
    fn wrong_field_count_names_file_and_line() {
        let e = err(b"1,a,b\n2,a\n");
        assert!(e.contains("bad.csv") && e.contains("line 2") && e.contains("found 2"), "{e}");
        let e = err(b"1,a,b\n2,a,b\n3,a,b,c\n");
        assert!(e.contains("bad.csv") && e.contains("line 3") && e.contains("found 4"), "{e}");
    }

    #[test]
    fn bad_labels() {
        let e = err(b"1,a,b\n5,a,b\n");
        assert!(e.contains("bad.csv") && e.contains("line 2") && e.contains("out of range"), "{e}");
        let e = err(b"0,a,b\n");
        assert!(e.contains("line 1") && e.contains("out of range"), "{e}");
        let e = err(b"1,a,b\n1,a,b\n\"x\",a,b\n");
        assert!(e.contains("bad.csv") && e.contains("line 3") && e.contains("not a number"), "{e}");
        let e = err(b"-1,a,b\n");
        assert!(e.contains("line 1") && e.contains("not a number"), "{e}");
    }

    #[test]
    fn unterminated_quote() {
        let e = err(b"1,a,b\n2,\"a,b\n3,c,d\n");
        assert!(e.contains("bad.csv") && e.contains("line 2") && e.contains("unterminated"), "{e}");
        let e = err(b"1,\"a\"x,b\n");
        assert!(e.contains("line 1") && e.contains("closing quote"), "{e}");
    }

    #[test]
    fn invalid_utf8() {
        let e = err(b"1,a,b\n2,a,b\n3,\"caf\xe9\",x\n");
        assert!(e.contains("bad.csv") && e.contains("line 3") && e.contains("UTF-8"), "{e}");
    }

    #[test]
    fn empty_file() {
        for content in [&b""[..], b"\n\n", b"\xef\xbb\xbf"] {
            let e = err(content);
            assert!(e.contains("bad.csv") && e.contains("empty"), "{e}");
        }
    }

    #[test]
    fn missing_file() {
        let e = read_csv(Path::new("/nonexistent/dir/missing.csv")).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("missing.csv") && msg.contains("cannot read"), "{msg}");
    }

    #[test]
    fn read_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, "\"4\",\"T\",\"D\"\n").unwrap();
        let s = read_csv(&path).unwrap();
        assert_eq!(s, vec![Sample { label: 3, title: "T".into(), description: "D".into() }]);
        std::fs::write(&path, "").unwrap();
        let msg = read_csv(&path).unwrap_err().to_string();
        assert!(msg.contains("t.csv") && msg.contains("empty"), "{msg}");
    }
}
