//! ACP over stdio: stdin carries client frames, stdout only server frames.

use berth_actors::Node;

use crate::connection::{serve, ServeOptions};

/// Serves one ACP connection on stdin/stdout until stdin closes and every
/// in-flight request has been answered.
///
/// # Errors
/// I/O errors on stdin/stdout.
pub async fn serve_stdio(node: Node, options: ServeOptions) -> std::io::Result<()> {
    serve(node, tokio::io::stdin(), tokio::io::stdout(), options).await
}
