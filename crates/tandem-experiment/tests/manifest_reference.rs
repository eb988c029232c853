//! The manifest key reference (`docs/guide/manifest-reference.md`) documents every key and is
//! the one `tandem manifest reference` generates from the configuration types.

use std::path::Path;

use tandem_experiment::manifest::reference;

#[test]
fn every_manifest_key_has_a_meaning() {
    let missing = reference::undocumented_keys();
    assert!(missing.is_empty(), "give these manifest keys a doc comment: {missing:#?}");
}

#[test]
fn the_committed_reference_is_the_generated_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/guide/manifest-reference.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == reference::markdown(),
        "{} is out of date: regenerate it with `cargo run -p tandem-cli -- manifest reference > docs/guide/manifest-reference.md`",
        path.display()
    );
}

#[test]
fn the_schema_describes_every_section_and_rejects_unknown_keys() {
    let schema = reference::json_schema();
    for section in ["experiment", "data", "train", "strategy", "strategies", "models", "cluster"] {
        assert!(schema["properties"].get(section).is_some(), "no `{section}` in the schema");
    }
    assert_eq!(schema["additionalProperties"], false);
    let markdown = reference::markdown();
    for key in ["`eval_batch_size`", "`beta1`", "`min_lr_fraction`", "`max_train_rows`", "`verify_md5`", "`split`"] {
        assert!(markdown.contains(key), "{key} missing from the reference");
    }
}
