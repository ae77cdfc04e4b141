//! Intent: a rule-based query analyzer choosing the fusion weights and each lane's retrieval depth.
//!
//! Signals are read from the raw text (identifier/code tokens, quoted phrases, SQL words, question
//! words and cue phrases); the first matching intent in [`Intent::ANALYZED`] order wins, so the more specific
//! ones (identifiers, quotes, SQL) beat the generic ones. Exact-match intents lean to BM25, open
//! questions to the dense lane. The analysis also yields the terms, entities and dates the rerank
//! scores candidates with.

use serde::{Deserialize, Serialize};

use super::{Depth, Plan, Weights};
use crate::store::Bm25Encoder;

mod words;

use words::*;

/// What a query asks for, as the analyzer reads it (the trace's `intent`, the metrics' label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Intent {
    /// Names a code identifier (`parse_config`, `HttpServer::bind()`, `main.rs`).
    Identifier,
    /// Quotes a phrase.
    QuotedPhrase,
    /// Asks about SQL tables, columns or schemas.
    Sql,
    /// Asks how many, how much, how long.
    Measurement,
    /// Asks when, or names a year or a date.
    DateTime,
    /// Asks who owns or maintains something.
    Ownership,
    /// Asks where.
    Location,
    /// Asks what something is.
    Definition,
    /// Asks how to do something.
    Procedure,
    /// Names two or more entities, or compares.
    MultiEntity,
    /// States a claim (no question, four words or more).
    Claim,
    /// Anything else: an open question.
    Exploratory,
    /// Words whose dense hits are mostly code ([`super::adapt`]; never the analyzer's choice).
    CodeSearch,
}

impl Intent {
    /// The intents the analyzer chooses from, in precedence order: the first whose signal the query
    /// shows wins, so the more specific ones (identifiers, quotes, SQL) beat the generic ones;
    /// [`Intent::Exploratory`] has no signal and is the fallback.
    pub const ANALYZED: [Intent; 12] = [
        Intent::Identifier,
        Intent::QuotedPhrase,
        Intent::Sql,
        Intent::Measurement,
        Intent::DateTime,
        Intent::Ownership,
        Intent::Location,
        Intent::Definition,
        Intent::Procedure,
        Intent::MultiEntity,
        Intent::Claim,
        Intent::Exploratory,
    ];

    /// Every intent (metric initialisation): the analysed ones, then code search.
    pub const ALL: [Intent; 13] = {
        let mut all = [Intent::CodeSearch; 13];
        let mut index = 0;
        while index < Self::ANALYZED.len() {
            all[index] = Self::ANALYZED[index];
            index += 1;
        }
        all
    };

    /// The wire name (trace, metrics label, config key).
    pub fn as_str(self) -> &'static str {
        match self {
            Intent::Identifier => "identifier",
            Intent::QuotedPhrase => "quoted_phrase",
            Intent::Sql => "sql",
            Intent::Measurement => "measurement",
            Intent::DateTime => "date_time",
            Intent::Ownership => "ownership",
            Intent::Location => "location",
            Intent::Definition => "definition",
            Intent::Procedure => "procedure",
            Intent::MultiEntity => "multi_entity",
            Intent::Claim => "claim",
            Intent::Exploratory => "exploratory",
            Intent::CodeSearch => "code_search",
        }
    }
}

impl std::fmt::Display for Intent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the analyzer (and the code-search rule) saw in a query: an intent's trigger, or evidence that
/// chooses no intent of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    /// The trigger of an analysed intent (an identifier-like word for `identifier`, a quoted phrase
    /// for `quoted_phrase`, "how many" for `measurement` …: see [`analyze`]).
    Shows(Intent),
    /// Names a programming language ([`LANGUAGES`]): evidence for the code-search rule.
    NamesLanguage,
    /// The dense lane's head is mostly code: the code-search rule fired ([`super::adapt`]).
    CodeHits,
}

impl Signal {
    /// The wire name (trace): an intent's trigger is named as its intent.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Shows(intent) => intent.as_str(),
            Signal::NamesLanguage => "names_language",
            Signal::CodeHits => "code_hits",
        }
    }

    /// The signal of a wire name ([`Self::as_str`]); `None` for a name that is none.
    pub fn from_name(name: &str) -> Option<Self> {
        use serde::de::IntoDeserializer;
        match name {
            "names_language" => Some(Signal::NamesLanguage),
            "code_hits" => Some(Signal::CodeHits),
            _ => {
                let name: serde::de::value::StrDeserializer<serde::de::value::Error> =
                    name.into_deserializer();
                Intent::deserialize(name).ok().map(Signal::Shows)
            }
        }
    }
}

/// An intent's fusion preset: the lanes' weights and how deep each lane is read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// Fusion weights.
    pub weights: Weights,
    /// Candidates fetched per lane before the query's own floor (twice `k`, `query.min_pool`).
    pub depth: Depth,
}

const fn preset(dense: f32, bm25: f32, depth: (usize, usize)) -> Preset {
    Preset {
        weights: Weights { dense, bm25 },
        depth: Depth {
            dense: depth.0,
            bm25: depth.1,
        },
    }
}

/// Each analysed intent's preset (config section `query.intents`; a key overrides one intent's
/// preset whole: `[query.intents.procedure]` with `weights = { dense = 0.6, bm25 = 0.4 }` and
/// `depth = { dense = 24, bm25 = 16 }`). The lane an intent leans on is read deeper: an exact-match
/// intent's answer may sit below BM25's twentieth hit when many chunks share the term, an open
/// question's below the dense lane's. Both lanes are read at least to the query's floor, so a depth
/// under it (16 on a balanced intent) only matters where `min_pool` is set lower.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IntentPresets {
    /// [`Intent::Identifier`]: leans to BM25.
    pub identifier: Preset,
    /// [`Intent::QuotedPhrase`]: leans to BM25.
    pub quoted_phrase: Preset,
    /// [`Intent::Sql`].
    pub sql: Preset,
    /// [`Intent::Measurement`].
    pub measurement: Preset,
    /// [`Intent::DateTime`].
    pub date_time: Preset,
    /// [`Intent::Ownership`].
    pub ownership: Preset,
    /// [`Intent::Location`].
    pub location: Preset,
    /// [`Intent::Definition`].
    pub definition: Preset,
    /// [`Intent::Procedure`]: leans to the dense lane.
    pub procedure: Preset,
    /// [`Intent::MultiEntity`].
    pub multi_entity: Preset,
    /// [`Intent::Claim`].
    pub claim: Preset,
    /// [`Intent::Exploratory`]: leans to the dense lane.
    pub exploratory: Preset,
}

impl Default for IntentPresets {
    fn default() -> Self {
        Self {
            identifier: preset(0.3, 0.7, (20, 40)),
            quoted_phrase: preset(0.3, 0.7, (16, 40)),
            sql: preset(0.4, 0.6, (20, 30)),
            measurement: preset(0.45, 0.55, (16, 24)),
            date_time: preset(0.45, 0.55, (16, 24)),
            ownership: preset(0.5, 0.5, (16, 16)),
            location: preset(0.5, 0.5, (16, 16)),
            definition: preset(0.5, 0.5, (16, 16)),
            procedure: preset(0.6, 0.4, (24, 16)),
            multi_entity: preset(0.5, 0.5, (20, 20)),
            claim: preset(0.5, 0.5, (16, 16)),
            exploratory: preset(0.7, 0.3, (30, 12)),
        }
    }
}

impl IntentPresets {
    /// The preset of an analysed intent (code search takes the exploratory one's depth: its weights
    /// are the code-search rule's, set after retrieval).
    pub fn of(&self, intent: Intent) -> Preset {
        match intent {
            Intent::Identifier => self.identifier,
            Intent::QuotedPhrase => self.quoted_phrase,
            Intent::Sql => self.sql,
            Intent::Measurement => self.measurement,
            Intent::DateTime => self.date_time,
            Intent::Ownership => self.ownership,
            Intent::Location => self.location,
            Intent::Definition => self.definition,
            Intent::Procedure => self.procedure,
            Intent::MultiEntity => self.multi_entity,
            Intent::Claim => self.claim,
            Intent::Exploratory | Intent::CodeSearch => self.exploratory,
        }
    }

    /// Checks every preset: weights finite, non-negative and not both zero; depths at most 1000.
    pub fn validate(&self) -> Result<(), String> {
        for intent in Intent::ANALYZED {
            let Preset { weights, depth } = self.of(intent);
            let ok = |w: f32| w.is_finite() && w >= 0.0;
            if !ok(weights.dense) || !ok(weights.bm25) || weights.dense + weights.bm25 <= 0.0 {
                return Err(format!(
                    "query.intents.{intent}: weights must be finite, non-negative and not both zero"
                ));
            }
            if depth.dense > 1000 || depth.bm25 > 1000 {
                return Err(format!(
                    "query.intents.{intent}: depth must be at most 1000"
                ));
            }
        }
        Ok(())
    }
}

/// Analyzes a query: intent, weights, lane depths and rerank features.
pub fn analyze(text: &str, bm25: &Bm25Encoder, presets: &IntentPresets) -> Plan {
    let words = Words::new(text);
    let phrases = quoted(text);
    let identifiers = words.identifiers();
    let dates = words.dates();
    let entities = words.entities(&identifiers, &phrases);
    let signals = words.signals(&identifiers, &phrases, &entities, &dates);
    let intent = Intent::ANALYZED
        .into_iter()
        .find(|intent| signals.contains(&Signal::Shows(*intent)))
        .unwrap_or(Intent::Exploratory);
    let preset = presets.of(intent);
    let sequence = bm25.terms(text);
    let mut terms = sequence.clone();
    terms.sort();
    terms.dedup();
    let pairs = term_pairs(&sequence, &terms);
    Plan {
        intent,
        signals,
        weights: preset.weights,
        depth: preset.depth,
        terms,
        pairs,
        entities,
        dates,
        lexical: 1.0,
    }
}

/// The pairs of terms that follow each other in `sequence` (the query's terms in order), as indices
/// into `terms` (sorted, each once), each pair once; a term followed by itself is no phrase.
fn term_pairs(sequence: &[String], terms: &[String]) -> Vec<(u32, u32)> {
    let index = |term: &String| terms.binary_search(term).ok().map(|i| i as u32);
    let mut pairs: Vec<(u32, u32)> = sequence
        .windows(2)
        .filter_map(|w| Some((index(&w[0])?, index(&w[1])?)))
        .filter(|(a, b)| a != b)
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn analyzed(text: &str) -> Plan {
        analyze(text, &Bm25Encoder::default(), &IntentPresets::default())
    }

    fn intent(text: &str) -> (&'static str, Weights, Depth) {
        let plan = analyzed(text);
        (plan.intent.as_str(), plan.weights, plan.depth)
    }

    #[test]
    fn each_intent_has_a_trigger() {
        let cases = [
            ("where is parse_config called", "identifier"),
            ("what does HttpServer::bind() return", "identifier"),
            (
                "find \"exactly once delivery\" in the docs",
                "quoted_phrase",
            ),
            ("which table has the customer email column", "sql"),
            ("how many people live in Warsaw", "measurement"),
            ("when did the war end", "date_time"),
            ("what happened in 1969", "date_time"),
            ("who owns the billing service", "ownership"),
            ("where is the eiffel tower", "location"),
            ("what is a vector database", "definition"),
            ("how do I rotate the api key", "procedure"),
            (
                "Which NFL team represented the AFC at Super Bowl 50?",
                "multi_entity",
            ),
            (
                "0-dimensional biomaterials show inductive properties.",
                "claim",
            ),
            ("why is the sky blue", "exploratory"),
        ];
        for (text, expected) in cases {
            assert_eq!(intent(text).0, expected, "{text}");
        }
    }

    #[test]
    fn presets_lean_as_documented() {
        let (_, identifier, depth) = intent("where is parse_config called");
        assert!(identifier.bm25 > identifier.dense);
        assert_eq!((depth.dense, depth.bm25), (20, 40));
        let (_, definition, depth) = intent("what is a vector database");
        assert_eq!((definition.dense, definition.bm25), (0.5, 0.5));
        assert_eq!((depth.dense, depth.bm25), (16, 16));
        let (_, exploratory, depth) = intent("why is the sky blue");
        assert_eq!((exploratory.dense, exploratory.bm25), (0.7, 0.3));
        assert_eq!((depth.dense, depth.bm25), (30, 12));
    }

    #[test]
    fn the_lane_an_intent_leans_on_is_read_at_least_as_deep() {
        let presets = IntentPresets::default();
        presets.validate().expect("the defaults are valid");
        for intent in Intent::ANALYZED {
            let Preset { weights, depth } = presets.of(intent);
            if weights.bm25 > weights.dense {
                assert!(depth.bm25 > depth.dense, "{intent}");
            } else if weights.dense > weights.bm25 {
                assert!(depth.dense > depth.bm25, "{intent}");
            } else {
                assert_eq!(depth.dense, depth.bm25, "{intent}");
            }
        }
    }

    #[test]
    fn names_are_their_serialised_forms_and_presets_are_overridden_whole() {
        assert_eq!(Signal::Shows(Intent::Sql).as_str(), "sql");
        assert_eq!(Signal::NamesLanguage.as_str(), "names_language");
        for intent in Intent::ALL {
            let json = serde_json::to_value(intent).unwrap();
            assert_eq!(json, intent.as_str());
            assert_eq!(serde_json::from_value::<Intent>(json).unwrap(), intent);
        }
        assert!(serde_json::from_value::<Intent>("exploratry".into()).is_err());
        let procedure = r#"{"procedure": {"weights": {"dense": 0.9, "bm25": 0.1}, "depth": {"dense": 40, "bm25": 8}}}"#;
        let presets: IntentPresets = serde_json::from_str(procedure).unwrap();
        assert_eq!(presets.procedure, preset(0.9, 0.1, (40, 8)));
        assert_eq!(presets.identifier, IntentPresets::default().identifier);
        let plan = analyze("how do I rotate the key", &Bm25Encoder::default(), &presets);
        assert_eq!((plan.intent, plan.weights.dense), (Intent::Procedure, 0.9));
        // A misspelt intent or a partial preset is refused, not ignored.
        assert!(serde_json::from_str::<IntentPresets>(r#"{"procedur": {}}"#).is_err());
        assert!(serde_json::from_str::<IntentPresets>(
            r#"{"procedure": {"weights": {"dense": 0.9, "bm25": 0.1}}}"#
        )
        .is_err());
        let mut zero = IntentPresets::default();
        zero.claim.weights = Weights {
            dense: 0.0,
            bm25: 0.0,
        };
        assert!(zero.validate().unwrap_err().contains("query.intents.claim"));
    }

    #[test]
    fn features_for_the_rerank() {
        let plan = analyzed("What did Tesla announce in May 2019 about \"Model Y\"?");
        assert!(plan.dates.contains(&"2019".to_string()));
        assert!(plan.dates.contains(&"may".to_string()));
        assert!(plan.entities.contains(&"Tesla".to_string()));
        assert!(plan.entities.contains(&"Model Y".to_string()));
        assert!(plan.terms.contains(&"tesla".to_string()));
        // "may" as a verb is not a date.
        assert!(analyzed("it may rain").dates.is_empty());
    }

    #[test]
    fn a_named_programming_language_is_a_signal_not_an_intent() {
        for text in [
            "read a csv file in Python",
            "how to reverse a string (javascript)",
            "c++ sort a vector descending",
            "parse json with C#",
            "sort a map by value in go",
            "handle errors using Rust?",
        ] {
            let plan = analyzed(text);
            assert!(
                plan.signals.contains(&Signal::NamesLanguage),
                "{text}: {:?}",
                plan.signals
            );
        }
        // The intent is the one the other signals choose.
        assert_eq!(
            analyzed("how to read a file in python").intent,
            Intent::Procedure
        );
        // Everyday words that name a language elsewhere.
        for text in [
            "go to the main page",
            "rust on the iron bridge",
            "the ruby was found in 1912",
            "which python species lives in Florida",
            "how to hold a c major chord",
        ] {
            let plan = analyzed(text);
            let named = plan.signals.contains(&Signal::NamesLanguage);
            assert_eq!(named, text.contains("python"), "{text}: {:?}", plan.signals);
        }
    }
}
