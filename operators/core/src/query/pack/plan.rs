//! One packing, in phases: [`plan`] builds each candidate's forms and values it (the evidence stop
//! and band, text already planned); [`fit`] shrinks the plan to the budget on estimates, grows it
//! back to what fits and then counts the real string; [`report`] turns the plan into items,
//! decisions and the note.

use std::collections::BTreeMap;
use std::ops::Range;

use super::forms::*;
use super::whole::{expanded, whole_chunk};
use super::{render, wrap_items, PackConfig, PackRequest, Packed, UNTRUSTED_CLOSE, UNTRUSTED_OPEN};
use crate::embed::{cosine_with_norms, dot};
use crate::query::surrogate::SurrogateTier;
use crate::query::{Action, Candidate, Cause, ContextItem, Decision, Tier};

mod caps;
use caps::{cap_tiers, caps, caps_hold};

struct Entry<'a> {
    candidate: &'a Candidate,
    forms: Vec<Form>,
    /// Index into `forms`, `None` when left out.
    state: Option<usize>,
    value: f32,
    deferred: bool,
    /// Index into the picked-then-deferred list (and `tiers`).
    position: usize,
    /// The candidate's standing when the evidence band holds it to its best sentence.
    band: Option<f32>,
    /// Shortened or left out by a tier cap.
    capped: bool,
}

/// Estimated tokens of the plan: items, separators and (when anything is in it) the delimiters.
fn plan_tokens(entries: &[Entry<'_>], separator: usize, delimiters: usize) -> usize {
    let (tokens, items) = entries
        .iter()
        .filter_map(|e| e.state.map(|s| e.forms[s].estimate))
        .fold((0, 0), |(tokens, items), estimate| {
            (tokens + estimate, items + 1)
        });
    if items == 0 {
        return 0;
    }
    tokens + separator * (items - 1) + delimiters
}

/// Takes the cheapest shrink step (least value lost per token saved). Returns false if none is left.
fn shrink(entries: &mut [Entry<'_>]) -> bool {
    let mut best: Option<(usize, Option<usize>, f32)> = None;
    for (index, entry) in entries.iter().enumerate() {
        let Some(state) = entry.state else { continue };
        let current = &entry.forms[state];
        // The next smaller form, or dropping (never for the top result).
        let droppable = index != 0 || entry.deferred;
        let smaller = (state + 1..entry.forms.len())
            .map(|s| (Some(s), entry.forms[s].estimate, entry.forms[s].factor()))
            .chain(droppable.then_some((None, 0, 0.0)))
            .find(|&(_, size, _)| size < current.estimate);
        if let Some((next, size, factor)) = smaller {
            let saved = (current.estimate - size) as f32;
            let lost = entry.value * (current.factor() - factor).max(0.0);
            let cost = lost / saved;
            if best.is_none_or(|(_, _, c)| cost < c) {
                best = Some((index, next, cost));
            }
        }
    }
    match best {
        Some((index, next, _)) => {
            entries[index].state = next;
            true
        }
        None => false,
    }
}

/// The context of the entries' forms, and where each item is in it.
fn assemble(entries: &[Entry<'_>], config: &PackConfig) -> (String, Vec<Range<usize>>) {
    let items: Vec<String> = entries
        .iter()
        .filter_map(|e| e.state.map(|s| &e.forms[s]))
        .map(|f| render(&f.header, &f.text))
        .collect();
    wrap_items(&items, config)
}

/// Tokens of the context's frame: between two items, and around them all.
#[derive(Debug, Clone, Copy)]
struct Frame {
    separator: usize,
    delimiters: usize,
}

/// The plan: an entry per candidate still in the running, and what the evidence stop and the
/// expanded form did.
struct Planned<'a> {
    entries: Vec<Entry<'a>>,
    stopped: usize,
    expanded_covers_others: bool,
}

/// One packing; with `offer_expanded`, the top result's first form is its expanded one. Also
/// whether the expanded form covered another candidate's text and was then given up.
pub(super) fn pack_once(request: PackRequest<'_>, offer_expanded: bool) -> (Packed, bool) {
    let mut packed = Packed::default();
    let config = request.config;
    let frame = Frame {
        separator: request.counter.count(&config.separator),
        delimiters: if config.untrusted_delimiters {
            request.counter.count(UNTRUSTED_OPEN) + request.counter.count(UNTRUSTED_CLOSE)
        } else {
            0
        },
    };
    let Some(Planned {
        mut entries,
        stopped,
        expanded_covers_others,
    }) = plan(&request, offer_expanded, &mut packed.decisions)
    else {
        return (packed, false);
    };
    let item_tokens = fit(&mut entries, &request, frame, &mut packed);
    report(&entries, &request, stopped, &item_tokens, &mut packed);
    let expanded_given_up = entries.first().is_some_and(|top| {
        top.position == 0 && top.forms[0].tier == Tier::Expanded && top.state != Some(0)
    });
    (packed, expanded_covers_others && expanded_given_up)
}

/// Plan: each candidate (picked, then deferred) past the evidence stop and not already covered gets
/// its forms and its value; `None` when there is no candidate.
fn plan<'a>(
    request: &PackRequest<'a>,
    offer_expanded: bool,
    decisions: &mut Vec<Decision>,
) -> Option<Planned<'a>> {
    let &PackRequest {
        picked,
        deferred,
        neighbours,
        counter,
        terms,
        cue,
        config,
        fill,
        whole,
        floor,
        tiers,
        ..
    } = request;
    let terms: Vec<memchr::memmem::Finder<'_>> = terms
        .iter()
        .map(|term| memchr::memmem::Finder::new(term.as_bytes()))
        .collect();
    let all: Vec<(&Candidate, bool)> = picked
        .iter()
        .map(|c| (c, false))
        .chain(deferred.iter().map(|c| (c, true)))
        .collect();
    if all.is_empty() {
        return None;
    }
    // Each vector's dot product with itself, for the cosines between items.
    let self_dots: Vec<Option<f32>> = all
        .iter()
        .map(|(c, _)| c.vector.as_deref().map(|v| dot(v, v)))
        .collect();
    let mut covered: BTreeMap<&crate::model::DocKey, Vec<(u32, u32)>> = BTreeMap::new();
    let mut entries: Vec<Entry<'_>> = Vec::with_capacity(all.len());
    let scale = score_scale(&all, floor);
    let stop = (!fill && config.evidence_ratio > 0.0).then_some(scale);
    let mut stopped = 0;
    // The document of the top result when its first form is expanded, and whether that form
    // covered a later candidate of it.
    let mut expanded_document = None;
    let mut expanded_covers_others = false;
    for (position, (candidate, is_deferred)) in all.iter().enumerate() {
        let band = match evidence(candidate, stop.filter(|_| position > 0), config) {
            Evidence::Whole => None,
            Evidence::Band(standing) => Some(standing),
            Evidence::Stopped(decision) => {
                stopped += 1;
                decisions.push(decision);
                continue;
            }
        };
        // Whole chunks only: the band's best sentence is not one.
        let band = band.filter(|_| !whole);
        let stored = &candidate.stored;
        expanded_covers_others |= expanded_document == Some(&stored.key);
        let doc_covered = covered.entry(&stored.key).or_default();
        let Some(available) = uncovered(&stored.chunk, doc_covered) else {
            decisions.push(Decision::new(
                candidate.id(),
                Action::Dropped,
                Cause::Overlap,
                "text already in the context (overlapping window)",
            ));
            continue;
        };
        let ceiling = tiers
            .get(position)
            .map_or(SurrogateTier::Full, |(tier, _)| *tier);
        let expanded_form =
            (offer_expanded && !whole && position == 0 && ceiling == SurrogateTier::Full)
                .then(|| expanded(stored, neighbours, counter, config))
                .flatten();
        let forms = if whole {
            vec![whole_chunk(&stored.chunk, available, counter, config)]
        } else {
            forms(
                candidate,
                available,
                (&terms, cue),
                config,
                counter,
                expanded_form,
                ceiling,
                if band.is_some() {
                    Room::Sentence
                } else {
                    Room::Whole
                },
            )
        };
        doc_covered.push(forms[0].range);
        if forms[0].tier == Tier::Expanded {
            expanded_document = Some(&stored.key);
        } else {
            doc_covered.push(stored.chunk.char_range);
        }
        let value = value(&all, &self_dots, position, scale, config);
        entries.push(Entry {
            candidate,
            state: (!is_deferred).then_some(0),
            forms,
            value,
            deferred: *is_deferred,
            position,
            band,
            capped: false,
        });
    }
    Some(Planned {
        entries,
        stopped,
        expanded_covers_others,
    })
}

/// The top candidate's score and its distance to the score `floor` (at least epsilon): what a
/// candidate's value and the evidence stop measure a score against.
fn score_scale(all: &[(&Candidate, bool)], floor: f32) -> (f32, f32) {
    let top = all.iter().map(|(c, _)| c.score).fold(f32::MIN, f32::max);
    (top, (top - floor.min(top)).max(f32::EPSILON))
}

/// Where a candidate stands against the evidence stop.
enum Evidence {
    /// Packed whole (the top result, or no stop).
    Whole,
    /// In the evidence band: packed as its best sentence; its standing.
    Band(f32),
    /// Below the stop: left out, and why.
    Stopped(Decision),
}

/// The evidence stop and band for a candidate after the top result, on the stop's scale
/// `(top, range)` (`None`: the top result, or no stop).
fn evidence(candidate: &Candidate, scale: Option<(f32, f32)>, config: &PackConfig) -> Evidence {
    let Some((top, range)) = scale else {
        return Evidence::Whole;
    };
    let standing = 1.0 - (top - candidate.score) / range;
    if standing < config.evidence_ratio {
        return Evidence::Stopped(Decision::new(
            candidate.id(),
            Action::Dropped,
            Cause::EvidenceStop,
            format!(
                "evidence stop: score at {standing:.2} of the top result's (scale bottom 0), below {}",
                config.evidence_ratio
            ),
        ));
    }
    if standing < config.sentence_ratio {
        Evidence::Band(standing)
    } else {
        Evidence::Whole
    }
}

/// Value: a candidate's relevance by its standing on the evidence stop's scale `(top, range)` (and
/// its rank where `position_decay` asks), discounted by its redundancy with the candidates before it
/// and, for a deferred one, by `deferred_value`.
fn value(
    all: &[(&Candidate, bool)],
    self_dots: &[Option<f32>],
    position: usize,
    scale: (f32, f32),
    config: &PackConfig,
) -> f32 {
    let (candidate, is_deferred) = all[position];
    // Relevance by the score, not by MMR's pick order (that trades relevance for diversity,
    // which the redundancy discount below accounts for): by its standing on the evidence stop's
    // scale (candidates that score alike are worth alike, whatever their ranks; one far below
    // the top is worth little even at rank 2), and by its rank where `position_decay` asks.
    let standing = 1.0 - (scale.0 - candidate.score) / scale.1;
    let mut relevance = (-config.standing_decay * (1.0 - standing)).exp();
    if config.position_decay > 0.0 {
        let rank = all
            .iter()
            .filter(|(other, _)| other.score > candidate.score)
            .count();
        relevance /= 1.0 + config.position_decay * rank as f32;
    }
    let redundancy = candidate.vector.as_ref().map_or(0.0, |v| {
        all[..position]
            .iter()
            .zip(self_dots)
            .filter_map(|((other, _), other_dot)| {
                Some(cosine_with_norms(
                    v,
                    other.vector.as_ref()?,
                    self_dots[position]?,
                    (*other_dot)?,
                ))
            })
            .fold(0.0f32, f32::max)
    });
    relevance
        * (1.0 - config.redundancy_weight * redundancy.max(0.0))
        * if is_deferred {
            config.deferred_value
        } else {
            1.0
        }
}

/// Fit: shrinks the plan on estimates, grows it back to the largest forms that fit, then counts the
/// real string and shrinks until it fits; the top result's surrogate is cut to the budget last.
/// Returns the tokens of each packed item's rendering, counted with the string.
fn fit(
    entries: &mut [Entry<'_>],
    request: &PackRequest<'_>,
    frame: Frame,
    packed: &mut Packed,
) -> Vec<usize> {
    let &PackRequest {
        budget,
        counter,
        config,
        ..
    } = request;
    let Frame {
        separator: separator_tokens,
        delimiters: delimiter_tokens,
    } = frame;
    let caps = caps(config);
    // Plan on estimates.
    while plan_tokens(entries, separator_tokens, delimiter_tokens) > budget && shrink(entries) {}
    cap_tiers(entries, caps);
    // Greedy shrinking can overshoot: grow items back (best value first, left-out and deferred ones
    // included) to the largest form that still fits, within the tier caps.
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| entries[b].value.total_cmp(&entries[a].value));
    for index in order {
        let current = entries[index].state;
        for form in 0..current.unwrap_or(entries[index].forms.len()) {
            entries[index].state = Some(form);
            if plan_tokens(entries, separator_tokens, delimiter_tokens) <= budget
                && caps_hold(entries, caps)
            {
                break;
            }
            entries[index].state = current;
        }
    }
    // Count the real string; shrink until it fits (a shrunk snippet may meet the surrogate cap).
    let count = |entries: &[Entry<'_>], packed: &mut Packed| {
        let (context, spans) = assemble(entries, config);
        let (tokens, items) = counter.count_spans(&context, &spans);
        (packed.context, packed.tokens_used) = (context, tokens);
        packed.counts += 1;
        items
    };
    let mut item_tokens;
    loop {
        item_tokens = count(entries, packed);
        if packed.tokens_used <= budget || !shrink(entries) {
            break;
        }
        cap_tiers(entries, caps);
    }
    if packed.tokens_used > budget {
        // Only the top result's surrogate is left and it is still too long: cut it to the budget.
        if let Some(entry) = entries.iter_mut().find(|e| e.state.is_some()) {
            let form = &mut entry.forms[entry.state.expect("found")];
            let header_tokens = counter.count(&form.header) + delimiter_tokens;
            let room = budget.saturating_sub(header_tokens + 1);
            if room == 0 {
                entry.state = None;
            } else {
                form.text = counter.truncate(&form.text, room).trim_end().to_string();
                if form.text.is_empty() {
                    entry.state = None;
                }
            }
        }
        item_tokens = count(entries, packed);
        if packed.tokens_used > budget {
            for entry in entries {
                entry.state = None;
            }
            packed.context.clear();
            packed.tokens_used = 0;
            item_tokens.clear();
        }
    }
    item_tokens
}

/// Why an entry packed in its form `state` is there as it is: the cause and its particulars.
fn packed_because(
    entry: &Entry<'_>,
    state: usize,
    request: &PackRequest<'_>,
    caps: &str,
) -> (Cause, String) {
    let form = &entry.forms[state];
    if entry.capped && state > 0 {
        (
            Cause::TierCap,
            format!("tier cap ({caps}): packed as {}", form.tier.as_str()),
        )
    } else if matches!(form.tier, Tier::Gist | Tier::Micro) {
        let why = request
            .tiers
            .get(entry.position)
            .map_or("", |(_, why)| why.as_str());
        (
            Cause::SurrogatePolicy,
            format!("surrogate tier {}: {why}", form.tier.as_str()),
        )
    } else if let (Some(standing), 0) = (entry.band, state) {
        (
            Cause::EvidenceBand,
            format!(
                "evidence band: score at {standing:.2} of the top result's (scale bottom 0), below {}: its best sentence only",
                request.config.sentence_ratio
            ),
        )
    } else if state > 0 {
        let first = entry.forms[0].tier.as_str();
        (
            Cause::Shortened,
            format!("shortened from {first} to fit the budget"),
        )
    } else if entry.deferred {
        (
            Cause::BudgetLeft,
            "budget left unused: deferred candidate added".to_string(),
        )
    } else {
        (Cause::Fits, "fits".to_string())
    }
}

/// Report: the plan's items in context order, a decision for every candidate, and the note.
fn report(
    entries: &[Entry<'_>],
    request: &PackRequest<'_>,
    stopped: usize,
    item_tokens: &[usize],
    packed: &mut Packed,
) {
    let &PackRequest { budget, config, .. } = request;
    let mut banded = 0;
    let capped = entries
        .iter()
        .filter(|e| e.capped && (e.state.is_some() || !e.deferred))
        .count();
    // Named only where a cap changed something (no allocation per query otherwise).
    let caps = if capped > 0 {
        format!(
            "max_snippets {}, max_surrogates {}",
            config.max_snippets, config.max_surrogates
        )
    } else {
        String::new()
    };
    // Items and decisions.
    let (mut shortened, mut left_out) = (0, 0);
    let mut item_tokens = item_tokens.iter().copied();
    for entry in entries {
        let id = entry.candidate.id();
        match entry.state {
            Some(state) => {
                let form = &entry.forms[state];
                if state > 0 {
                    shortened += 1;
                }
                let (cause, reason) = packed_because(entry, state, request, &caps);
                banded += usize::from(cause == Cause::EvidenceBand);
                packed
                    .decisions
                    .push(Decision::new(id, form.tier.into(), cause, reason));
                let stored = &entry.candidate.stored;
                packed.items.push(ContextItem {
                    chunk_id: entry.candidate.id(),
                    doc_id: stored.key.doc_id.clone(),
                    source: stored.chunk.source.clone(),
                    lines: form.lines,
                    page: stored.chunk.page,
                    section_path: stored.chunk.section_path.clone(),
                    tier: form.tier,
                    score: entry.candidate.score,
                    tokens: item_tokens.next().unwrap_or_default(),
                    full_tokens: stored.chunk.tokens as usize,
                    lanes: entry.candidate.lanes(),
                    text: form.text.clone(),
                    metadata: stored.chunk.metadata.to_object(),
                });
            }
            None if !entry.deferred && entry.capped => {
                left_out += 1;
                packed.decisions.push(Decision::new(
                    id,
                    Action::Dropped,
                    Cause::TierCap,
                    format!("tier cap ({caps}): no form with room"),
                ));
            }
            None if !entry.deferred => {
                left_out += 1;
                packed.decisions.push(Decision::new(
                    id,
                    Action::Dropped,
                    Cause::OverBudget,
                    "lowest marginal value (score, redundancy) when over budget",
                ));
            }
            None => {}
        }
    }
    packed.truncated = shortened + left_out > 0;
    let mut notes = Vec::new();
    if packed.truncated {
        notes.push(format!(
            "budget {budget}: {shortened} item(s) shortened, {left_out} left out (lowest marginal value first)"
        ));
    }
    if capped > 0 {
        notes.push(format!(
            "tier caps ({caps}): {capped} item(s) shortened or left out"
        ));
    }
    if banded > 0 {
        notes.push(format!(
            "evidence band: {banded} candidate(s) scored below {} of the top result's score packed as their best sentence (fill: true packs them whole)",
            config.sentence_ratio
        ));
    }
    if stopped > 0 {
        notes.push(format!(
            "evidence stop: {stopped} candidate(s) scored below {} of the top result's score (scale bottom 0) left out; {} of {budget} tokens used (fill: true packs to the budget)",
            config.evidence_ratio, packed.tokens_used
        ));
    }
    if !notes.is_empty() {
        packed.note = Some(notes.join("; "));
    }
}
