//! Lowercase hex, byte for byte what `hex::encode` returns, written into a
//! sized buffer instead of collected one `char` at a time: the hex of a
//! digest or MAC is taken on every receipt, chain head, transcript message
//! and model call, and the `char` iterator cost several times the encoding.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `prefix`, then the lowercase hex of `bytes`.
fn prefixed(prefix: &str, bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(prefix.len() + bytes.len() * 2);
    out.extend_from_slice(prefix.as_bytes());
    out.resize(prefix.len() + bytes.len() * 2, 0);
    for (pair, &byte) in out[prefix.len()..].chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
    String::from_utf8(out).unwrap_or_else(|_| unreachable!("a str and ASCII digits are UTF-8"))
}

/// The lowercase hex of `bytes` (what `hex::encode(bytes)` returns).
pub fn lower(bytes: &[u8]) -> String {
    prefixed("", bytes)
}

/// `sha256:<lowercase hex of digest>`.
pub fn sha256_tagged(digest: &[u8]) -> String {
    prefixed("sha256:", digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_what_the_hex_crate_writes() {
        let every: Vec<u8> = (0..=255).collect();
        assert_eq!(lower(&every), hex::encode(&every));
        assert_eq!(lower(&[]), "");
        assert_eq!(
            sha256_tagged(&every),
            format!("sha256:{}", hex::encode(&every))
        );
    }
}
