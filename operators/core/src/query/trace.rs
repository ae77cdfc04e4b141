//! Why each candidate was kept, moved or dropped: typed decisions ([`Step`], [`Action`], [`Cause`]) and
//! the trace a context carries. Metric labels are the enums' names (`as_str`), never parsed from text.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use super::{Candidate, LaneHit, Tier};

/// The step that decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Fusion of the lanes.
    Fuse,
    /// The reranker endpoint over the rerank window.
    Rerank,
    /// Duplicate removal (exact, and near-duplicates against each MMR pick).
    Dedup,
    /// MMR selection with its caps.
    Mmr,
    /// Packing into the budget.
    Pack,
}

/// What the step did to the candidate (or the query).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The query's fusion weights changed.
    Adapted,
    /// Left out.
    Dropped,
    /// Held back (MMR caps); packed only if budget is left.
    Deferred,
    /// Packed as the expanded tier.
    Expanded,
    /// Packed as a snippet.
    Snippet,
    /// Packed as a surrogate.
    Surrogate,
    /// Packed whole.
    Full,
    /// Packed as its gist (surrogate tier).
    Gist,
    /// Packed as its key phrases (surrogate tier).
    Micro,
}

impl Step {
    /// The step's name (as serialised).
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Fuse => "fuse",
            Step::Rerank => "rerank",
            Step::Dedup => "dedup",
            Step::Mmr => "mmr",
            Step::Pack => "pack",
        }
    }
}

impl Action {
    /// The action's name (as serialised).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Adapted => "adapted",
            Action::Dropped => "dropped",
            Action::Deferred => "deferred",
            Action::Expanded => "expanded",
            Action::Snippet => "snippet",
            Action::Surrogate => "surrogate",
            Action::Full => "full",
            Action::Gist => "gist",
            Action::Micro => "micro",
        }
    }
}

impl From<Tier> for Action {
    fn from(tier: Tier) -> Self {
        match tier {
            Tier::Expanded => Action::Expanded,
            Tier::Snippet => Action::Snippet,
            Tier::Surrogate => Action::Surrogate,
            Tier::Full => Action::Full,
            Tier::Gist => Action::Gist,
            Tier::Micro => Action::Micro,
        }
    }
}

/// Why, bounded: each cause belongs to one step, and metrics take their labels from it
/// ([`Cause::as_str`]); the decision's `reason` adds the particulars for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Fuse: the same point or document offset came twice from one lane.
    LaneDuplicate,
    /// Fuse: the lanes' evidence changed the intent's weights.
    EvidenceRule,
    /// Dedup: the same text (up to case and whitespace) was kept already.
    Exact,
    /// Dedup: within the near-duplicate cosine of an MMR pick.
    NearDuplicate,
    /// Mmr: the document's cap was reached.
    DocumentCap,
    /// Mmr: the section's cap was reached.
    SectionCap,
    /// Mmr: more than k candidates.
    BeyondK,
    /// Pack: the text is already in the context.
    Overlap,
    /// Pack: the lowest marginal value when over budget.
    OverBudget,
    /// Pack: packed in its first form.
    Fits,
    /// Pack: packed in a shorter form to fit.
    Shortened,
    /// Pack: a deferred candidate packed with budget left over.
    BudgetLeft,
    /// Pack: left out by the evidence stop (scored too far below the top candidate).
    EvidenceStop,
    /// Pack: held to its best sentence by the evidence band (scored well below the top candidate).
    EvidenceBand,
    /// Rerank: the reranker endpoint failed or timed out; the built-in order was kept.
    EndpointFallback,
    /// Pack: packed in the surrogate tier its policy chose (gist or micro).
    SurrogatePolicy,
    /// Pack: shortened or left out because its form's tier was full (`max_snippets`,
    /// `max_surrogates`).
    TierCap,
}

impl Cause {
    /// The step this cause belongs to.
    pub fn step(self) -> Step {
        match self {
            Cause::LaneDuplicate | Cause::EvidenceRule => Step::Fuse,
            Cause::Exact | Cause::NearDuplicate => Step::Dedup,
            Cause::DocumentCap | Cause::SectionCap | Cause::BeyondK => Step::Mmr,
            Cause::Overlap
            | Cause::OverBudget
            | Cause::Fits
            | Cause::Shortened
            | Cause::BudgetLeft
            | Cause::EvidenceStop
            | Cause::EvidenceBand
            | Cause::SurrogatePolicy
            | Cause::TierCap => Step::Pack,
            Cause::EndpointFallback => Step::Rerank,
        }
    }

    /// The cause's name (as serialised, and as a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::LaneDuplicate => "lane_duplicate",
            Cause::EvidenceRule => "evidence_rule",
            Cause::Exact => "exact",
            Cause::NearDuplicate => "near_duplicate",
            Cause::DocumentCap => "document_cap",
            Cause::SectionCap => "section_cap",
            Cause::BeyondK => "beyond_k",
            Cause::Overlap => "overlap",
            Cause::OverBudget => "over_budget",
            Cause::Fits => "fits",
            Cause::Shortened => "shortened",
            Cause::BudgetLeft => "budget_left",
            Cause::EvidenceStop => "evidence_stop",
            Cause::EvidenceBand => "evidence_band",
            Cause::EndpointFallback => "endpoint_fallback",
            Cause::SurrogatePolicy => "surrogate_policy",
            Cause::TierCap => "tier_cap",
        }
    }
}

/// Why a candidate left the pipeline, or what happened to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Decision {
    /// The point id (empty for a decision about the whole query, such as adapted fusion weights).
    pub chunk_id: String,
    /// The step that decided (always `cause.step()`).
    pub step: Step,
    /// What it decided.
    pub action: Action,
    /// Why, bounded.
    pub cause: Cause,
    /// Why, for people (the particulars: caps, cosines, tiers).
    pub reason: String,
}

impl Decision {
    /// A decision with its step taken from `cause`.
    pub fn new(
        chunk_id: impl Into<String>,
        action: Action,
        cause: Cause,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            chunk_id: chunk_id.into(),
            step: cause.step(),
            action,
            cause,
            reason: reason.into(),
        }
    }
}

/// A candidate as shown in the trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TraceCandidate {
    /// The point id.
    pub chunk_id: String,
    /// The document.
    pub doc_id: String,
    /// Dense lane rank and score.
    pub dense: Option<LaneHit>,
    /// BM25 lane rank and score.
    pub bm25: Option<LaneHit>,
    /// Fused score.
    pub fused: f32,
    /// Rerank factors.
    pub factors: BTreeMap<String, f32>,
    /// Final score.
    pub score: f32,
}

impl From<&Candidate> for TraceCandidate {
    fn from(candidate: &Candidate) -> Self {
        Self {
            chunk_id: candidate.id(),
            doc_id: candidate.stored.key.doc_id.clone(),
            dense: candidate.dense,
            bm25: candidate.bm25,
            fused: candidate.fused,
            factors: candidate
                .factors
                .iter()
                .map(|(name, value)| (name.to_string(), *value))
                .collect(),
            score: candidate.score,
        }
    }
}

/// What HyDE did for a query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HydeTrace {
    /// The strategy (`combined` or `hyde`).
    pub strategy: super::endpoints::HydeStrategy,
    /// Passages written (`num_hypotheses`, or fewer where the model wrote fewer).
    pub hypotheses: usize,
    /// The passages' share of the dense query.
    pub weight: f32,
    /// Whether they came from the passage cache.
    pub cached: bool,
    /// Whether their mean vector joined the dense query (not when the embedder failed).
    pub joined: bool,
}

/// The trace of every decision, returned when the query asks for it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Trace {
    /// What the analyzer (and the code-search rule) saw: each signal by its name (an intent's
    /// trigger as its intent, `names_language`, `code_hits`).
    #[serde(with = "signal_names")]
    #[cfg_attr(feature = "schema", schemars(with = "Vec<String>"))]
    pub signals: Vec<super::intent::Signal>,
    /// Candidates each lane was asked for: the intent's depth raised to the query's floor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<super::Depth>,
    /// A filled query's pool, in stored tokens: the lanes kept their best hits, in turn, until the
    /// distinct chunks held this many (`depth` a lane at most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<usize>,
    /// HyDE, when the query got hypothetical passages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hyde: Option<HydeTrace>,
    /// Candidates after fusion and rerank, in order.
    pub candidates: Vec<TraceCandidate>,
    /// Every decision, in pipeline order.
    pub decisions: Vec<Decision>,
}

/// Signals on the wire: their names ([`super::intent::Signal::as_str`]).
mod signal_names {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::super::intent::Signal;

    pub fn serialize<S: Serializer>(signals: &[Signal], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(signals.iter().map(|signal| signal.as_str()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Signal>, D::Error> {
        Vec::<String>::deserialize(deserializer)?
            .iter()
            .map(|name| {
                Signal::from_name(name)
                    .ok_or_else(|| D::Error::custom(format!("unknown signal {name:?}")))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::intent::{Intent, Signal};

    #[test]
    fn signals_are_their_names_on_the_wire_and_read_back() {
        let mut signals = vec![Signal::NamesLanguage, Signal::CodeHits];
        signals.extend(Intent::ALL.iter().map(|intent| Signal::Shows(*intent)));
        let trace = Trace {
            signals: signals.clone(),
            ..Trace::default()
        };
        let wire = serde_json::to_value(&trace).expect("encoded");
        let names: Vec<&str> = signals.iter().map(|s| s.as_str()).collect();
        assert_eq!(wire["signals"], serde_json::json!(names));
        assert_eq!(
            serde_json::from_value::<Trace>(wire.clone()).expect("decoded"),
            trace
        );
        let mut unknown = wire;
        unknown["signals"] = serde_json::json!(["no_such_signal"]);
        assert!(serde_json::from_value::<Trace>(unknown).is_err());
    }
}
