//! Newline-delimited framing with a length bound.
//!
//! A line longer than the bound is never held in memory whole: once it passes
//! the bound the reader switches to discarding until the next newline and
//! reports [`Frame::TooLarge`], so one oversized frame costs at most `max`
//! bytes of memory and the connection keeps working.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One read from a line-delimited stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A complete line without its `\n` (and without a trailing `\r`).
    Line(Vec<u8>),
    /// A line that exceeded the bound; its bytes were discarded.
    TooLarge {
        /// Its full length (bytes).
        bytes: usize,
    },
    /// End of stream.
    Eof,
}

/// Reads the next line of at most `max` bytes.
///
/// # Errors
/// I/O errors of the underlying reader.
pub async fn read_frame<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> std::io::Result<Frame> {
    let mut line = Vec::new();
    let mut total = 0usize;
    let mut oversized = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(match (oversized, total) {
                (true, _) => Frame::TooLarge { bytes: total },
                (false, 0) => Frame::Eof,
                (false, _) => Frame::Line(line),
            });
        }
        let (chunk, found_newline) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], true),
            None => (available, false),
        };
        total += chunk.len();
        if !oversized && total > max {
            oversized = true;
            line = Vec::new();
        }
        if !oversized {
            line.extend_from_slice(chunk);
        }
        let consumed = chunk.len() + usize::from(found_newline);
        reader.consume(consumed);
        if found_newline {
            if oversized {
                return Ok(Frame::TooLarge { bytes: total });
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Frame::Line(line));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    #[tokio::test]
    async fn splits_lines_and_bounds_them() {
        let input = b"one\r\ntwo\n0123456789ABCDEF\nlast".to_vec();
        let mut r = BufReader::with_capacity(4, &input[..]);
        assert_eq!(
            read_frame(&mut r, 10).await.unwrap(),
            Frame::Line(b"one".to_vec())
        );
        assert_eq!(
            read_frame(&mut r, 10).await.unwrap(),
            Frame::Line(b"two".to_vec())
        );
        assert_eq!(
            read_frame(&mut r, 10).await.unwrap(),
            Frame::TooLarge { bytes: 16 }
        );
        assert_eq!(
            read_frame(&mut r, 10).await.unwrap(),
            Frame::Line(b"last".to_vec())
        );
        assert_eq!(read_frame(&mut r, 10).await.unwrap(), Frame::Eof);
    }
}
