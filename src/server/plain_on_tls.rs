//! A plain HTTP request on a TLS listener gets a plain HTTP 400 that says so, as Go's and
//! nginx's servers answer it, rather than a TLS alert, which clients print as garbage
//! (curl: "Received HTTP/0.9 when not allowed"; tritonclient: an HTTPParseError).

use tokio::io::AsyncWriteExt;
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

/// Writes the 400 and closes. The request is not read: its answer does not depend on it.
pub async fn refuse(mut stream: TcpStream) {
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{ANSWER_BODY}",
        ANSWER_BODY.len()
    );
    // A client that does not read gets nothing more: the write is small, and bounded.
    let write = async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), write).await;
}
