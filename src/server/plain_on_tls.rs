//! A plain HTTP request on a TLS listener gets a plain HTTP 400 that says so, as Go's and
//! nginx's servers answer it, rather than a TLS alert, which clients print as garbage
//! (curl: "Received HTTP/0.9 when not allowed"; tritonclient: an HTTPParseError).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The answer, whole: the connection closes after it.
const ANSWER_BODY: &str =
    r#"{"error":"this port serves HTTPS: the request was sent as plain HTTP; use https://"}"#;

/// Whether the connection's first byte starts a plain HTTP/1 request (a method begins with
/// an upper-case letter) rather than a TLS record (a handshake's is 0x16). Waits for it.
pub async fn starts_plain_http(stream: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    matches!(stream.peek(&mut first).await, Ok(1) if first[0].is_ascii_uppercase())
}

/// How much of the request is read and dropped after the answer, and for how long.
const LINGER_BYTES: usize = 64 << 10;
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// Writes the 400 and closes. The request's bytes are read and dropped for a moment after
/// the answer (as nginx's lingering close does): a socket closed with unread data sends a
/// reset, and a client still sending a body would see that instead of the 400.
pub async fn refuse(mut stream: TcpStream) {
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{ANSWER_BODY}",
        ANSWER_BODY.len()
    );
    // Bounded: a client that reads nothing, or sends without end, is dropped at LINGER.
    let answer_then_drain = async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<_, std::io::Error>(())
    };
    let _ = tokio::time::timeout(LINGER, answer_then_drain).await;
}
