//! Lowercase hex, byte for byte what `hex::encode` returns, written into a
//! reserved buffer instead of collected one `char` at a time: the hex of a
//! digest or MAC is taken on every receipt, chain head, transcript message
//! and model call, and the `char` iterator cost several times the encoding.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends the lowercase hex of `bytes` to `out`.
pub fn push_lower(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    for &byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

/// The lowercase hex of `bytes` (what `hex::encode(bytes)` returns).
pub fn lower(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_lower(&mut out, bytes);
    out
}

/// `sha256:<lowercase hex of digest>`.
pub fn sha256_tagged(digest: &[u8]) -> String {
    const TAG: &str = "sha256:";
    let mut out = String::with_capacity(TAG.len() + digest.len() * 2);
    out.push_str(TAG);
    push_lower(&mut out, digest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_what_the_hex_crate_writes() {
        let every: Vec<u8> = (0..=255).collect();
        assert_eq!(lower(&every), hex::encode(&every));
        assert_eq!(lower(&[]), "");
        assert_eq!(sha256_tagged(&[0xab, 0x01]), "sha256:ab01");
        let mut out = String::from("x");
        push_lower(&mut out, &[0, 0xff]);
        assert_eq!(out, "x00ff");
    }
}
