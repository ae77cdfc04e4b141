//! Surrogate tiers: how much of a chunk a context may show, chosen per chunk by a policy.
//!
//! - `full`: any form the packer chooses (expanded, snippets, the smallest surrogate);
//! - `gist`: the chunk's most central sentences (those sharing most words with the rest of the
//!   chunk, whatever the query), in text order, within `gist_tokens`, after its title and section;
//! - `micro`: its key phrases (names, identifiers and its most frequent content words).
//!
//! Policies (`query.pack.surrogates.policy`): `disabled` (every chunk `full`, the default); `age`
//! (the document changed < `age_full_days` ago: full; < `age_gist_days`: gist; older: micro; an
//! unknown time counts as new); `importance` (the chunk's access frequency, its packings over the
//! most-packed chunk's of its tenant, > `importance_full`: full; > `importance_gist`: gist; else
//! micro; a tenant nothing of which was packed yet: full). The
//! query-aware boost raises a chunk one tier when it holds one of the query's quoted phrases or
//! named entities.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::model::Chunk;
use crate::text::{is_stop_word, sentences, visit_words};

/// How much of a chunk a context may show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SurrogateTier {
    /// Key phrases only.
    Micro,
    /// Central sentences within the gist budget.
    Gist,
    /// Any form.
    Full,
}

impl SurrogateTier {
    /// The name.
    pub fn as_str(self) -> &'static str {
        match self {
            SurrogateTier::Micro => "micro",
            SurrogateTier::Gist => "gist",
            SurrogateTier::Full => "full",
        }
    }

    /// One tier up (full stays full).
    pub fn raised(self) -> Self {
        match self {
            SurrogateTier::Micro => SurrogateTier::Gist,
            _ => SurrogateTier::Full,
        }
    }
}

/// Which policy picks the tiers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SurrogatePolicy {
    /// Every chunk `full`.
    #[default]
    Disabled,
    /// By the age of the chunk's document.
    Age,
    /// By how often the chunk was packed.
    Importance,
}

/// Surrogate tiers (config section `query.pack.surrogates`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SurrogateConfig {
    /// The policy.
    pub policy: SurrogatePolicy,
    /// Age policy: younger than this (days) is `full`.
    pub age_full_days: f64,
    /// Age policy: younger than this (days) is `gist`; older is `micro`.
    pub age_gist_days: f64,
    /// Importance policy: access frequency above this is `full`.
    pub importance_full: f32,
    /// Importance policy: above this is `gist`; at or below, `micro`.
    pub importance_gist: f32,
    /// Raise a chunk one tier when it holds one of the query's quoted phrases or named entities.
    pub query_boost: bool,
    /// Most tokens of a gist (estimated from the chunk's stored count).
    pub gist_tokens: usize,
    /// Key phrases of a micro surrogate.
    pub micro_phrases: usize,
    /// Chunks whose packings are counted (the least recently packed are forgotten first).
    pub access_entries: usize,
}

impl Default for SurrogateConfig {
    fn default() -> Self {
        Self {
            policy: SurrogatePolicy::Disabled,
            age_full_days: 7.0,
            age_gist_days: 30.0,
            importance_full: 0.6,
            importance_gist: 0.3,
            query_boost: true,
            gist_tokens: 60,
            micro_phrases: 8,
            access_entries: 100_000,
        }
    }
}

const DAY_MS: f64 = 86_400_000.0;

/// The tier of `chunk` and why. `importance` is the chunk's access frequency (importance policy;
/// `None` while nothing of the tenant was packed: full), `entities` the query's quoted phrases and
/// named entities.
pub fn choose(
    config: &SurrogateConfig,
    chunk: &Chunk,
    now_ms: u64,
    importance: Option<f32>,
    entities: &[String],
) -> (SurrogateTier, String) {
    let (tier, mut why) = match config.policy {
        SurrogatePolicy::Disabled => return (SurrogateTier::Full, "policy disabled".into()),
        SurrogatePolicy::Age if chunk.updated_ms == 0 => {
            (SurrogateTier::Full, "age unknown (no updated_at)".into())
        }
        SurrogatePolicy::Age => {
            let days = now_ms.saturating_sub(chunk.updated_ms) as f64 / DAY_MS;
            let tier = if days < config.age_full_days {
                SurrogateTier::Full
            } else if days < config.age_gist_days {
                SurrogateTier::Gist
            } else {
                SurrogateTier::Micro
            };
            (tier, format!("age {days:.1} days"))
        }
        SurrogatePolicy::Importance if importance.is_none() => (
            SurrogateTier::Full,
            "no access counts yet for this tenant".into(),
        ),
        SurrogatePolicy::Importance => {
            let importance = importance.unwrap_or(0.0);
            let tier = if importance > config.importance_full {
                SurrogateTier::Full
            } else if importance > config.importance_gist {
                SurrogateTier::Gist
            } else {
                SurrogateTier::Micro
            };
            (tier, format!("access frequency {importance:.2}"))
        }
    };
    if tier != SurrogateTier::Full && config.query_boost {
        let text = chunk.text.to_lowercase();
        if let Some(hit) = entities
            .iter()
            .find(|e| e.chars().count() > 1 && text.contains(&e.to_lowercase()))
        {
            why.push_str(&format!(", raised: holds the query's \"{hit}\""));
            return (tier.raised(), why);
        }
    }
    (tier, why)
}

fn content_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    visit_words(text, &mut |word| {
        let lower = word.to_lowercase();
        if lower.chars().count() > 2 && !is_stop_word(&lower) {
            out.push(lower);
        }
    });
    out
}

/// The gist of `text`: its most central sentences (most words shared with the chunk's other
/// sentences, per word of the sentence), in text order, within `max_bytes`; a sentence sharing no
/// word with the others is left out.
pub fn gist(text: &str, max_bytes: usize) -> String {
    let spans = sentences(text);
    if spans.is_empty() {
        return String::new();
    }
    let words: Vec<Vec<String>> = spans
        .iter()
        .map(|&(a, b)| content_words(&text[a..b]))
        .collect();
    let mut frequency: HashMap<&str, usize> = HashMap::new();
    for sentence in &words {
        let mut seen = std::collections::HashSet::new();
        for word in sentence {
            if seen.insert(word.as_str()) {
                *frequency.entry(word.as_str()).or_default() += 1;
            }
        }
    }
    // Centrality: how many other sentences share each of the sentence's words, averaged.
    let centrality: Vec<f32> = words
        .iter()
        .map(|sentence| {
            if sentence.is_empty() {
                return 0.0;
            }
            let shared: usize = sentence
                .iter()
                .map(|w| frequency.get(w.as_str()).copied().unwrap_or(1) - 1)
                .sum();
            shared as f32 / (sentence.len() as f32).sqrt()
        })
        .collect();
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by(|&a, &b| centrality[b].total_cmp(&centrality[a]).then(a.cmp(&b)));
    let order_first = order[0];
    let mut chosen = Vec::new();
    let mut used = 0;
    for index in order {
        let (a, b) = spans[index];
        let length = text[a..b].trim().len() + 1;
        // A sentence sharing no word with the rest is not central (unless none is: the first).
        let off_topic = centrality[index] == 0.0 && !chosen.is_empty();
        if used + length > max_bytes || off_topic {
            continue;
        }
        used += length;
        chosen.push(index);
    }
    if chosen.is_empty() {
        // Even the most central sentence is too long: its beginning.
        let (a, b) = spans[order_first];
        let sentence = text[a..b].trim();
        let cut = sentence.floor_char_boundary(max_bytes.min(sentence.len()));
        return sentence[..cut].trim_end().to_string();
    }
    chosen.sort_unstable();
    chosen
        .iter()
        .map(|&i| text[spans[i].0..spans[i].1].trim())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The key phrases of `text`: names (runs of capitalised words), identifiers and its most frequent
/// content words, the `n` most frequent (a name counted three times, a capitalised word or an
/// identifier twice), joined by "; "; a word of a chosen name is not repeated.
pub fn key_phrases(text: &str, n: usize) -> String {
    let mut counts: BTreeMap<String, (usize, usize, String)> = BTreeMap::new();
    let mut position = 0;
    let mut add = |phrase: &str, weight: usize, position: usize| {
        let key = phrase.to_lowercase();
        let entry = counts
            .entry(key)
            .or_insert_with(|| (0, position, phrase.to_string()));
        entry.0 += weight;
    };
    let mut run: Vec<String> = Vec::new();
    let flush =
        |run: &mut Vec<String>, position: usize, add: &mut dyn FnMut(&str, usize, usize)| {
            if run.len() > 1 {
                add(&run.join(" "), 3, position);
            }
            run.clear();
        };
    for raw in text.split_whitespace() {
        let word = raw.trim_matches(|c: char| !c.is_alphanumeric() && c != '_');
        position += 1;
        if word.is_empty() {
            flush(&mut run, position, &mut add);
            continue;
        }
        let lower = word.to_lowercase();
        let identifier = word.contains('_')
            || word.contains("::")
            || word.chars().any(|c| c.is_ascii_digit()) && word.chars().any(|c| c.is_alphabetic());
        let capitalised = word.chars().next().is_some_and(char::is_uppercase);
        if capitalised && !is_stop_word(&lower) {
            run.push(word.to_string());
        } else {
            flush(&mut run, position, &mut add);
        }
        if lower.chars().count() > 2 && !is_stop_word(&lower) {
            add(
                word,
                if identifier || capitalised { 2 } else { 1 },
                position,
            );
        }
        if raw.ends_with(['.', ',', ';', ':', '!', '?']) {
            flush(&mut run, position, &mut add);
        }
    }
    flush(&mut run, position, &mut add);
    let mut phrases: Vec<(usize, usize, String)> = counts.into_values().collect();
    // Most frequent first, then earliest; a word inside a chosen name is left out.
    phrases.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut chosen: Vec<String> = Vec::new();
    for (_, _, phrase) in phrases {
        if chosen.len() == n {
            break;
        }
        let lower = phrase.to_lowercase();
        if chosen.iter().any(|c| {
            let c = c.to_lowercase();
            c.split(' ').any(|w| w == lower) || lower.split(' ').any(|w| w == c)
        }) {
            continue;
        }
        chosen.push(phrase);
    }
    chosen.join("; ")
}

/// How often chunks were packed, per tenant, for the importance policy. At most `capacity` chunks
/// are counted; past that the least recently packed is forgotten (and its tenant's maximum
/// recomputed if it held it).
#[derive(Debug, Clone)]
pub struct AccessCounts {
    /// (tenant, chunk id) → (packings, the clock of the last one).
    counts: HashMap<(String, String), (u64, u64)>,
    /// Packings, oldest first; an entry whose clock is not its chunk's last is stale and skipped.
    order: VecDeque<((String, String), u64)>,
    clock: u64,
    capacity: usize,
    /// The most packings of one chunk, per tenant.
    max: HashMap<String, u64>,
}

impl AccessCounts {
    /// Counts for at most `capacity` chunks.
    pub fn new(capacity: usize) -> Self {
        Self {
            counts: HashMap::new(),
            order: VecDeque::new(),
            clock: 0,
            capacity: capacity.max(1),
            max: HashMap::new(),
        }
    }

    /// One more packing of each of `chunk_ids` of `tenant`.
    pub fn record<'a>(&mut self, tenant: &str, chunk_ids: impl IntoIterator<Item = &'a str>) {
        for id in chunk_ids {
            self.clock += 1;
            let key = (tenant.to_string(), id.to_string());
            let entry = self.counts.entry(key.clone()).or_insert((0, 0));
            entry.0 += 1;
            entry.1 = self.clock;
            let count = entry.0;
            self.order.push_back((key, self.clock));
            let max = self.max.entry(tenant.to_string()).or_insert(0);
            *max = (*max).max(count);
        }
        while self.counts.len() > self.capacity {
            let Some((key, stamp)) = self.order.pop_front() else {
                break;
            };
            if self
                .counts
                .get(&key)
                .is_some_and(|(_, last)| *last == stamp)
            {
                let (count, _) = self.counts.remove(&key).expect("present");
                if self.max.get(&key.0) == Some(&count) {
                    let max = self
                        .counts
                        .iter()
                        .filter(|((t, _), _)| *t == key.0)
                        .map(|(_, (c, _))| *c)
                        .max();
                    match max {
                        Some(max) => self.max.insert(key.0, max),
                        None => self.max.remove(&key.0),
                    };
                }
            }
        }
        // Stale entries are dropped once they outnumber the live ones.
        if self.order.len() > 4 * self.capacity + 64 {
            let mut live: Vec<((String, String), u64)> = self
                .counts
                .iter()
                .map(|(key, (_, last))| (key.clone(), *last))
                .collect();
            live.sort_by_key(|(_, last)| *last);
            self.order = live.into();
        }
    }

    /// A chunk's packings over the most packings of one chunk of its tenant; `None` while nothing
    /// of the tenant was packed.
    pub fn frequency(&self, tenant: &str, chunk_id: &str) -> Option<f32> {
        let max = *self.max.get(tenant).filter(|m| **m > 0)?;
        let count = self
            .counts
            .get(&(tenant.to_string(), chunk_id.to_string()))
            .map_or(0, |(count, _)| *count);
        Some(count as f32 / max as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(text: &str, updated_ms: u64) -> Chunk {
        Chunk {
            order_index: 0,
            section_path: vec![],
            header: String::new(),
            doc_title: String::new(),
            source: String::new(),
            kind: crate::model::DocKind::Prose,
            lines: (1, 1),
            page: None,
            char_range: (0, text.len() as u32),
            tokens: 10,
            content_hash: String::new(),
            occurrence: 0,
            acl: vec![],
            lang: String::new(),
            updated_ms,
            metadata: Default::default(),
            text: text.into(),
            last: false,
        }
    }

    const NOW: u64 = 1_800_000_000_000;
    const DAY: u64 = 86_400_000;

    #[test]
    fn the_age_policy_ages_chunks_into_smaller_tiers_and_the_query_raises_them() {
        let config = SurrogateConfig {
            policy: SurrogatePolicy::Age,
            ..SurrogateConfig::default()
        };
        let tier = |days: u64, entities: &[String]| {
            choose(
                &config,
                &chunk("The Lisbon office moved in May.", NOW - days * DAY),
                NOW,
                None,
                entities,
            )
        };
        assert_eq!(tier(1, &[]).0, SurrogateTier::Full);
        assert_eq!(tier(10, &[]).0, SurrogateTier::Gist);
        let (old, why) = tier(45, &[]);
        assert_eq!(old, SurrogateTier::Micro);
        assert!(why.contains("age 45.0 days"), "{why}");
        let (raised, why) = tier(45, &["Lisbon".to_string()]);
        assert_eq!(raised, SurrogateTier::Gist);
        assert!(
            why.contains("raised: holds the query's \"Lisbon\""),
            "{why}"
        );
        assert_eq!(tier(10, &["lisbon".to_string()]).0, SurrogateTier::Full);
        // Unknown times count as new; a disabled policy is full.
        assert_eq!(
            choose(&config, &chunk("x", 0), NOW, None, &[]).0,
            SurrogateTier::Full
        );
        let off = SurrogateConfig::default();
        assert_eq!(
            choose(&off, &chunk("x", NOW - 400 * DAY), NOW, None, &[]).0,
            SurrogateTier::Full
        );
    }

    #[test]
    fn the_importance_policy_follows_access_frequency() {
        let config = SurrogateConfig {
            policy: SurrogatePolicy::Importance,
            query_boost: false,
            ..SurrogateConfig::default()
        };
        let mut counts = AccessCounts::new(10);
        let tier = |counts: &AccessCounts, tenant: &str, id: &str| {
            choose(
                &config,
                &chunk("x", 0),
                NOW,
                counts.frequency(tenant, id),
                &[],
            )
            .0
        };
        // Nothing packed yet: full, not micro.
        assert_eq!(tier(&counts, "t", "any"), SurrogateTier::Full);
        for _ in 0..10 {
            counts.record("t", ["hot"]);
        }
        for _ in 0..5 {
            counts.record("t", ["warm"]);
        }
        counts.record("t", ["cold"]);
        assert_eq!(tier(&counts, "t", "hot"), SurrogateTier::Full);
        assert_eq!(tier(&counts, "t", "warm"), SurrogateTier::Gist);
        assert_eq!(tier(&counts, "t", "cold"), SurrogateTier::Micro);
        assert_eq!(tier(&counts, "t", "never"), SurrogateTier::Micro);
        // Another tenant's traffic does not set this one's scale.
        counts.record("other", ["x"]);
        assert_eq!(counts.frequency("other", "x"), Some(1.0));
        assert_eq!(counts.frequency("t", "warm"), Some(0.5));
        // Bounded, least recently packed first: `a` packed again outlives `b`.
        let mut small = AccessCounts::new(2);
        small.record("t", ["a", "b"]);
        small.record("t", ["a"]);
        small.record("t", ["c"]);
        assert_eq!(small.frequency("t", "b"), Some(0.0), "forgotten");
        assert_eq!(small.frequency("t", "a"), Some(1.0));
        // Forgetting the chunk that held the maximum recomputes it.
        small.record("t", ["c", "d"]);
        assert_eq!(small.frequency("t", "c"), Some(1.0), "{small:?}");
        for _ in 0..100 {
            small.record("t", ["e"]);
        }
        assert!(small.order.len() <= 4 * 2 + 64 + 1);
    }

    #[test]
    fn a_gist_keeps_the_central_sentences_in_order_and_micro_the_key_phrases() {
        let text = "Releases ship on Tuesday. The deployctl pipeline tags each release and ships it. \
                    Lunch is at noon. A release that fails is rolled back by the deployctl pipeline.";
        let gist = gist(text, 140);
        assert!(gist.len() <= 140, "{gist}");
        assert!(gist.contains("deployctl pipeline tags"), "{gist}");
        assert!(
            !gist.contains("Lunch"),
            "the off-topic sentence is not central: {gist}"
        );
        assert!(
            gist.find("tags").unwrap() < gist.find("rolled").unwrap_or(usize::MAX),
            "text order"
        );
        // Too small for any sentence: the first one's beginning.
        assert!(!super::gist(text, 10).is_empty());
        let micro = key_phrases(
            "Monarch Butterflies fly from Canada to Mexico. Monarch Butterflies overwinter in fir forests of Mexico; parse_config reads the route.",
            4,
        );
        let phrases: Vec<&str> = micro.split("; ").collect();
        assert_eq!(phrases.len(), 4, "{micro}");
        assert_eq!(phrases[0], "Monarch Butterflies", "{micro}");
        assert!(phrases.contains(&"Mexico"), "{micro}");
        assert!(
            !phrases.contains(&"Monarch"),
            "a word of a chosen name is not repeated: {micro}"
        );
    }
}
