//! The service's scheduling: which work an executor takes next (queries first; ingest slices by
//! deficit round robin over the tenants' lanes, within the query headroom) and how a request's texts
//! are cut into slices.

use super::*;

/// The next work for an executor of `role`, or `None` when the service stops.
pub(super) fn next_work(shared: &Shared, role: Role) -> Option<Work> {
    let condvar = match role {
        Role::Query => &shared.query_work,
        Role::Both | Role::Ingest => &shared.work,
    };
    let mut queues = lock(&shared.queues);
    loop {
        if queues.stopping {
            return None;
        }
        let now = Instant::now();
        let paused_until = queues
            .backoff_until
            .filter(|&until| until > now && role != Role::Query)
            .or_else(|| sitting_out(shared, &queues, now).filter(|_| role != Role::Query));
        let work = if !queues.query.is_empty() && role != Role::Ingest {
            let take = queues.query.len().min(shared.config.query_batch);
            Some(Work::Queries(queues.query.drain(..take).collect()))
        } else if paused_until.is_none() && role != Role::Query {
            let queues = &mut *queues;
            let slice = take_slice(
                &mut queues.ingest,
                &mut queues.lanes,
                shared.config.slice_word_pieces,
                shared.pools_spans,
            );
            queues.slices_running += usize::from(slice.is_some());
            slice
        } else {
            None
        };
        if let Some(work) = work {
            // A submit wakes one executor: with work left, this one passes the wake on, so every
            // executor is busy while there is work (not only after the next submit).
            if !queues.query.is_empty() {
                shared.wake_for_queries();
            }
            if paused_until.is_none() && queues.ingest.iter().any(Request::has_slices) {
                shared.work.notify_one();
            }
            return Some(work);
        }
        queues = match paused_until {
            Some(until) => {
                condvar
                    .wait_timeout(queues, until - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => condvar.wait(queues).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// Until when an executor that would start an ingest slice sits out: while a query came within
/// [`ServiceConfig::query_headroom`] and all but one of the ingest executors are embedding, until
/// the window ends (a finished slice wakes it sooner). `None`: it may start one.
pub(super) fn sitting_out(shared: &Shared, queues: &Queues, now: Instant) -> Option<Instant> {
    let window = shared.config.query_headroom?;
    let until = queues.last_query? + window;
    (shared.ingest_executors > 1
        && until > now
        && queues.slices_running + 1 >= shared.ingest_executors)
        .then_some(until)
}

/// Estimated word pieces of the text at `position` with its spans (free where they are `pooled`).
pub(super) fn text_cost(request: &Request, position: usize, pooled: bool) -> usize {
    let text = &request.texts[position];
    let spans = match pooled {
        true => &[][..],
        false => request.spans.get(position).map_or(&[][..], Vec::as_slice),
    };
    estimated_word_pieces(text)
        + spans
            .iter()
            .map(|r| estimated_word_pieces(text.get(r.clone()).unwrap_or_default()))
            .sum::<usize>()
}

/// The next slice of `request`: a slice handed back after an outage, else about `budget` estimated
/// word pieces (at least one text) not handed out yet; with its cost. Nothing is taken yet.
pub(super) fn next_slice(request: &Request, budget: usize, pooled: bool) -> (Vec<usize>, usize) {
    if let Some(positions) = request.retry.last() {
        let cost = positions
            .iter()
            .map(|&p| text_cost(request, p, pooled))
            .sum();
        return (positions.clone(), cost);
    }
    let mut cost = 0;
    let mut positions = Vec::new();
    for &position in &request.order[request.next..] {
        let text_cost = text_cost(request, position, pooled);
        if !positions.is_empty() && cost + text_cost > budget {
            break;
        }
        cost += text_cost;
        positions.push(position);
    }
    (positions, cost)
}

/// The next ingest slice: from the lane whose turn it is ([`Drr`]), its first request with texts not
/// yet handed out (or handed back).
pub(super) fn take_slice(
    ingest: &mut VecDeque<Request>,
    lanes: &mut Drr,
    budget: usize,
    pooled: bool,
) -> Option<Work> {
    for request in ingest.iter().filter(|r| r.has_slices()) {
        if !lanes.credit.contains_key(&request.lane) {
            lanes.credit.insert(request.lane.clone(), 0);
            lanes.active.push_back(request.lane.clone());
        }
    }
    loop {
        let lane = lanes.active.front()?.clone();
        let Some(request) = ingest.iter_mut().find(|r| r.lane == lane && r.has_slices()) else {
            lanes.active.pop_front();
            lanes.credit.remove(&lane);
            continue;
        };
        let (positions, cost) = next_slice(request, budget, pooled);
        let credit = lanes.credit.entry(lane).or_default();
        if *credit < cost {
            *credit += budget;
            lanes.active.rotate_left(1);
            continue;
        }
        *credit -= cost;
        match request.retry.pop() {
            Some(_) => {}
            None => request.next += positions.len(),
        }
        return Some(Work::Slice {
            id: request.id,
            texts: request.texts.clone(),
            spans: request.spans.clone(),
            positions,
        });
    }
}
