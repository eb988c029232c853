//! A setting that a config's own checks refuse, typed so that whoever reads the config (the
//! manifest) can point at the field and its line without reading the message.

use std::fmt;

/// A refused setting: the field (its path under the config that checked it, e.g.
/// `aux_head.hidden`; empty for a rule over several fields or the config as a whole) and why.
/// [`Invalid::under`] adds the section a nested config sits in, as its parent checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Sections added by parents, outermost first (shown before the message).
    pub sections: Vec<String>,
    /// The field, as a dotted path under the innermost section (`None`: no single field).
    pub field: Option<String>,
    /// Why, naming the field as a person reads it.
    pub message: String,
}

impl Invalid {
    /// `message` about `field` (a dotted path).
    pub fn at(field: &str, message: impl Into<String>) -> Self {
        Self { sections: Vec::new(), field: Some(field.to_string()), message: message.into() }
    }

    /// `message` about no single field.
    pub fn rule(message: impl Into<String>) -> Self {
        Self { sections: Vec::new(), field: None, message: message.into() }
    }

    /// The same problem inside `section` (as a parent config checks a nested one).
    pub fn under(mut self, section: &str) -> Self {
        self.sections.insert(0, section.to_string());
        self
    }

    /// The whole path: sections, then the field, split at their dots.
    pub fn path(&self) -> Vec<String> {
        self.sections.iter().chain(&self.field).flat_map(|f| f.split('.')).map(str::to_string).collect()
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.sections.iter().try_for_each(|s| write!(f, "{s}: "))?;
        f.write_str(&self.message)
    }
}

impl std::error::Error for Invalid {}

/// `v` as a count named `name`: at least 1.
pub fn positive(name: &str, v: usize) -> Result<(), Invalid> {
    match v {
        0 => Err(Invalid::at(name, format!("`{name}` must be at least 1"))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_lead_the_message_and_the_path() {
        let e = Invalid::at("later_stages.every", "`later_stages.every` must be in [1, 100000], got 0").under("x");
        assert_eq!(e.to_string(), "x: `later_stages.every` must be in [1, 100000], got 0");
        assert_eq!(e.path(), ["x", "later_stages", "every"]);
        assert_eq!(Invalid::rule("no field").under("trigger").path(), ["trigger"]);
    }
}
