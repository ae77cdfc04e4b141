//! RFC 3339 date-times of range conditions: checked, and put in the one form both index engines
//! parse alike.

/// A date-time [`is_datetime`] accepts, in one form both index engines parse alike:
/// `YYYY-MM-DDTHH:MM:SS[.f](Z|±HH:MM)` (an upper-case `T` and `Z`, seconds, and `Z` where no offset
/// was given, a date alone being its midnight UTC).
pub fn normal_datetime(text: &str) -> String {
    let mut out: String = text
        .chars()
        .enumerate()
        .map(|(i, c)| match c {
            ' ' | 't' if i == 10 => 'T',
            'z' => 'Z',
            c => c,
        })
        .collect();
    if out.len() == 10 {
        out.push_str("T00:00:00");
    }
    let offset = out.len() > 19 && out[19..].contains(['Z', '+', '-']);
    if !offset {
        out.push('Z');
    }
    out
}

/// Whether `text` is an RFC 3339 date-time or a date (`YYYY-MM-DD`, optionally `THH:MM:SS[.f]` and
/// `Z` or an offset `±HH:MM`; no offset is UTC), as the index's date-time ranges take them.
pub fn is_datetime(text: &str) -> bool {
    fn digits(text: &str, at: usize, n: usize) -> Option<u32> {
        let part = text.get(at..at + n)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    }
    let bytes = text.as_bytes();
    let (Some(year), Some(month), Some(day)) =
        (digits(text, 0, 4), digits(text, 5, 2), digits(text, 8, 2))
    else {
        return false;
    };
    if bytes.get(4) != Some(&b'-') || bytes.get(7) != Some(&b'-') {
        return false;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    if !(1..=days).contains(&day) {
        return false;
    }
    if text.len() == 10 {
        return true;
    }
    if !matches!(bytes.get(10), Some(b'T' | b't' | b' ')) {
        return false;
    }
    let (Some(hour), Some(minute)) = (digits(text, 11, 2), digits(text, 14, 2)) else {
        return false;
    };
    if bytes.get(13) != Some(&b':') || hour > 23 || minute > 59 {
        return false;
    }
    let mut at = 16;
    match (bytes.get(at), digits(text, at + 1, 2)) {
        (Some(b':'), Some(second)) if second <= 60 => at += 3,
        _ => return false,
    }
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while bytes.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        if at == start {
            return false;
        }
    }
    match bytes.get(at) {
        None => true,
        Some(b'Z' | b'z') => at + 1 == bytes.len(),
        Some(b'+' | b'-') => {
            bytes.get(at + 3) == Some(&b':')
                && digits(text, at + 1, 2).is_some_and(|h| h <= 23)
                && digits(text, at + 4, 2).is_some_and(|m| m <= 59)
                && at + 6 == bytes.len()
        }
        _ => false,
    }
}
