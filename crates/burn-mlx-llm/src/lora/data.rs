//! Training data for LoRA fine-tuning, in the formats of mlx-lm's `mlx_lm.lora`.
//!
//! A data folder holds `train.jsonl`, `valid.jsonl` and optionally `test.jsonl`. Each line is
//! one JSON object: `{"text"}`, `{"prompt", "completion"}` or `{"messages"}` (with optional
//! `"tools"`); the first line fixes the format of its file. Conversations go through the model's
//! Hugging Face chat template, rendered with MiniJinja set up like transformers' Jinja
//! environment, and every example records how many leading tokens are prompt so that
//! `--mask-prompt` can leave them out of the loss. [`Batches`] then groups the examples as
//! mlx-lm's `iterate_batches` does: sorted by length, padded to one plus a multiple of 32.

use crate::error::{LlmError, Result};
use minijinja::value::{Kwargs, Serde, Value, ValueKind};
use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{Map, Value as Json};
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

/// Results whose error is a message for the line (or template) at hand.
type Msg<T> = std::result::Result<T, String>;

/// One training example: its token ids and the number of leading tokens that are prompt (no
/// loss under mask_prompt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// The token ids, special tokens included.
    pub tokens: Vec<u32>,
    /// How many leading tokens are prompt (at most `tokens.len()`).
    pub prompt_len: usize,
}

/// The splits of a data folder.
#[derive(Debug, Clone)]
pub struct Splits {
    /// `train.jsonl`.
    pub train: Vec<Example>,
    /// `valid.jsonl`.
    pub valid: Vec<Example>,
    /// `test.jsonl`, when the folder has one.
    pub test: Option<Vec<Example>>,
}

/// Which format a file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"text": ...}`: plain text, every token a target.
    Text,
    /// `{"prompt": ..., "completion": ...}`: one user turn and one assistant turn.
    Completion,
    /// `{"messages": [...]}` (and optional `"tools"`): a conversation through the chat template.
    Chat,
}

impl Format {
    /// The format mlx-lm picks for a first line: `prompt` and `completion`, then `messages`,
    /// then `text`.
    fn detect(obj: &Map<String, Json>) -> Option<Format> {
        [Format::Completion, Format::Chat, Format::Text]
            .into_iter()
            .find(|f| f.fits(obj))
    }

    /// Whether a line holds the keys of this format (other keys are ignored, as in mlx-lm).
    fn fits(self, obj: &Map<String, Json>) -> bool {
        match self {
            Format::Completion => obj.contains_key("prompt") && obj.contains_key("completion"),
            Format::Chat => obj.contains_key("messages"),
            Format::Text => obj.contains_key("text"),
        }
    }

    /// The keys a line of this format holds, for error messages.
    fn keys(self) -> &'static str {
        match self {
            Format::Text => "key `text`",
            Format::Completion => "keys `prompt` and `completion`",
            Format::Chat => "key `messages`",
        }
    }
}

/// A model's chat template (Hugging Face `chat_template.jinja` or `tokenizer_config.json`),
/// compiled once and rendered like transformers' `apply_chat_template`: `trim_blocks` and
/// `lstrip_blocks`, loop controls, Python string and dict methods (`.strip()`, `.split()`,
/// `.items()`, ...), `tojson` as Python's `json.dumps`, and `raise_exception(msg)` failing the
/// render with `msg`.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the special tokens the template may name.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let env = jinja_environment(source).map_err(LlmError::Input)?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The template of the model folder `dir`: `chat_template.jinja` if present (newer
    /// transformers save it there, and it wins over the config), else `chat_template` of
    /// `tokenizer_config.json` (a string, or a list of `{name, template}` whose `default` is
    /// used). `None` when the folder has neither. The BOS/EOS tokens come from the config.
    pub fn from_model_dir(dir: &Path) -> Result<Option<ChatTemplate>> {
        let path = dir.join("tokenizer_config.json");
        let error = |message: String| LlmError::Config {
            path: path.clone(),
            message,
        };
        let config: Json = match path.is_file() {
            true => serde_json::from_str(&read(&path)?)
                .map_err(|e| error(format!("not valid JSON: {e}")))?,
            false => Json::Null,
        };
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.is_file() {
            read(&jinja)?
        } else {
            match config.get("chat_template") {
                None | Some(Json::Null) => return Ok(None),
                Some(Json::String(s)) => s.clone(),
                Some(Json::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str())
                    .ok_or_else(|| error("`chat_template` has no template named `default`".into()))?
                    .to_string(),
                Some(other) => {
                    let found = json_kind(other);
                    return Err(error(format!(
                        "`chat_template` is {found}, not a string or a list"
                    )));
                }
            }
        };
        // A special token is a string or an AddedToken object `{"content": ...}`.
        let token = |key: &str| match config.get(key)? {
            Json::Object(o) => o.get("content")?.as_str().map(String::from),
            other => other.as_str().map(String::from),
        };
        let env = jinja_environment(&source).map_err(|message| LlmError::Config {
            path: if jinja.is_file() {
                jinja.clone()
            } else {
                path.clone()
            },
            message,
        })?;
        Ok(Some(Self {
            env,
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
        }))
    }

    /// The EOS token's text (`eos_token` of `tokenizer_config.json`), if known.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders `messages` (a JSON list of `{role, content, ...}`) and optional `tools`; with
    /// `add_generation_prompt` the text ends with the header of an assistant turn. Objects keep
    /// the key order of their `serde_json::Value` (sorted, as serde_json is built here), which
    /// shows only where the template applies `tojson` to them; [`load_jsonl`] keeps file order.
    pub fn render(
        &self,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let (messages, tools) = (
            Value::from(Serde(messages)),
            tools.map(|t| Value::from(Serde(t))),
        );
        self.render_values(messages, tools, add_generation_prompt)
            .map_err(LlmError::Input)
    }

    /// [`ChatTemplate::render`] on template values (which keep their JSON's key order).
    fn render_values(
        &self,
        messages: Value,
        tools: Option<Value>,
        add_generation_prompt: bool,
    ) -> Msg<String> {
        // As in transformers, a token the config does not set is undefined, not none.
        let token = |t: &Option<String>| t.as_deref().map_or(Value::UNDEFINED, Value::from);
        let ctx = context! {
            messages, add_generation_prompt,
            tools => tools.unwrap_or(Value::from(())),
            bos_token => token(&self.bos_token),
            eos_token => token(&self.eos_token),
        };
        let template = self
            .env
            .get_template("chat_template")
            .map_err(|e| jinja_message(&e))?;
        template.render(ctx).map_err(|e| jinja_message(&e))
    }
}

/// An environment holding `source` as `chat_template`, set up like transformers'.
fn jinja_environment(source: &str) -> Msg<Environment<'static>> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build();
    env.set_syntax(syntax.map_err(|e| jinja_message(&e))?);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<Value, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, message))
        },
    );
    env.add_template_owned("chat_template", source.to_string())
        .map_err(|e| jinja_message(&e))?;
    Ok(env)
}

/// A MiniJinja error and its causes, on one line.
fn jinja_message(e: &JinjaError) -> String {
    let mut message = format!("chat template: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    message
}

/// The `tojson` filter of transformers' templates: Python's `json.dumps(value,
/// ensure_ascii=False, indent=indent)`, so `", "`/`": "` between items (`","` with an indent),
/// non-ASCII text as is and no HTML escaping (MiniJinja's own `tojson` is compact and escapes
/// `<`). Other arguments are refused rather than ignored.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<String, JinjaError> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        Some(v) if v.as_i64().is_some() => {
            Some(" ".repeat(v.as_i64().unwrap_or(0).max(0) as usize))
        }
        Some(v) if v.as_str().is_some() => v.as_str().map(String::from),
        Some(v) if !v.is_none() => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                "tojson: indent must be a number or a string",
            ))
        }
        _ => None,
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, &value, indent.as_deref(), 0)?;
    Ok(out)
}

/// Appends `value` as JSON at nesting `depth` (see [`tojson`]).
fn write_json(
    out: &mut String,
    value: &Value,
    indent: Option<&str>,
    depth: usize,
) -> std::result::Result<(), JinjaError> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match f64::try_from(value.clone()) {
            // Python writes an integral float as `1.0`.
            Ok(f) if !value.is_integer() && f.is_finite() && f.fract() == 0.0 => {
                out.push_str(&format!("{f:.1}"))
            }
            _ => out.push_str(&value.to_string()),
        },
        ValueKind::String => out.push_str(&Json::from(value.as_str().unwrap_or("")).to_string()),
        kind @ (ValueKind::Seq | ValueKind::Iterable | ValueKind::Map) => {
            let is_map = kind == ValueKind::Map;
            let items: Vec<Value> = value.try_iter()?.collect();
            out.push(if is_map { '{' } else { '[' });
            for (i, item) in items.iter().enumerate() {
                out.push_str(match (i, indent) {
                    (0, _) => "",
                    (_, Some(_)) => ",",
                    (_, None) => ", ",
                });
                if let Some(indent) = indent {
                    out.push('\n');
                    out.push_str(&indent.repeat(depth + 1));
                }
                if is_map {
                    // Python writes keys that are not strings as their JSON text, quoted.
                    let key = item.as_str().map_or_else(|| item.to_string(), String::from);
                    out.push_str(&Json::from(key).to_string());
                    out.push_str(": ");
                    write_json(out, &value.get_item(item)?, indent, depth + 1)?;
                } else {
                    write_json(out, item, indent, depth + 1)?;
                }
            }
            if let (Some(indent), false) = (indent, items.is_empty()) {
                out.push('\n');
                out.push_str(&indent.repeat(depth));
            }
            out.push(if is_map { '}' } else { ']' });
        }
        other => {
            let message = format!("tojson: cannot serialize a value of kind {other}");
            return Err(JinjaError::new(ErrorKind::InvalidOperation, message));
        }
    }
    Ok(())
}

/// The EOS id appended to text examples: the template's `eos_token` when the tokenizer knows
/// it, else the first special token of the tokenizer with a well-known EOS name (the folder of a
/// base model may carry no template).
pub fn eos_token_id(tokenizer: &Tokenizer, template: Option<&ChatTemplate>) -> Option<u32> {
    if let Some(id) = template
        .and_then(ChatTemplate::eos_token)
        .and_then(|t| tokenizer.token_to_id(t))
    {
        return Some(id);
    }
    let known = [
        "<|endoftext|>",
        "<|end_of_text|>",
        "</s>",
        "<eos>",
        "<|im_end|>",
        "<|eot_id|>",
        "<end_of_turn>",
    ];
    let added = tokenizer.get_added_tokens_decoder();
    known.iter().find_map(|name| {
        added
            .iter()
            .find(|(_, t)| t.special && t.content == *name)
            .map(|(id, _)| *id)
    })
}

/// Reads a file to a string.
fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| LlmError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// What kind of JSON value `v` is, for error messages.
fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

/// The keys of a line, for error messages.
fn key_list(obj: &Map<String, Json>) -> String {
    let keys: Vec<String> = obj.keys().map(|k| format!("`{k}`")).collect();
    if keys.is_empty() {
        "no keys".into()
    } else {
        format!("keys {}", keys.join(", "))
    }
}

/// The ids of `text`, with or without the tokenizer's special tokens (BOS).
fn encode(tokenizer: &Tokenizer, text: &str, special: bool) -> Msg<Vec<u32>> {
    let encoding = tokenizer
        .encode(text, special)
        .map_err(|e| format!("tokenizer: {e}"))?;
    Ok(encoding.get_ids().to_vec())
}

/// The string under `key`, or a message naming it.
fn string_field<'a>(obj: &'a Map<String, Json>, key: &str) -> Msg<&'a str> {
    match obj.get(key) {
        Some(Json::String(s)) => Ok(s),
        Some(other) => Err(format!(
            "key `{key}` must be a string, found {}",
            json_kind(other)
        )),
        None => Err(format!("missing key `{key}`")),
    }
}

/// The example of one line of format `format`; `raw` is the line as template values, keeping
/// its keys in file order as Python's `json.loads` does (templates may `tojson` the tools).
fn parse_line(
    format: Format,
    obj: &Map<String, Json>,
    raw: &Value,
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    eos: Option<u32>,
) -> Msg<Example> {
    // Only conversations go through the template, so only they read `tools`.
    let tools = match obj.get("tools").filter(|_| format != Format::Text) {
        None | Some(Json::Null) => None,
        Some(Json::Array(_)) => Some(raw.get_attr("tools").map_err(|e| e.to_string())?),
        Some(other) => {
            return Err(format!(
                "key `tools` must be a list, found {}",
                json_kind(other)
            ))
        }
    };
    // Rendered text already holds the template's special tokens: encode it without adding any,
    // as transformers' `apply_chat_template(tokenize=True)` does.
    let render = |t: &ChatTemplate, messages: Vec<Value>, generation: bool| {
        encode(
            tokenizer,
            &t.render_values(Value::from(messages), tools.clone(), generation)?,
            false,
        )
    };
    let with_eos = |mut ids: Vec<u32>| {
        if let Some(eos) = eos.filter(|eos| ids.last() != Some(eos)) {
            ids.push(eos);
        }
        ids
    };
    let (tokens, prompt_len) = match (format, template) {
        (Format::Text, _) => (
            with_eos(encode(tokenizer, string_field(obj, "text")?, true)?),
            0,
        ),
        (Format::Completion, None) => {
            let (prompt, completion) = (
                string_field(obj, "prompt")?,
                string_field(obj, "completion")?,
            );
            let tokens = with_eos(encode(tokenizer, &format!("{prompt}{completion}"), true)?);
            (tokens, encode(tokenizer, prompt, true)?.len())
        }
        (Format::Completion, Some(t)) => {
            let user = context! { role => "user", content => string_field(obj, "prompt")? };
            let reply =
                context! { role => "assistant", content => string_field(obj, "completion")? };
            (
                render(t, vec![user.clone(), reply], false)?,
                render(t, vec![user], true)?.len(),
            )
        }
        (Format::Chat, None) => {
            return Err(
                "the chat format needs a chat template, and the model folder has none \
                        (no `chat_template` in tokenizer_config.json, no chat_template.jinja)"
                    .into(),
            )
        }
        (Format::Chat, Some(t)) => {
            let list = match obj.get("messages") {
                Some(Json::Array(list)) if !list.is_empty() => list,
                Some(other) => {
                    let found = if other.is_array() {
                        "an empty list"
                    } else {
                        json_kind(other)
                    };
                    return Err(format!(
                        "key `messages` must be a non-empty list, found {found}"
                    ));
                }
                None => return Err("missing key `messages`".into()),
            };
            if let Some(i) = list
                .iter()
                .position(|m| m.get("role").and_then(Json::as_str).is_none())
            {
                return Err(format!(
                    "`messages[{i}]` must be an object with a string `role`"
                ));
            }
            let messages: Vec<Value> = raw
                .get_attr("messages")
                .map_err(|e| e.to_string())?
                .try_iter()
                .map_err(|e| e.to_string())?
                .collect();
            let last_is_reply = list[list.len() - 1]["role"] == "assistant";
            let prompt_len = match render(t, messages[..messages.len() - 1].to_vec(), last_is_reply)
            {
                Ok(prompt) => prompt.len(),
                // Templates that read `messages[0]` fail on an empty head; with one message
                // nothing precedes it, so nothing is prompt.
                Err(_) if list.len() == 1 => 0,
                Err(e) => return Err(e),
            };
            (render(t, messages, false)?, prompt_len)
        }
    };
    if tokens.is_empty() {
        return Err("the line tokenizes to no tokens".into());
    }
    Ok(Example {
        prompt_len: prompt_len.min(tokens.len()),
        tokens,
    })
}

/// Reads a JSON Lines file of one format (fixed by its first line). Blank lines are skipped; a
/// bad line, or a line of another format, is a [`LlmError::Data`] naming the file and its
/// 1-based line; so is a file without examples.
pub fn load_jsonl(
    path: &Path,
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
) -> Result<(Format, Vec<Example>)> {
    let text = read(path)?;
    let eos = eos_token_id(tokenizer, template);
    let (mut format, mut examples) = (None, Vec::new());
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let error = |message| LlmError::Data {
            path: path.to_path_buf(),
            line: Some(i + 1),
            message,
        };
        let json: Json =
            serde_json::from_str(line).map_err(|e| error(format!("not valid JSON: {e}")))?;
        let Json::Object(obj) = &json else {
            return Err(error(format!(
                "expected a JSON object, found {}",
                json_kind(&json)
            )));
        };
        let (fmt, first) = match format {
            Some(f) => f,
            None => *format.insert((
                Format::detect(obj).ok_or_else(|| {
                    error(format!(
                        "unknown format: expected key `text`, keys `prompt` and `completion`, \
                         or key `messages`; found {}",
                        key_list(obj)
                    ))
                })?,
                i + 1,
            )),
        };
        if !fmt.fits(obj) {
            let found = key_list(obj);
            return Err(error(format!(
                "expected {} (the format of line {first}), found {found}",
                fmt.keys()
            )));
        }
        let raw: Value =
            serde_json::from_str(line).map_err(|e| error(format!("not valid JSON: {e}")))?;
        examples.push(parse_line(fmt, obj, &raw, tokenizer, template, eos).map_err(error)?);
    }
    let Some((format, _)) = format else {
        return Err(LlmError::Data {
            path: path.to_path_buf(),
            line: None,
            message: "the file holds no examples".into(),
        });
    };
    Ok((format, examples))
}

/// Loads `train.jsonl` and `valid.jsonl` (both required) and `test.jsonl` (if present) of the
/// folder `dir`.
pub fn load_dir(
    dir: &Path,
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
) -> Result<Splits> {
    let split = |name: &str| -> Result<Option<Vec<Example>>> {
        let path: PathBuf = dir.join(name);
        Ok(if path.is_file() {
            Some(load_jsonl(&path, tokenizer, template)?.1)
        } else {
            None
        })
    };
    let missing = |what: &str| LlmError::Data {
        path: dir.to_path_buf(),
        line: None,
        message: format!(
            "{what}: a data folder must hold train.jsonl and valid.jsonl (test.jsonl is optional)"
        ),
    };
    if !dir.is_dir() {
        return Err(missing("not a folder"));
    }
    let train = split("train.jsonl")?.ok_or_else(|| missing("no train.jsonl"))?;
    let valid = split("valid.jsonl")?.ok_or_else(|| missing("no valid.jsonl"))?;
    Ok(Splits {
        train,
        valid,
        test: split("test.jsonl")?,
    })
}

/// A padded batch as the trainer consumes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Row-major `[batch, seq]` token ids, right-padded with 0.
    pub tokens: Vec<u32>,
    /// Rows.
    pub batch: usize,
    /// Columns: one plus a multiple of 32, at most `max_seq_length`.
    pub seq: usize,
    /// Per row: tokens actually present (after truncation).
    pub lengths: Vec<usize>,
    /// Per row: prompt tokens (0 unless mask_prompt), capped at the length.
    pub offsets: Vec<usize>,
    /// Rows that were longer than `max_seq_length` and were cut to it.
    pub truncated: usize,
}

impl Batch {
    /// Target positions: for row r, token positions j with max(offsets[r], 1) <= j <
    /// lengths[r]; returns (row*seq + j - 1 as the flat index of the logit that predicts it,
    /// token id at j). Order: row-major.
    pub fn targets(&self) -> Vec<(usize, u32)> {
        let rows = 0..self.batch;
        let positions = rows
            .flat_map(|r| (self.offsets[r].max(1)..self.lengths[r]).map(move |j| r * self.seq + j));
        positions.map(|p| (p - 1, self.tokens[p])).collect()
    }

    /// Number of target tokens.
    pub fn num_targets(&self) -> usize {
        (0..self.batch)
            .map(|r| self.lengths[r].saturating_sub(self.offsets[r].max(1)))
            .sum()
    }
}

/// mlx-lm's batching: examples sorted by length, grouped into consecutive batches of
/// `batch_size` (a trailing incomplete group, the longest examples, is dropped), each padded to
/// `1 + 32·ceil(max_len/32)` capped at `max_seq_length`, longer rows truncated to
/// `max_seq_length`. The order of batches is shuffled per epoch with a seeded RNG.
pub struct Batches {
    /// The examples, sorted by length (stably: equal lengths keep their order).
    examples: Vec<Example>,
    batch_size: usize,
    max_seq_length: usize,
    mask_prompt: bool,
    rng: StdRng,
    /// This epoch's order of batch indices, and how far `next_batch` got in it.
    order: Vec<usize>,
    cursor: usize,
    epoch: usize,
}

impl Batches {
    /// Groups `examples`; an error when `batch_size` is 0, `max_seq_length` below 2 (no
    /// targets) or there are fewer examples than one batch.
    pub fn new(
        examples: &[Example],
        batch_size: usize,
        max_seq_length: usize,
        mask_prompt: bool,
        seed: u64,
    ) -> Result<Self> {
        if batch_size == 0 || max_seq_length < 2 {
            return Err(LlmError::Input(format!(
                "batch size must be at least 1 (is {batch_size}) and max_seq_length at least 2 \
                 (is {max_seq_length})"
            )));
        }
        if examples.len() < batch_size {
            let n = examples.len();
            return Err(LlmError::Input(format!(
                "the data set has {n} examples, fewer than the batch size {batch_size}"
            )));
        }
        let mut sorted = examples.to_vec();
        sorted.sort_by_key(|e| e.tokens.len());
        let mut rng = StdRng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..examples.len() / batch_size).collect();
        order.shuffle(&mut rng);
        Ok(Self {
            examples: sorted,
            batch_size,
            max_seq_length,
            mask_prompt,
            rng,
            order,
            cursor: 0,
            epoch: 0,
        })
    }

    /// The next batch; epochs roll over (re-shuffled) forever.
    pub fn next_batch(&mut self) -> Batch {
        if self.cursor == self.order.len() {
            self.order.shuffle(&mut self.rng);
            self.cursor = 0;
            self.epoch += 1;
        }
        self.cursor += 1;
        self.batch(self.order[self.cursor - 1])
    }

    /// Every batch once, in sorted order, no shuffle (validation).
    pub fn all(&self) -> Vec<Batch> {
        (0..self.len()).map(|i| self.batch(i)).collect()
    }

    /// Number of batches in an epoch.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether there are no batches (never: `new` asks for one full batch).
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// How many epochs `next_batch` has completed.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// Examples left out because they do not fill a last batch.
    pub fn dropped(&self) -> usize {
        self.examples.len() % self.batch_size
    }

    /// Examples in the batches that are longer than `max_seq_length` and get truncated.
    pub fn truncated(&self) -> usize {
        let used = &self.examples[..self.len() * self.batch_size];
        used.iter()
            .filter(|e| e.tokens.len() > self.max_seq_length)
            .count()
    }

    /// Batch `index` of the sorted order.
    fn batch(&self, index: usize) -> Batch {
        let rows = &self.examples[index * self.batch_size..(index + 1) * self.batch_size];
        let longest = rows.iter().map(|e| e.tokens.len()).max().unwrap_or(0);
        let seq = (1 + 32 * longest.div_ceil(32)).min(self.max_seq_length);
        let mut tokens = vec![0u32; rows.len() * seq];
        let (mut lengths, mut offsets) = (Vec::new(), Vec::new());
        for (r, example) in rows.iter().enumerate() {
            let length = example.tokens.len().min(self.max_seq_length);
            tokens[r * seq..r * seq + length].copy_from_slice(&example.tokens[..length]);
            lengths.push(length);
            offsets.push(if self.mask_prompt {
                example.prompt_len.min(length)
            } else {
                0
            });
        }
        let truncated = rows
            .iter()
            .filter(|e| e.tokens.len() > self.max_seq_length)
            .count();
        Batch {
            tokens,
            batch: rows.len(),
            seq,
            lengths,
            offsets,
            truncated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::str::FromStr;

    /// A word-level tokenizer splitting on whitespace and punctuation: `<unk>` 0, `<s>` 1 (the
    /// BOS that `encode(_, true)` adds), `<|endoftext|>` 2, `<|im_start|>` 3, `<|im_end|>` 4,
    /// then the words below.
    fn tokenizer() -> Tokenizer {
        let specials = [
            "<unk>",
            "<s>",
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
        ];
        let words = "user assistant system hello world hi there what is two plus four be helpful \
                     thanks a b c [ ] !";
        let vocab: Map<String, Json> = (specials.into_iter().chain(words.split_whitespace()))
            .enumerate()
            .map(|(i, w)| (w.to_string(), json!(i)))
            .collect();
        let added: Vec<Json> = (0..specials.len())
            .map(|id| {
                json!({"id": id, "content": specials[id], "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let bos = json!({"SpecialToken": {"id": "<s>", "type_id": 0}});
        let a = json!({"Sequence": {"id": "A", "type_id": 0}});
        let spec = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "decoder": null,
            "post_processor": {"type": "TemplateProcessing", "single": [bos, a],
                "pair": [bos, a, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
        });
        Tokenizer::from_str(&spec.to_string()).unwrap()
    }

    /// The tokens of `ids` as text, to compare with readable expectations.
    fn words(tok: &Tokenizer, ids: &[u32]) -> String {
        let words: Vec<String> = ids.iter().map(|&i| tok.id_to_token(i).unwrap()).collect();
        words.join(" ")
    }

    /// A fresh empty folder under the system's temp dir.
    fn temp_dir(name: &str) -> PathBuf {
        let name = format!("burn-mlx-llm-data-{}-{name}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Writes `text` as `dir/name`.
    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Qwen's ChatML layout, with `<|im_end|>` as EOS.
    fn chatml() -> ChatTemplate {
        let source = "{%- for message in messages %}<|im_start|>{{ message.role }}\n\
            {{ message.content }}<|im_end|>\n{%- endfor %}\
            {%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}";
        ChatTemplate::new(source, None, Some("<|im_end|>".into())).unwrap()
    }

    /// The `(line, message)` of a data error, checking that it names `path`.
    fn data_error<T: std::fmt::Debug>(result: Result<T>, path: &Path) -> (Option<usize>, String) {
        match result {
            Err(LlmError::Data {
                path: p,
                line,
                message,
            }) if p == path => (line, message),
            other => panic!("expected a data error about {path:?}, got {other:?}"),
        }
    }

    #[test]
    fn text_lines_get_bos_and_one_eos() {
        let (tok, dir) = (tokenizer(), temp_dir("text"));
        let text = "{\"text\": \"hello world\"}\n\n{\"text\": \"hi <|endoftext|>\"}\n";
        let path = write(&dir, "train.jsonl", text);
        let (format, ex) = load_jsonl(&path, &tok, None).unwrap();
        assert_eq!(format, Format::Text);
        assert_eq!(words(&tok, &ex[0].tokens), "<s> hello world <|endoftext|>");
        assert_eq!(words(&tok, &ex[1].tokens), "<s> hi <|endoftext|>");
        assert!(ex.iter().all(|e| e.prompt_len == 0));
        // With a template, its `eos_token` is the one appended.
        let (_, ex) = load_jsonl(&path, &tok, Some(&chatml())).unwrap();
        assert_eq!(words(&tok, &ex[0].tokens), "<s> hello world <|im_end|>");
    }

    #[test]
    fn completions_without_template_concatenate() {
        let (tok, dir) = (tokenizer(), temp_dir("completion"));
        let line = r#"{"prompt": "what is", "completion": " two plus two"}"#;
        let (format, ex) = load_jsonl(&write(&dir, "valid.jsonl", line), &tok, None).unwrap();
        assert_eq!(format, Format::Completion);
        let want = "<s> what is two plus two <|endoftext|>";
        assert_eq!(
            (words(&tok, &ex[0].tokens).as_str(), ex[0].prompt_len),
            (want, 3)
        );
    }

    #[test]
    fn completions_with_template_count_prompt_and_generation_header() {
        let (tok, dir) = (tokenizer(), temp_dir("completion-template"));
        let line = r#"{"prompt": "what is two plus two", "completion": "four"}"#;
        let path = write(&dir, "train.jsonl", line);
        let (format, ex) = load_jsonl(&path, &tok, Some(&chatml())).unwrap();
        assert_eq!(format, Format::Completion);
        // No BOS from the tokenizer and no EOS appended: the template's text is taken as is.
        let want = "<|im_start|> user what is two plus two <|im_end|> \
                    <|im_start|> assistant four <|im_end|>";
        assert_eq!(words(&tok, &ex[0].tokens), want);
        assert_eq!(ex[0].prompt_len, 10);
    }

    #[test]
    fn chat_offsets_cover_all_messages_but_the_last() {
        let (tok, dir) = (tokenizer(), temp_dir("chat"));
        let text = r#"{"messages": [{"role": "system", "content": "be helpful"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "thanks"}]}"#;
        let path = write(&dir, "train.jsonl", text);
        let (format, ex) = load_jsonl(&path, &tok, Some(&chatml())).unwrap();
        assert_eq!(format, Format::Chat);
        let want = "<|im_start|> system be helpful <|im_end|> <|im_start|> user hi <|im_end|> \
                    <|im_start|> assistant hello <|im_end|>";
        assert_eq!(words(&tok, &ex[0].tokens), want);
        // The first two messages plus the generation header `<|im_start|> assistant`.
        assert_eq!(ex[0].prompt_len, 11);
        // The last turn is the user's: the head is rendered without a generation header.
        assert_eq!((ex[1].prompt_len, ex[1].tokens.len()), (8, 12));
    }

    #[test]
    fn template_string_methods_and_raise_exception() {
        let source = "{{ bos_token }}{%- for m in messages %}\
            {%- if m.role not in ['user', 'assistant'] %}\
            {{ raise_exception('bad role ' ~ m.role) }}{% endif %}\n\
            [{{ m.role.upper() }}] {{ m.content.strip() }}\
            {% if m.content.strip().startswith('hi') %} !{% endif %}\n\
            {% endfor %} {{ messages[0].content.split()|length }}";
        let t = ChatTemplate::new(source, Some("<s>".into()), None).unwrap();
        let messages = json!([{"role": "user", "content": "  hi there "},
                              {"role": "assistant", "content": "a b c"}]);
        // trim_blocks: the newline right after a block tag goes, as in transformers.
        let text = t.render(&messages, None, false).unwrap();
        assert_eq!(text, "<s>[USER] hi there ![ASSISTANT] a b c 2");
        let err = t.render(&json!([{"role": "tool", "content": "x"}]), None, false);
        assert!(err.unwrap_err().to_string().contains("bad role tool"));
        assert!(ChatTemplate::new("{% if %}", None, None).is_err());
        // Through a file: the failure names the file and the line.
        let (tok, dir) = (tokenizer(), temp_dir("raise"));
        let text = r#"{"messages": [{"role": "assistant", "content": "hello"}]}
{"messages": [{"role": "system", "content": "hi"}, {"role": "user", "content": "hi"}]}"#;
        let path = write(&dir, "train.jsonl", text);
        let (line, message) = data_error(load_jsonl(&path, &tok, Some(&t)), &path);
        assert_eq!(line, Some(2));
        assert!(message.contains("bad role system"), "{message}");
        // A lone message: `messages[0]` of the empty head fails, and nothing is prompt.
        let text = r#"{"messages": [{"role": "assistant", "content": "hello"}]}"#;
        let ex = &load_jsonl(&write(&dir, "valid.jsonl", text), &tok, Some(&t))
            .unwrap()
            .1[0];
        let want = "<s> [ <unk> ] hello <unk>";
        assert_eq!((words(&tok, &ex.tokens).as_str(), ex.prompt_len), (want, 0));
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let source = "{{ tools | tojson }}|{{ {'a': [1, 2.0], 'b': 'é<'} | tojson(indent=2) }}";
        let t = ChatTemplate::new(source, None, None).unwrap();
        // Keys stay in file order, as Python's json.loads keeps them.
        let tools = r#"[{"type": "function", "function": {"name": "f", "parameters": {}}}]"#;
        let tools: Value = serde_json::from_str(tools).unwrap();
        let text = t.render_values(Value::from(Vec::<Value>::new()), Some(tools), false);
        let want = r#"[{"type": "function", "function": {"name": "f", "parameters": {}}}]|{
  "a": [
    1,
    2.0
  ],
  "b": "é<"
}"#;
        assert_eq!(text.unwrap(), want);
    }

    #[test]
    fn template_from_model_dir() {
        let dir = temp_dir("model");
        assert!(ChatTemplate::from_model_dir(&dir).unwrap().is_none());
        let config = json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "<|im_end|>",
            "chat_template": [{"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}]
        });
        write(&dir, "tokenizer_config.json", &config.to_string());
        let t = ChatTemplate::from_model_dir(&dir).unwrap().unwrap();
        let text = t.render(&json!([{"role": "user", "content": "hello"}]), None, false);
        assert_eq!(
            (text.unwrap().as_str(), t.eos_token()),
            ("<s>hello", Some("<|im_end|>"))
        );
        let tok = tokenizer();
        assert_eq!(
            (eos_token_id(&tok, Some(&t)), eos_token_id(&tok, None)),
            (Some(4), Some(2))
        );
        // chat_template.jinja wins over the config.
        write(&dir, "chat_template.jinja", "J{{ eos_token }}");
        let t = ChatTemplate::from_model_dir(&dir).unwrap().unwrap();
        assert_eq!(t.render(&json!([]), None, false).unwrap(), "J<|im_end|>");
        std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
        let config = r#"{"chat_template": [{"name": "x", "template": ""}]}"#;
        write(&dir, "tokenizer_config.json", config);
        let err = ChatTemplate::from_model_dir(&dir).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer_config.json") && err.contains("`default`"),
            "{err}"
        );
    }

    #[test]
    fn bad_lines_name_file_line_and_keys() {
        let (tok, dir) = (tokenizer(), temp_dir("bad"));
        let cases = [
            ("{\"text\": \"hi\"}\n\n{\"prompt\": \"a\", \"completion\": \"b\"}", 3,
             "expected key `text` (the format of line 1), found keys `completion`, `prompt`"),
            ("{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"}", 2,
             "expected keys `prompt` and `completion` (the format of line 1), found keys `prompt`"),
            ("{\"text\": \"hi\"}\n{\"text\": \"hi\"", 2, "not valid JSON"),
            ("\n{\"text\": 5}", 2, "key `text` must be a string, found a number"),
            ("[1, 2]", 1, "expected a JSON object, found a list"),
            ("{\"input\": \"x\"}", 1, "or key `messages`; found keys `input`"),
            ("{\"messages\": [{\"content\": \"x\"}]}", 1, "`messages[0]` must be an object with a string"),
            ("{\"messages\": []}", 1, "must be a non-empty list, found an empty list"),
        ];
        for (text, want_line, want) in cases {
            let path = write(&dir, "train.jsonl", text);
            let (line, message) = data_error(load_jsonl(&path, &tok, Some(&chatml())), &path);
            assert_eq!(line, Some(want_line), "{message}");
            assert!(message.contains(want), "`{message}` lacks `{want}`");
        }
        let text = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
        let path = write(&dir, "train.jsonl", text);
        let (_, message) = data_error(load_jsonl(&path, &tok, None), &path);
        assert!(message.contains("needs a chat template"), "{message}");
        let path = write(&dir, "train.jsonl", "\n  \n");
        let want = (None, "the file holds no examples".to_string());
        assert_eq!(data_error(load_jsonl(&path, &tok, None), &path), want);
    }

    #[test]
    fn load_dir_requires_train_and_valid() {
        let (tok, dir) = (tokenizer(), temp_dir("dir"));
        write(
            &dir,
            "train.jsonl",
            "{\"text\": \"hello\"}\n{\"text\": \"world\"}\n",
        );
        let (line, message) = data_error(load_dir(&dir, &tok, None), &dir);
        assert_eq!(line, None);
        assert!(
            message.contains("no valid.jsonl: a data folder must hold train.jsonl and valid.jsonl")
        );
        write(&dir, "valid.jsonl", "{\"text\": \"hi\"}");
        let splits = load_dir(&dir, &tok, None).unwrap();
        assert_eq!(
            (splits.train.len(), splits.valid.len(), splits.test),
            (2, 1, None)
        );
        let test = write(&dir, "test.jsonl", "");
        assert_eq!(data_error(load_dir(&dir, &tok, None), &test).0, None);
    }

    /// An example of `len` tokens all equal to `len` (so rows are recognizable).
    fn example(len: usize) -> Example {
        Example {
            tokens: vec![len as u32; len],
            prompt_len: 0,
        }
    }

    #[test]
    fn batches_sort_pad_and_truncate() {
        let ex: Vec<Example> = [70, 3, 40, 100, 5, 10, 200].map(example).to_vec();
        let batches = Batches::new(&ex, 2, 64, false, 0).unwrap();
        assert_eq!(
            (batches.len(), batches.dropped(), batches.truncated()),
            (3, 1, 2)
        );
        let all = batches.all();
        let shapes: Vec<_> = all
            .iter()
            .map(|b| (b.seq, b.lengths.clone(), b.truncated))
            .collect();
        assert_eq!(
            shapes,
            [
                (33, vec![3, 5], 0),
                (64, vec![10, 40], 0),
                (64, vec![64, 64], 2)
            ]
        );
        assert_eq!(all[0].tokens.len(), 2 * 33);
        assert_eq!(
            (&all[0].tokens[..4], &all[0].tokens[33..39]),
            (&[3, 3, 3, 0][..], &[5, 5, 5, 5, 5, 0][..])
        );
        assert_eq!(
            (&all[2].tokens[..64], &all[2].tokens[64..]),
            (&[70; 64][..], &[100; 64][..])
        );
        // A length that is a multiple of 32 still gets its extra column.
        let batches = Batches::new(&[example(32)], 1, 2048, false, 0).unwrap();
        assert_eq!(batches.all()[0].seq, 33);
    }

    #[test]
    fn targets_skip_the_first_token_and_masked_prompts() {
        let long = Example {
            tokens: vec![10, 11, 12, 13],
            prompt_len: 2,
        };
        let ex = [
            long,
            Example {
                tokens: vec![20, 21],
                prompt_len: 5,
            },
        ];
        let b = &Batches::new(&ex, 2, 64, false, 0).unwrap().all()[0];
        assert_eq!((b.offsets.as_slice(), b.num_targets()), (&[0, 0][..], 4));
        assert_eq!(b.targets(), [(0, 21), (33, 11), (34, 12), (35, 13)]);
        let b = &Batches::new(&ex, 2, 64, true, 0).unwrap().all()[0];
        assert_eq!((b.offsets.as_slice(), b.num_targets()), (&[2, 2][..], 2));
        assert_eq!(b.targets(), [(34, 12), (35, 13)]);
    }

    #[test]
    fn shuffle_is_seeded_and_covers_each_batch_per_epoch() {
        let ex: Vec<Example> = (1..=8).map(example).collect();
        let run = |seed| {
            let mut b = Batches::new(&ex, 1, 64, false, seed).unwrap();
            let lengths: Vec<usize> = (0..16).map(|_| b.next_batch().lengths[0]).collect();
            assert_eq!(b.epoch(), 1);
            lengths
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        assert_ne!(a[..8], a[8..], "each epoch is reshuffled");
        for epoch in a.chunks(8) {
            let mut seen = epoch.to_vec();
            seen.sort();
            assert_eq!(seen, (1..=8).collect::<Vec<_>>());
        }
        let all = Batches::new(&ex, 1, 64, false, 7).unwrap().all();
        assert_eq!(
            all.iter().map(|b| b.lengths[0]).collect::<Vec<_>>(),
            (1..=8).collect::<Vec<_>>()
        );
    }

    #[test]
    fn too_few_examples_for_a_batch() {
        let ex: Vec<Example> = (1..=3).map(example).collect();
        let err = Batches::new(&ex, 4, 64, false, 0)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("3 examples") && err.contains("batch size 4"),
            "{err}"
        );
    }
}
