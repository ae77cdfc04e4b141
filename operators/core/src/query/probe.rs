//! Probe: what a query's retrieval saw, kept beside its context so a standing query can tell which
//! index changes could move that context without running it again.
//!
//! Everything after retrieval (fusion by rank, rerank over the candidates' own text, dedup, MMR,
//! packing) is a function of the two lanes' members, their order and their documents. So a change
//! can move the context only if it
//! - touches a document with a member in either lane (edits, deletes, neighbours, file counts);
//! - adds a chunk that would enter a lane: its cosine with the query vector reaches the dense lane's
//!   lowest member's, or its BM25 score the BM25 lane's lowest member's (a lane cut nowhere admits
//!   every chunk);
//! - moves the IDF of the query's terms (corpus statistics) enough to reorder the BM25 lane: a
//!   member's BM25 score moves by at most [`Probe::drift`] (the moves of the weights of the terms
//!   some chunk held when the probe was taken, times the largest weight a term can have in a
//!   chunk), so two members further apart than twice that keep their order, and a new chunk (scored
//!   with the weights of now) enters the lane only if it scores within that of the lowest member.
//!   Where the members' own term weights are known ([`Probe::weigh_members`]), the lowest member's
//!   score now is computed instead ([`Probe::bm25_floor_now`]): no chunk below every member's
//!   score of now can enter, whatever the statistics did.

use super::super::store::{Bm25Encoder, SparseVector};

/// Slack on the dense admission test: the engine's cosines are the float vectors' (int8 candidates
/// are re-scored with the originals), computed in another order than here.
pub const DENSE_SLACK: f32 = 1e-4;

/// Relative slack on the BM25 admission test against members' recomputed scores: the engine and
/// this sum add the same products in another order.
pub const BM25_SLACK: f32 = 1e-4;

/// What one evaluation's retrieval saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Probe {
    /// The dense query vector searched (empty: no dense lane).
    pub dense: Vec<f32>,
    /// The cosine of the dense lane's lowest member, where the lane was cut (`None`: any chunk
    /// would enter).
    pub dense_floor: Option<f32>,
    /// The BM25 query vector searched, each term weighed by its IDF at the time (empty: no BM25
    /// lane).
    pub bm25: SparseVector,
    /// The same terms unweighed (what the IDF multiplied).
    pub bm25_raw: Vec<f32>,
    /// Per term, whether a chunk of the tenant held it (a term no chunk held weighs on no member).
    pub bm25_seen: Vec<bool>,
    /// The BM25 lane's lowest member's score, where the lane was cut.
    pub bm25_floor: Option<f32>,
    /// The BM25 lane's best score (0: an empty lane).
    pub bm25_top: f32,
    /// The documents with a member in either lane, sorted and unique.
    pub docs: Vec<String>,
    /// The BM25 lane's members where the lane was cut (empty otherwise).
    pub bm25_members: Vec<Member>,
}

/// A member of a cut BM25 lane.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Member {
    /// Its point id.
    pub id: uuid::Uuid,
    /// Its BM25 score as the engine gave it.
    pub score: f32,
    /// The text BM25 weighed at ingest ([`crate::model::Chunk::embedding_input`]), until
    /// [`Probe::weigh_members`] turns it into `weights`.
    pub text: Option<String>,
    /// Its weight of each query term (in the order of `bm25.indices`; 0 where it lacks the term).
    pub weights: Vec<f32>,
}

impl Probe {
    /// Whether a chunk at cosine `score` with the query vector could enter the dense lane.
    pub fn admits_dense(&self, score: Option<f32>) -> bool {
        if self.dense.is_empty() {
            return false;
        }
        match (self.dense_floor, score) {
            (None, _) | (_, None) => true,
            (Some(floor), Some(score)) => score >= floor - DENSE_SLACK,
        }
    }

    /// Whether a chunk scoring `score` with the BM25 weights of now could enter the BM25 lane, a
    /// member's score having moved by up to `drift` since the probe: it shares a term, and the lane
    /// was cut nowhere or the chunk reaches its lowest member's score less the drift.
    pub fn admits_bm25(&self, score: f32, drift: f32) -> bool {
        if score <= 0.0 {
            return false;
        }
        self.bm25_floor
            .is_none_or(|floor| score >= floor - drift.max(0.0))
    }

    /// Turns each BM25 member's text into its weights of the query's terms with `encoder` (the
    /// ingest's), taking those of a member of `previous` with the same id as they are (a point's
    /// text never changes under its id), and drops the texts. Where a member's weights do not give
    /// back the engine's score (another encoder wrote it), no member is kept: the drift bound
    /// decides for this probe.
    pub fn weigh_members(&mut self, encoder: &Bm25Encoder, previous: Option<&Probe>) {
        let known: std::collections::HashMap<uuid::Uuid, &Vec<f32>> = previous
            .filter(|previous| previous.bm25.indices == self.bm25.indices)
            .map(|previous| {
                previous
                    .bm25_members
                    .iter()
                    .filter(|member| member.text.is_none())
                    .map(|member| (member.id, &member.weights))
                    .collect()
            })
            .unwrap_or_default();
        for member in &mut self.bm25_members {
            let Some(text) = member.text.take() else {
                continue;
            };
            member.weights = match known.get(&member.id) {
                Some(weights) => (*weights).clone(),
                None => {
                    let document = encoder.encode_document(&text);
                    self.bm25
                        .indices
                        .iter()
                        .map(|term| {
                            document
                                .indices
                                .binary_search(term)
                                .ok()
                                .and_then(|at| document.values.get(at).copied())
                                .unwrap_or(0.0)
                        })
                        .collect()
                }
            };
        }
        let then = &self.bm25.values;
        let faithful = self.bm25_members.iter().all(|member| {
            let score: f32 = member.weights.iter().zip(then).map(|(w, q)| w * q).sum();
            member.weights.len() == then.len()
                && (score - member.score).abs() <= BM25_SLACK * member.score.abs().max(1.0)
        });
        if !faithful {
            self.bm25_members.clear();
        }
    }

    /// The lowest BM25 member's score under the query weights `now` (in the order of
    /// `bm25.indices`), where the lane was cut and every member is weighed: at least `k` chunks
    /// score that much now, so no chunk scoring less enters a lane of `k`. `None` where the lane
    /// was cut nowhere or the members are not weighed.
    pub fn bm25_floor_now(&self, now: &[f32]) -> Option<f32> {
        self.bm25_floor?;
        if self.bm25_members.is_empty() || now.len() != self.bm25.indices.len() {
            return None;
        }
        self.bm25_members
            .iter()
            .map(|member| {
                (member.text.is_none() && member.weights.len() == now.len()).then(|| {
                    member
                        .weights
                        .iter()
                        .zip(now)
                        .map(|(weight, query)| weight * query)
                        .sum::<f32>()
                })
            })
            .try_fold(f32::INFINITY, |low, score| score.map(|s| low.min(s)))
    }

    /// Whether a chunk scoring `score` with the query weights `now` could enter the BM25 lane: the
    /// members' own scores of now where they are weighed ([`Probe::bm25_floor_now`], less a
    /// rounding slack), else [`Probe::admits_bm25`] with the drift bound.
    pub fn admits_bm25_now(&self, score: f32, now: &[f32], drift: f32) -> bool {
        match self.bm25_floor_now(now) {
            Some(floor) if score > 0.0 => score >= floor - BM25_SLACK * floor.abs().max(1.0),
            Some(_) => false,
            None => self.admits_bm25(score, drift),
        }
    }

    /// Whether `doc_id` has a member in a lane.
    pub fn cites(&self, doc_id: &str) -> bool {
        self.docs
            .binary_search_by(|doc| doc.as_str().cmp(doc_id))
            .is_ok()
    }

    /// How far a member's BM25 score may have moved since the probe was taken, given each query
    /// term's weight now (in the order of `bm25.indices`) and the largest weight a term can have in a
    /// chunk (`weight_max`): `weight_max · Σ |now − then|` over the terms some chunk held then (the
    /// members hold no other). Infinite where the terms do not match.
    pub fn drift(&self, now: &[f32], weight_max: f32) -> f32 {
        if now.len() != self.bm25.values.len() || self.bm25_seen.len() != now.len() {
            return f32::INFINITY;
        }
        let moved: f32 = self
            .bm25
            .values
            .iter()
            .zip(now)
            .zip(&self.bm25_seen)
            .filter(|(_, seen)| **seen)
            .map(|((then, now), _)| (now - then).abs())
            .sum();
        if !moved.is_finite() {
            return f32::INFINITY;
        }
        weight_max * moved
    }
}

/// The cosine of two vectors (`None` where either is empty, of another length or zero).
pub fn cosine(a: &[f32], b: &[f32]) -> Option<f32> {
    if a.is_empty() || a.len() != b.len() {
        return None;
    }
    let (mut dot, mut aa, mut bb) = (0.0f32, 0.0f32, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        aa += x * x;
        bb += y * y;
    }
    let norm = (aa * bb).sqrt();
    (norm > 0.0 && norm.is_finite()).then(|| dot / norm)
}

/// The dot product of two sparse vectors (indices ascending).
pub fn sparse_dot(a: &SparseVector, b: &SparseVector) -> f32 {
    let (mut i, mut j, mut sum) = (0, 0, 0.0);
    while i < a.indices.len() && j < b.indices.len() {
        match a.indices[i].cmp(&b.indices[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                sum += a.values.get(i).copied().unwrap_or(0.0)
                    * b.values.get(j).copied().unwrap_or(0.0);
                i += 1;
                j += 1;
            }
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sparse(terms: &[(u32, f32)]) -> SparseVector {
        SparseVector {
            indices: terms.iter().map(|t| t.0).collect(),
            values: terms.iter().map(|t| t.1).collect(),
        }
    }

    /// Whether a new chunk could enter either lane: the two tests as the standing queries' filter
    /// applies them (with the query's BM25 weights of now and the drift since the probe).
    fn admits(
        probe: &Probe,
        dense: &[f32],
        sparse: &SparseVector,
        now: &[f32],
        drift: f32,
    ) -> bool {
        let now = SparseVector {
            indices: probe.bm25.indices.clone(),
            values: now.to_vec(),
        };
        probe.admits_dense(cosine(&probe.dense, dense))
            || probe.admits_bm25(sparse_dot(&now, sparse), drift)
    }

    fn probe() -> Probe {
        Probe {
            dense: vec![1.0, 0.0],
            dense_floor: Some(0.5),
            bm25: sparse(&[(1, 2.0), (5, 1.0)]),
            bm25_raw: vec![1.0, 1.0],
            bm25_seen: vec![true, true],
            bm25_floor: Some(3.0),
            bm25_top: 6.0,
            docs: vec!["a".into(), "c".into()],
            bm25_members: Vec::new(),
        }
    }

    /// A chunk enters a lane only at or above the lane's lowest member (with the slack), and a lane
    /// cut nowhere takes any chunk; a chunk sharing no term never enters the BM25 lane.
    #[test]
    fn admission_follows_each_lane_floor() {
        let probe = probe();
        let none = SparseVector::default();
        let then = [2.0, 1.0];
        assert!(admits(&probe, &[0.6, 0.8], &none, &then, 0.0));
        assert!(!admits(&probe, &[0.3, 0.954], &none, &then, 0.0));
        assert!(!admits(
            &probe,
            &[0.0, 1.0],
            &sparse(&[(2, 9.0)]),
            &then,
            0.0
        ));
        assert!(admits(
            &probe,
            &[0.0, 1.0],
            &sparse(&[(1, 1.0), (5, 1.0)]),
            &then,
            0.0
        ));
        let low = sparse(&[(1, 1.0), (5, 0.5)]);
        assert!(!admits(&probe, &[0.0, 1.0], &low, &then, 0.0));
        // 2.5 against 3.0: within reach where a member may have moved by 0.5.
        assert!(admits(&probe, &[0.0, 1.0], &low, &then, 0.5));
        assert!(!admits(&probe, &[0.0, 1.0], &low, &then, 0.4));
        // Scored with the weights of now: term 5 weighs 2 now, 2 + 1 reaches 3.
        assert!(admits(&probe, &[0.0, 1.0], &low, &[2.0, 2.0], 0.0));
        let open = Probe {
            dense_floor: None,
            bm25_floor: None,
            ..probe.clone()
        };
        assert!(admits(&open, &[0.0, 1.0], &none, &then, 0.0));
        // An uncut BM25 lane takes any chunk sharing a term, none sharing none.
        assert!(open.admits_bm25(sparse_dot(&open.bm25, &sparse(&[(5, 0.01)])), 0.0));
        assert!(!open.admits_bm25(sparse_dot(&open.bm25, &sparse(&[(6, 1.0)])), 0.0));
        assert!(probe.cites("c") && !probe.cites("b"));
    }

    /// The drift bounds any chunk's score move: weight changes summed, times the largest term
    /// weight; a chunk's actual move stays within it.
    #[test]
    fn drift_bounds_every_score_move() {
        let probe = probe();
        assert_eq!(probe.drift(&[2.0, 1.0], 2.2), 0.0);
        let drift = probe.drift(&[2.5, 0.8], 2.2);
        assert!((drift - 2.2 * 0.7).abs() < 1e-5, "{drift}");
        // A chunk holding both terms at the largest weight moves by 2.2 · (0.5 − 0.2) only.
        let chunk = sparse(&[(1, 2.2), (5, 2.2)]);
        let then = sparse_dot(&probe.bm25, &chunk);
        let now = sparse_dot(&sparse(&[(1, 2.5), (5, 0.8)]), &chunk);
        assert!((now - then).abs() <= drift);
        assert_eq!(probe.drift(&[2.0], 2.2), f32::INFINITY);
        assert_eq!(Probe::default().drift(&[], 2.2), 0.0);
        // A term no chunk held then weighs on no member: its move does not count.
        let unseen = Probe {
            bm25_seen: vec![true, false],
            ..probe
        };
        assert!((unseen.drift(&[2.5, 7.0], 2.2) - 2.2 * 0.5).abs() < 1e-5);
    }

    /// Members weighed from their texts score now as the engine would (the query weights of now
    /// times their own weights), the lowest of them is the floor of now, and a member known from
    /// the previous probe is not weighed again.
    #[test]
    fn members_weighed_give_the_floor_of_now() {
        let encoder = Bm25Encoder::default();
        let query = encoder.encode_query("rollback release");
        let texts = [
            "rollback the release at once: rollback first",
            "a release note",
        ];
        let mut probe = Probe {
            bm25: SparseVector {
                indices: query.indices.clone(),
                values: vec![2.0; query.indices.len()],
            },
            bm25_raw: query.values.clone(),
            bm25_seen: vec![true; query.indices.len()],
            bm25_floor: Some(1.0),
            bm25_members: texts
                .iter()
                .enumerate()
                .map(|(at, text)| Member {
                    id: uuid::Uuid::from_u128(at as u128),
                    score: sparse_dot(
                        &SparseVector {
                            indices: query.indices.clone(),
                            values: vec![2.0; query.indices.len()],
                        },
                        &encoder.encode_document(text),
                    ),
                    text: Some(text.to_string()),
                    weights: Vec::new(),
                })
                .collect(),
            ..Probe::default()
        };
        // Not weighed yet: no floor of now, the drift bound decides.
        assert_eq!(probe.bm25_floor_now(&[2.0, 2.0]), None);
        assert!(probe.admits_bm25_now(0.6, &[2.0, 2.0], 0.5));
        assert!(!probe.admits_bm25_now(0.4, &[2.0, 2.0], 0.5));
        probe.weigh_members(&encoder, None);
        assert!(probe.bm25_members.iter().all(|m| m.text.is_none()));
        let engine: Vec<f32> = texts
            .iter()
            .map(|text| sparse_dot(&probe.bm25, &encoder.encode_document(text)))
            .collect();
        let floor = probe.bm25_floor_now(&[2.0, 2.0]).expect("weighed");
        assert!((floor - engine[1]).abs() < 1e-5, "{floor} {engine:?}");
        assert!(engine[0] > engine[1]);
        // The weights of now: the floor follows them, and admission with it.
        let now = [3.0, 0.5];
        let scored: Vec<f32> = texts
            .iter()
            .map(|text| {
                let weights = SparseVector {
                    indices: query.indices.clone(),
                    values: now.to_vec(),
                };
                sparse_dot(&weights, &encoder.encode_document(text))
            })
            .collect();
        let low = scored.iter().copied().fold(f32::INFINITY, f32::min);
        let floor = probe.bm25_floor_now(&now).expect("weighed");
        assert!((floor - low).abs() < 1e-5, "{floor} {scored:?}");
        assert!(probe.admits_bm25_now(low, &now, 0.0));
        assert!(!probe.admits_bm25_now(low * 0.99, &now, 100.0));
        assert!(!probe.admits_bm25_now(0.0, &now, 100.0));
        // Uncut: every chunk sharing a term.
        let open = Probe {
            bm25_floor: None,
            ..probe.clone()
        };
        assert!(open.admits_bm25_now(0.01, &now, 0.0));
        // Known members keep their weights (a changed text under a known id is not read again);
        // a new one is weighed.
        let member = |id: u128, text: &str, score: f32| Member {
            id: uuid::Uuid::from_u128(id),
            score,
            text: Some(text.into()),
            weights: Vec::new(),
        };
        let release = sparse_dot(&probe.bm25, &encoder.encode_document("release"));
        let mut next = Probe {
            bm25_members: vec![
                member(0, "unrelated", engine[0]),
                member(7, "release", release),
            ],
            ..probe.clone()
        };
        next.weigh_members(&encoder, Some(&probe));
        assert_eq!(next.bm25_members[0].weights, probe.bm25_members[0].weights);
        assert!(next.bm25_members[1].weights.iter().any(|w| *w > 0.0));
        // A member whose weights do not give the engine's score back: no floor of now.
        let mut other = Probe {
            bm25_members: vec![member(7, "release", release * 1.5)],
            ..probe.clone()
        };
        other.weigh_members(&encoder, None);
        assert!(other.bm25_members.is_empty());
        assert_eq!(other.bm25_floor_now(&now), None);
    }

    #[test]
    fn cosine_and_sparse_dot() {
        assert_eq!(cosine(&[1.0, 0.0], &[2.0, 0.0]), Some(1.0));
        assert_eq!(cosine(&[1.0], &[1.0, 0.0]), None);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), None);
        let dot = sparse_dot(
            &sparse(&[(1, 2.0), (3, 1.0)]),
            &sparse(&[(0, 5.0), (3, 4.0)]),
        );
        assert_eq!(dot, 4.0);
    }
}
