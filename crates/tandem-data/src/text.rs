//! Word tokenizer.

/// Splits text into lowercase word tokens.
///
/// Rules, chosen for topic classification of short news texts:
/// - Letters are lowercased (Unicode-aware).
/// - A token is a maximal run of alphanumeric characters; everything else separates tokens, so
///   `"U.S."` gives `u`, `s` and `"Dubai's"` gives `dubai`, `s` (the base word then shares an id
///   with its possessive and plural-less forms of the same spelling).
/// - Currency symbols (`$ € £ ¥ ¢`) and `%` are kept as one-character tokens, because money
///   and percentages are strong Business signals; all other punctuation is dropped.
pub fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() {
            word.extend(c.to_lowercase());
            continue;
        }
        if !word.is_empty() {
            tokens.push(std::mem::take(&mut word));
        }
        if is_symbol_token(c) {
            tokens.push(c.to_string());
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    tokens
}

fn is_symbol_token(c: char) -> bool {
    matches!(c, '$' | '%' | '€' | '£' | '¥' | '¢')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercases_and_splits() {
        assert_eq!(
            tokenize("Fears for T N pension, after TALKS!"),
            ["fears", "for", "t", "n", "pension", "after", "talks"]
        );
    }

    #[test]
    fn apostrophes_dots_and_symbols() {
        assert_eq!(tokenize("Dubai's U.S. deal"), ["dubai", "s", "u", "s", "deal"]);
        assert_eq!(tokenize("up 5% to $10.5B"), ["up", "5", "%", "to", "$", "10", "5b"]);
        assert_eq!(tokenize("Café Ünïcode—test"), ["café", "ünïcode", "test"]);
    }

    #[test]
    fn empty_and_punctuation_only() {
        assert!(tokenize("").is_empty());
        assert!(tokenize(" -- ... !? ").is_empty());
    }
}
