//! The evaluator's round: expiries, the tenants' changes turned into the subscriptions they may move,
//! evaluations finished and started, and the settling of a tenant once it is quiet.

use super::*;

impl Standing {
    /// One round of the evaluator: expiries, the change feed, evaluations finished and started.
    pub(super) fn tick(&self, now: Instant) {
        let mut state = lock(&self.state);
        let expired: Vec<String> = state
            .subscriptions
            .iter()
            .filter(|(_, subscription)| subscription.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.remove(&mut state, &id);
        }
        self.take_changes(&mut state);
        self.settle(&mut state);
        // The change feed keeps documents' chunks only while there are subscriptions to filter.
        self.changes
            .set_detailed(!state.subscriptions.is_empty() || state.subscribing > 0);
        let active: Vec<String> = state.active.iter().cloned().collect();
        let mut due: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut in_flight = 0;
        for id in active {
            let Some(subscription) = state.subscriptions.get_mut(&id) else {
                state.active.remove(&id);
                continue;
            };
            if finish(
                &id,
                subscription,
                (&self.ingress, self.config.versions_kept, self.encoder()),
                now,
            ) {
                self.keep(&id, subscription);
                if let (true, Some(latest)) = (subscription.publish, subscription.versions.back()) {
                    self.publish(latest);
                }
            }
            if subscription.evaluation.is_some() {
                in_flight += 1;
            } else if subscription.wanted.is_none() {
                state.active.remove(&id);
            } else if now.duration_since(subscription.last_started) >= subscription.min_interval {
                due.entry(subscription.tenant.clone()).or_default().push(id);
            }
        }
        // Round robin over the tenants with subscriptions due, from a turn that moves each round.
        let mut room = self.config.evaluations_in_flight.saturating_sub(in_flight);
        if let Some(rate) = self.config.evaluations_per_sec() {
            room = room.min(state.pace.room(now, rate));
        }
        let tenants: Vec<String> = due.keys().cloned().collect();
        if tenants.is_empty() || room == 0 {
            return;
        }
        let start = (state.turn as usize) % tenants.len();
        state.turn = state.turn.wrapping_add(1);
        let mut queues: Vec<VecDeque<String>> = (0..tenants.len())
            .map(|i| {
                due.remove(&tenants[(start + i) % tenants.len()])
                    .unwrap_or_default()
                    .into()
            })
            .collect();
        while room > 0 && queues.iter().any(|queue| !queue.is_empty()) {
            for queue in &mut queues {
                let Some(id) = queue.pop_front() else {
                    continue;
                };
                if room == 0 {
                    break;
                }
                room -= 1;
                let Some(subscription) = state.subscriptions.get_mut(&id) else {
                    continue;
                };
                subscription.evaluations += 1;
                let serial = subscription.evaluations;
                let (ticket, receiver) = self.submit(&id, serial + 1, &subscription.query);
                subscription.evaluation = Some(Evaluation {
                    receiver,
                    ticket,
                    change: subscription.wanted,
                    started: now,
                });
                subscription.last_started = now;
                if self.config.evaluations_per_core_sec > 0.0 {
                    state.pace.spend();
                }
                metrics().standing_evaluations.inc();
            }
        }
    }

    /// Takes in the changes since the last look: each changed tenant's subscriptions that the
    /// change may move want it ([`Standing::moved`]); the others are counted as filtered.
    pub(super) fn take_changes(&self, state: &mut State) {
        if self.changes.serial() == state.seen_serial {
            return;
        }
        let since = self.changes.take_since(state.seen_serial);
        state.seen_serial = since.serial;
        let filter = since.complete && self.stats.is_some();
        let mut docs: HashMap<&str, Vec<&DocChange>> = HashMap::new();
        for doc in &since.docs {
            docs.entry(doc.key.tenant.as_str()).or_default().push(doc);
        }
        for (tenant, change) in &since.tenants {
            let ids: Vec<String> = if self.stats.is_none() {
                state.subscriptions.keys().cloned().collect()
            } else {
                state
                    .by_tenant
                    .get(tenant)
                    .map(|ids| ids.iter().cloned().collect())
                    .unwrap_or_default()
            };
            if ids.is_empty() {
                continue;
            }
            let moved = match filter {
                true => self.moved(state, tenant, &ids, docs.get(tenant.as_str())),
                false => {
                    metrics().count_moved(Moved::Unfiltered, ids.len());
                    ids.iter().cloned().collect()
                }
            };
            if filter {
                let gap = state
                    .last_change_ms
                    .insert(tenant.clone(), change.recorded_ms)
                    .map_or(0, |last| change.recorded_ms.saturating_sub(last));
                state.settle.insert(
                    tenant.clone(),
                    Settling {
                        change: *change,
                        quiet_ms: quiet_ms(gap),
                        applied: u64::MAX,
                        checked_ms: 0,
                    },
                );
            }
            for id in ids {
                let Some(subscription) = state.subscriptions.get_mut(&id) else {
                    continue;
                };
                if moved.contains(&id) {
                    subscription.wanted = Some(newer(subscription.wanted, *change));
                    state.active.insert(id);
                } else {
                    metrics().standing_filtered.inc();
                    if subscription.evaluation.is_some() {
                        subscription.judged = Some(newer(subscription.judged, *change));
                    }
                }
            }
        }
    }

    /// Which of `ids` (subscriptions of `tenant`) the changed documents `docs` may move: those
    /// without a probe, those citing a changed document, those a new chunk may enter a lane of, and
    /// those whose BM25 scores drifted past `standing.drift` of their best.
    pub(super) fn moved(
        &self,
        state: &State,
        tenant: &str,
        ids: &[String],
        docs: Option<&Vec<&DocChange>>,
    ) -> BTreeSet<String> {
        let docs: &[&DocChange] = docs.map_or(&[], |docs| docs.as_slice());
        // A subscription already owed an evaluation, none under way, is evaluated after this change
        // was written anyway: it is not judged again.
        let owed = |subscription: &Subscription| {
            subscription.wanted.is_some() && subscription.evaluation.is_none()
        };
        let probes: Vec<(&String, &Probe)> = ids
            .iter()
            .filter_map(|id| {
                let subscription = state.subscriptions.get(id)?;
                if owed(subscription) {
                    return None;
                }
                Some((id, subscription.probe.as_deref()?))
            })
            .collect();
        let mut moved: BTreeSet<String> = ids
            .iter()
            .filter(|id| {
                state
                    .subscriptions
                    .get(*id)
                    .is_some_and(|s| s.probe.is_none() || owed(s))
            })
            .cloned()
            .collect();
        let unfiltered = moved
            .iter()
            .filter(|id| state.subscriptions.get(*id).is_some_and(|s| !owed(s)))
            .count();
        moves::count(Moved::Unfiltered, unfiltered);
        // Each query's BM25 weights now, and how far they moved its members' scores.
        let weights: Vec<(Vec<f32>, f32)> = probes
            .iter()
            .map(|(_, probe)| self.weights_now(tenant, probe))
            .collect();
        for ((id, probe), (_, drift)) in probes.iter().zip(&weights) {
            if docs.iter().any(|doc| probe.cites(&doc.key.doc_id)) {
                moves::count(Moved::Cites, 1);
                moved.insert((*id).clone());
            } else if *drift > self.config.drift * probe.bm25_top {
                moves::count(Moved::Drift, 1);
                moved.insert((*id).clone());
            }
        }
        let chunks: Vec<&Chunk> = docs.iter().flat_map(|doc| &doc.chunks).collect();
        if !chunks.is_empty() {
            moves::by_dense(&probes, &chunks, &mut moved);
            moves::by_bm25(&probes, &weights, &chunks, &mut moved);
        }
        moved
    }

    /// The ingest's BM25 encoder, where the job weighs terms itself.
    pub(super) fn encoder(&self) -> Option<&Bm25Encoder> {
        self.stats.as_ref().map(|(_, encoder)| encoder)
    }

    /// The probe's BM25 query weights under `tenant`'s statistics now, and how far they moved a
    /// member's score since the probe ([`Probe::drift`]; infinite where the job does not weigh
    /// terms itself).
    pub(super) fn weights_now(&self, tenant: &str, probe: &Probe) -> (Vec<f32>, f32) {
        let Some((stats, encoder)) = &self.stats else {
            return (probe.bm25.values.clone(), f32::INFINITY);
        };
        if probe.bm25.indices.is_empty() {
            return (Vec::new(), 0.0);
        }
        let now = stats.weigh(
            tenant,
            &ragstream_operators::store::SparseVector {
                indices: probe.bm25.indices.clone(),
                values: probe.bm25_raw.clone(),
            },
        );
        let drift = probe.drift(&now.values, encoder.params().weight_max());
        (now.values, drift)
    }

    /// Tenants quiet for their settling time with no evaluation of theirs owed or under way: each
    /// subscription whose BM25 scores drifted past `standing.rest_drift` of its best since its
    /// probe wants the tenant's latest change. The statistics are applied a step after the writes:
    /// a tenant is done only when a check finds them as the check before it did.
    pub(super) fn settle(&self, state: &mut State) {
        if state.settle.is_empty() {
            return;
        }
        let now_ms = ragstream_operators::now_millis();
        let quiet: Vec<(String, Settling)> = state
            .settle
            .iter()
            .filter(|(tenant, settling)| {
                let since = settling.change.recorded_ms.max(settling.checked_ms);
                now_ms.saturating_sub(since) >= settling.quiet_ms
                    && state.by_tenant.get(*tenant).is_none_or(|ids| {
                        ids.iter().all(|id| {
                            state.subscriptions.get(id).is_none_or(|subscription| {
                                subscription.wanted.is_none() && subscription.evaluation.is_none()
                            })
                        })
                    })
            })
            .map(|(tenant, settling)| (tenant.clone(), *settling))
            .collect();
        for (tenant, settling) in quiet {
            let applied = self
                .stats
                .as_ref()
                .map_or(0, |(stats, _)| stats.applied(&tenant));
            if applied == settling.applied {
                state.settle.remove(&tenant);
                continue;
            }
            state.settle.insert(
                tenant.clone(),
                Settling {
                    applied,
                    checked_ms: now_ms,
                    ..settling
                },
            );
            let ids: Vec<String> = state
                .by_tenant
                .get(&tenant)
                .map(|ids| ids.iter().cloned().collect())
                .unwrap_or_default();
            for id in ids {
                let Some(subscription) = state.subscriptions.get_mut(&id) else {
                    continue;
                };
                let drifted = subscription.probe.as_deref().is_none_or(|probe| {
                    self.weights_now(&tenant, probe).1 > self.config.rest_drift * probe.bm25_top
                });
                if drifted {
                    metrics().count_moved(Moved::Rest, 1);
                    subscription.wanted = Some(newer(subscription.wanted, settling.change));
                    state.active.insert(id);
                }
            }
        }
    }
}

/// How long a tenant whose last two changes came `gap_ms` apart must stay without changes to be at
/// rest: [`SETTLE`] for one written now and then, twice the gap (at most [`SETTLE_MAX`]) for one
/// written in a stream (gaps under half of that).
pub(super) fn quiet_ms(gap_ms: u64) -> u64 {
    let (settle, most) = (SETTLE.as_millis() as u64, SETTLE_MAX.as_millis() as u64);
    match gap_ms < most / 2 {
        true => gap_ms.saturating_mul(2).clamp(settle, most),
        false => settle,
    }
}

/// The later of two changes (by serial), with the later event time of both.
pub(super) fn newer(held: Option<TenantChange>, change: TenantChange) -> TenantChange {
    match held {
        Some(held) if held.serial >= change.serial => TenantChange {
            time: held.time.max(change.time),
            ..held
        },
        Some(held) => TenantChange {
            time: held.time.max(change.time),
            ..change
        },
        None => change,
    }
}

/// Whether a context at `watermark` reflects `change`: every event up to its time is indexed.
pub(super) fn reflects(watermark: &Watermark, change: &TenantChange) -> bool {
    watermark.frontier_ms > change.time
}

/// Takes the subscription's evaluation if it finished: a context that moved becomes a version (at
/// most `kept` are kept; true); a change it reflects is no longer wanted.
pub(super) fn finish(
    id: &str,
    subscription: &mut Subscription,
    (ingress, kept, encoder): (&HttpIngress, usize, Option<&Bm25Encoder>),
    now: Instant,
) -> bool {
    let Some(evaluation) = &subscription.evaluation else {
        return false;
    };
    let context = match evaluation.receiver.try_recv() {
        Ok(context) => context,
        Err(mpsc::TryRecvError::Empty) => {
            if now.duration_since(evaluation.started) > EVALUATION_TIMEOUT {
                ingress.abandon(evaluation.ticket);
                subscription.evaluation = None;
            }
            return false;
        }
        Err(mpsc::TryRecvError::Disconnected) => {
            subscription.evaluation = None;
            return false;
        }
    };
    let change = evaluation.change;
    subscription.evaluation = None;
    let mut context = context;
    if context.error.is_some() {
        // An index outage or a refusal: nothing published, tried again after `min_interval_ms`
        // (with any change judged meanwhile).
        if let Some(judged) = subscription.judged.take() {
            subscription.wanted = Some(newer(subscription.wanted, judged));
        }
        return false;
    }
    // A change judged while this evaluation ran was judged against the probe before it, and the
    // evaluation may or may not have seen it (its watermark is taken after the search): wanted.
    if let Some(judged) = subscription.judged.take() {
        subscription.wanted = Some(newer(subscription.wanted, judged));
    }
    let Some(latest) = subscription.versions.back() else {
        return false;
    };
    // A later change may have arrived meanwhile: only what this evaluation reflects is settled.
    if let (Some(wanted), Some(change)) = (subscription.wanted, change) {
        if wanted.serial <= change.serial && reflects(&context.index_watermark, &wanted) {
            subscription.wanted = None;
        }
    }
    if context.index_watermark.frontier_ms < latest.index_watermark.frontier_ms {
        return false;
    }
    // What this answer's retrieval saw: the next change is judged against it.
    subscription.probe = weighed(context.probe.take(), encoder, subscription.probe.as_deref());
    if same(&latest.context, &context) {
        metrics().standing_unchanged.inc();
        return false;
    }
    let published_ms = ragstream_operators::now_millis();
    if let Some(change) = change {
        metrics()
            .standing_change_to_version_seconds
            .observe(published_ms.saturating_sub(change.recorded_ms) as f64 / 1000.0);
    }
    let version = Arc::new(Version {
        subscription_id: id.to_string(),
        version: latest.version + 1,
        index_watermark: context.index_watermark.clone(),
        published_ms,
        diff: diff(Some(&latest.context), &context),
        context,
    });
    let number = version.version;
    subscription.versions.push_back(version);
    while subscription.versions.len() > kept.max(1) {
        subscription.versions.pop_front();
    }
    subscription.notify.send_replace(number);
    metrics().standing_versions.inc();
    true
}

/// An answer's probe with its BM25 members weighed by `encoder` (those of `previous` taken as
/// they are) and their texts dropped; without an encoder (the index weighs terms) the members are
/// of no use and dropped.
pub(super) fn weighed(
    probe: Option<Arc<Probe>>,
    encoder: Option<&Bm25Encoder>,
    previous: Option<&Probe>,
) -> Option<Arc<Probe>> {
    let mut probe = probe?;
    let inner = Arc::make_mut(&mut probe);
    match encoder {
        Some(encoder) => inner.weigh_members(encoder, previous),
        None => inner.bm25_members.clear(),
    }
    Some(probe)
}
