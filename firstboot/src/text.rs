//! Small text helpers shared by the status file, diagnosis and the waits.

/// Appends at most `cap` bytes of `s` to `out` (counting what `out` already holds), cutting
/// on a character boundary.
pub fn push_capped(out: &mut String, s: &str, cap: usize) {
    let room = cap.saturating_sub(out.len());
    if s.len() <= room {
        out.push_str(s);
        return;
    }
    let mut end = room;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.push_str(&s[..end]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_push_cuts_on_char_boundary() {
        let mut s = String::from("ab");
        push_capped(&mut s, "cdé", 5);
        assert_eq!(s, "abcd");
    }
}
