//! The `openai` provider: any OpenAI-compatible `/v1/chat/completions` endpoint.

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::{ModelDelta, ModelError, ModelProvider, ModelRequest, ModelResponse};

/// An OpenAI-compatible chat completions model.
#[derive(Debug)]
pub struct OpenAiModel {
    name: String,
}

impl OpenAiModel {
    /// Reads `OPENAI_BASE_URL` / `OPENAI_API_KEY`.
    ///
    /// # Errors
    /// [`ModelError::Config`].
    pub fn from_env(model: &str) -> Result<Self, ModelError> {
        Ok(Self {
            name: format!("openai:{model}"),
        })
    }
}

#[async_trait]
impl ModelProvider for OpenAiModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(
        &self,
        _request: &ModelRequest,
        _deltas: mpsc::UnboundedSender<ModelDelta>,
    ) -> Result<ModelResponse, ModelError> {
        Err(ModelError::Config("openai provider: being written".into()))
    }
}
