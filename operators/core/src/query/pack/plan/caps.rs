//! The tier caps (`max_snippets`, `max_surrogates`): how many items may take each kind of form.

use super::{Entry, PackConfig, Tier};

/// The capped class of a tier: snippets 0, surrogates 1 (expanded and whole forms are not capped).
fn class(tier: Tier) -> Option<usize> {
    match tier {
        Tier::Snippet => Some(0),
        Tier::Surrogate | Tier::Gist | Tier::Micro => Some(1),
        Tier::Expanded | Tier::Full => None,
    }
}

/// The tier caps, snippets then surrogates (`usize::MAX` where the config sets none).
pub(super) fn caps(config: &PackConfig) -> [usize; 2] {
    [config.max_snippets, config.max_surrogates].map(|cap| if cap == 0 { usize::MAX } else { cap })
}

/// Whether the entry is the top result (packed whatever the caps).
fn is_top(index: usize, entry: &Entry<'_>) -> bool {
    index == 0 && !entry.deferred
}

/// Whether the plan's items keep to the tier caps (the top result counts, but a cap never leaves
/// it out).
pub(super) fn caps_hold(entries: &[Entry<'_>], caps: [usize; 2]) -> bool {
    let mut used = [0usize; 2];
    let mut top = [0usize; 2];
    for (index, entry) in entries.iter().enumerate() {
        let Some(class) = entry.state.and_then(|s| class(entry.forms[s].tier)) else {
            continue;
        };
        used[class] += 1;
        if is_top(index, entry) {
            top[class] = 1;
        }
    }
    (0..2).all(|c| used[c] <= caps[c].max(top[c]))
}

/// Holds the plan to the tier caps: in value order (the top result first, never moved), an item
/// whose class is full takes its next form of a class with room, or is left out.
pub(super) fn cap_tiers(entries: &mut [Entry<'_>], caps: [usize; 2]) {
    if caps == [usize::MAX; 2] {
        return;
    }
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        is_top(b, &entries[b])
            .cmp(&is_top(a, &entries[a]))
            .then(entries[b].value.total_cmp(&entries[a].value))
    });
    let mut used = [0usize; 2];
    for index in order {
        let top = is_top(index, &entries[index]);
        let entry = &mut entries[index];
        let Some(mut state) = entry.state else {
            continue;
        };
        loop {
            match class(entry.forms[state].tier) {
                Some(c) if used[c] >= caps[c] && !top => {
                    entry.capped = true;
                    if state + 1 == entry.forms.len() {
                        entry.state = None;
                        break;
                    }
                    state += 1;
                }
                class => {
                    if let Some(c) = class {
                        used[c] += 1;
                    }
                    entry.state = Some(state);
                    break;
                }
            }
        }
    }
}
