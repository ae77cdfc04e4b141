//! Lang: the natural language of a document, detected at ingest and stored with each of its chunks
//! (payload field `lang`, keyword-indexed, a query filter).
//!
//! Detection is whatlang's trigram model over the document's first 4 KiB of text, kept only when
//! whatlang calls it reliable; codes are ISO 639-3 (`eng`, `fra`, `deu`, `cmn`, …). Code and SQL schemas
//! get none: their keywords are English whatever their comments' language. A document too short or
//! too mixed to call gets none either, so a `langs` filter never guesses for it.

use crate::model::DocKind;

/// Bytes of a document the detector reads: a few paragraphs call a language reliably, and a long
/// document costs no more than its start.
const SAMPLE_BYTES: usize = 4096;

/// The ISO 639-3 code of `text`'s language, or `None` for code, schemas and texts whatlang cannot
/// call reliably.
pub fn detect(text: &str, kind: DocKind) -> Option<&'static str> {
    if matches!(kind, DocKind::Code | DocKind::SqlSchema) {
        return None;
    }
    let end = text.floor_char_boundary(SAMPLE_BYTES);
    let info = whatlang::detect(&text[..end])?;
    info.is_reliable().then(|| info.lang().code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prose_in_three_languages() {
        let cases = [
            (
                "The committee approved the new budget after a long debate about the costs of the \
                 project and its benefits for the city.",
                "eng",
            ),
            (
                "Le comité a approuvé le nouveau budget après un long débat sur les coûts du projet \
                 et ses avantages pour la ville.",
                "fra",
            ),
            (
                "Der Ausschuss hat den neuen Haushalt nach einer langen Debatte über die Kosten des \
                 Projekts und seinen Nutzen für die Stadt genehmigt.",
                "deu",
            ),
        ];
        for (text, code) in cases {
            assert_eq!(detect(text, DocKind::Prose), Some(code), "{text}");
            assert_eq!(detect(text, DocKind::Markdown), Some(code), "{text}");
        }
    }

    #[test]
    fn none_for_code_schemas_and_what_cannot_be_called() {
        let english = "The committee approved the new budget after a long debate about the costs.";
        assert_eq!(detect(english, DocKind::Code), None);
        assert_eq!(detect(english, DocKind::SqlSchema), None);
        assert_eq!(detect("", DocKind::Prose), None);
        assert_eq!(detect("ok 42", DocKind::Prose), None);
    }

    #[test]
    fn reads_only_the_start_and_never_splits_a_character() {
        // 4095 ASCII bytes then a two-byte character across the sample's end.
        let mut text =
            "The committee approved the new budget after a long debate about the costs of \
                        the project and its benefits for the city, which has waited for years. "
                .repeat(40);
        text.truncate(4095);
        text.push('é');
        text.push_str(&" Der Ausschuss hat den neuen Haushalt genehmigt.".repeat(500));
        assert_eq!(detect(&text, DocKind::Prose), Some("eng"));
    }
}
