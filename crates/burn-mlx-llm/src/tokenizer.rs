//! Text in and out: the model folder's `tokenizer.json` through the `tokenizers` crate, and a
//! streaming decoder that turns generated ids into text as they arrive.

use super::error::{LlmError, Result};
use std::path::Path;
use tokenizers::Tokenizer;

/// `dir/tokenizer.json`; `None` when it is absent and not `required`.
pub fn load_tokenizer(dir: &Path, required: bool) -> Result<Option<Tokenizer>> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return if required {
            Err(LlmError::Tokenizer(format!(
                "{} not found; give --prompt-ids instead of --prompt",
                path.display()
            )))
        } else {
            Ok(None)
        };
    }
    Tokenizer::from_file(&path)
        .map(Some)
        .map_err(|e| LlmError::Tokenizer(format!("{}: {e}", path.display())))
}

/// The ids of `text`, with the tokenizer's special tokens (a BOS token where it adds one).
pub fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    Ok(tokenizer
        .encode(text, true)
        .map_err(|e| LlmError::Tokenizer(e.to_string()))?
        .get_ids()
        .to_vec())
}

/// Decodes generated ids into text one token at a time.
///
/// A token's text can depend on its neighbours (leading spaces, bytes of one character split
/// over several tokens), so each call decodes every id so far and returns what was added since
/// the last call; while the text ends in an incomplete character (U+FFFD), nothing is returned
/// until a later token completes it.
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    tokens: Vec<u32>,
    printed: String,
}

impl<'a> TextStream<'a> {
    /// An empty stream.
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        Self {
            tokenizer,
            tokens: vec![],
            printed: String::new(),
        }
    }

    /// Adds `token` and returns the text it completes (possibly empty).
    pub fn push(&mut self, token: u32) -> Result<String> {
        self.tokens.push(token);
        let text = self
            .tokenizer
            .decode(&self.tokens, true)
            .map_err(|e| LlmError::Tokenizer(e.to_string()))?;
        if text.ends_with('\u{fffd}') {
            return Ok(String::new());
        }
        let new = match text.strip_prefix(self.printed.as_str()) {
            Some(suffix) => suffix.to_string(),
            // The decoded prefix changed (a tokenizer that rewrites earlier text): print the
            // part after the longest common prefix.
            None => {
                let common = self
                    .printed
                    .char_indices()
                    .zip(text.chars())
                    .find(|((_, a), b)| a != b)
                    .map_or(self.printed.len().min(text.len()), |((i, _), _)| i);
                text[common..].to_string()
            }
        };
        self.printed = text;
        Ok(new)
    }

    /// Everything decoded so far.
    pub fn text(&self) -> &str {
        &self.printed
    }
}
