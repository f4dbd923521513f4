//! Triton's `config.pbtxt`: protobuf text format of `inference.ModelConfig`
//! (proto/model_config.proto), read with prost-reflect. What tensorgate honours is taken
//! out; every other field that is set is named in a warning, so that nobody believes a
//! setting (dynamic batching, say) is in effect when it is not.

use std::path::Path;
use std::sync::LazyLock;

use miette::Diagnostic;
use prost_reflect::{DescriptorPool, DynamicMessage, MapKey, ReflectMessage, Value};

use crate::protocol::TensorMetadata;

static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/model_config.fds")).as_ref())
        .expect("build.rs writes a valid descriptor set")
});

/// How many versions of a model are served (Triton's `version_policy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionPolicy {
    Latest(u32),
    All,
    Specific(Vec<i64>),
}

impl Default for VersionPolicy {
    /// Triton's default: the latest version only.
    fn default() -> Self {
        VersionPolicy::Latest(1)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct IoConfig {
    pub tensor: TensorMetadata,
    /// `reshape { shape }`: the tensor's shape in the model (after any batch dimension),
    /// where `dims` is the one clients see.
    pub reshape: Option<Vec<i64>>,
    /// Relative to the model's directory.
    pub label_filename: Option<String>,
}

/// The parts of a config.pbtxt that tensorgate honours.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelConfigFile {
    pub name: Option<String>,
    pub platform: Option<String>,
    pub backend: Option<String>,
    pub max_batch_size: u32,
    pub inputs: Vec<IoConfig>,
    pub outputs: Vec<IoConfig>,
    pub version_policy: VersionPolicy,
    /// The sum of the instance groups' counts; `None` when no group is given.
    pub instances: Option<usize>,
    /// Set fields that are not honoured, as paths (`dynamic_batching`,
    /// `input[0].allow_ragged_batch`).
    pub ignored: Vec<String>,
}

const TOP: &[&str] = &[
    "name",
    "platform",
    "backend",
    "max_batch_size",
    "input",
    "output",
    "version_policy",
    "instance_group",
];
const INPUT: &[&str] = &["name", "data_type", "dims", "reshape"];
const OUTPUT: &[&str] = &["name", "data_type", "dims", "reshape", "label_filename"];
const INSTANCE_GROUP: &[&str] = &["name", "count", "kind"];

/// What is wrong with a config.pbtxt, and where when the parser knows.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub line: Option<usize>,
    pub message: String,
}

impl From<String> for ConfigError {
    fn from(message: String) -> Self {
        ConfigError {
            line: None,
            message,
        }
    }
}

/// The largest config.pbtxt read (Triton's own are a few kilobytes).
const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Reads `path`. Errors name the file and, for syntax, the line.
pub fn read(path: &Path) -> Result<ModelConfigFile, String> {
    let text = super::read_small_file(path, MAX_CONFIG_BYTES)?;
    parse(&text).map_err(|e| match e.line {
        Some(line) => format!("{}:{line}: {}", path.display(), e.message),
        None => format!("{}: {}", path.display(), e.message),
    })
}

/// Parses config.pbtxt text.
pub fn parse(text: &str) -> Result<ModelConfigFile, ConfigError> {
    let desc = POOL
        .get_message_by_name("inference.ModelConfig")
        .expect("model_config.proto defines inference.ModelConfig");
    // Editors on Windows start files with a byte-order mark, which the text format lacks.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let text = &colon_before_lists(text);
    let msg = DynamicMessage::parse_text_format(desc, text).map_err(|e| {
        let line = e
            .labels()
            .and_then(|mut labels| labels.next())
            .map(|l| text[..l.offset().min(text.len())].matches('\n').count() + 1);
        ConfigError {
            line,
            message: e.to_string(),
        }
    })?;
    let mut config = ModelConfigFile::default();
    ignored_fields(&msg, TOP, "", &mut config.ignored);
    config.name = string(&msg, "name");
    config.platform = string(&msg, "platform");
    config.backend = string(&msg, "backend");
    let max_batch_size = msg
        .get_field_by_name("max_batch_size")
        .and_then(|v| v.as_i32())
        .unwrap_or(0);
    config.max_batch_size = u32::try_from(max_batch_size)
        .map_err(|_| format!("max_batch_size must not be negative, not {max_batch_size}"))?;
    for (list, allowed, role) in [("input", INPUT, "input"), ("output", OUTPUT, "output")] {
        for (i, item) in messages(&msg, list).iter().enumerate() {
            ignored_fields(item, allowed, &format!("{list}[{i}]."), &mut config.ignored);
            let io = io_config(item, role, i)?;
            if role == "input" {
                config.inputs.push(io);
            } else {
                config.outputs.push(io);
            }
        }
    }
    let groups = messages(&msg, "instance_group");
    let mut instances = 0usize;
    for (i, g) in groups.iter().enumerate() {
        ignored_fields(
            g,
            INSTANCE_GROUP,
            &format!("instance_group[{i}]."),
            &mut config.ignored,
        );
        if let Some(kind) = enum_name(g, "kind") {
            if !matches!(kind.as_str(), "KIND_AUTO" | "KIND_CPU") {
                config.ignored.push(format!(
                    "instance_group[{i}].kind ({kind}: runs on the CPU)"
                ));
            }
        }
        // Unset is Triton's default of 1; a count set to 0 or less is refused, as Triton
        // refuses it, rather than read as 1.
        let count = match g.get_field_by_name("count").and_then(|v| v.as_i32()) {
            Some(count) if g.has_field_by_name("count") => count,
            _ => 1,
        };
        if count < 1 {
            return Err(
                format!("instance_group[{i}].count must be at least 1, not {count}").into(),
            );
        }
        instances += count as usize;
    }
    if !groups.is_empty() {
        config.instances = Some(instances);
    }
    if let Some(policy) = msg
        .get_field_by_name("version_policy")
        .and_then(|v| v.as_message().cloned())
    {
        config.version_policy = version_policy(&policy)?;
    }
    Ok(config)
}

/// `input [ { ... } ]`: the text format lets the colon before a list of messages out, and
/// Triton's configs mostly do, but prost-reflect's parser requires it. This puts it back:
/// a `[` right after a field name (outside strings and comments) gets a `:` first. Nothing
/// else changes, so line numbers stay true.
fn colon_before_lists(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut comment = false;
    let mut last_significant = ' ';
    for c in text.chars() {
        if comment {
            comment = c != '\n';
        } else if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
        } else if c == '#' {
            comment = true;
        } else if c == '"' || c == '\'' {
            quote = Some(c);
        } else if c == '[' && (last_significant.is_ascii_alphanumeric() || last_significant == '_')
        {
            out.push(':');
        }
        out.push(c);
        if !comment && !c.is_whitespace() {
            last_significant = c;
        }
    }
    out
}

fn version_policy(policy: &DynamicMessage) -> Result<VersionPolicy, String> {
    if let Some(latest) = policy
        .get_field_by_name("latest")
        .filter(|_| policy.has_field_by_name("latest"))
    {
        let latest = latest.as_message();
        let n = match latest.filter(|m| m.has_field_by_name("num_versions")) {
            Some(m) => m
                .get_field_by_name("num_versions")
                .and_then(|v| v.as_u32())
                .unwrap_or(0),
            None => 1,
        };
        if n == 0 {
            return Err("version_policy.latest.num_versions must be at least 1, not 0".to_string());
        }
        return Ok(VersionPolicy::Latest(n));
    }
    if policy.has_field_by_name("all") {
        return Ok(VersionPolicy::All);
    }
    if let Some(specific) = policy
        .get_field_by_name("specific")
        .filter(|_| policy.has_field_by_name("specific"))
    {
        let versions = specific
            .as_message()
            .and_then(|m| m.get_field_by_name("versions"))
            .and_then(|v| {
                v.as_list()
                    .map(|l| l.iter().filter_map(Value::as_i64).collect())
            })
            .unwrap_or_default();
        return Ok(VersionPolicy::Specific(versions));
    }
    Ok(VersionPolicy::default())
}

fn io_config(item: &DynamicMessage, role: &str, i: usize) -> Result<IoConfig, String> {
    let name = string(item, "name").ok_or_else(|| format!("{role}[{i}] has no name"))?;
    let data_type = enum_name(item, "data_type").unwrap_or_else(|| "TYPE_INVALID".into());
    let datatype = v2_datatype(&data_type)
        .ok_or_else(|| format!("{role} '{name}': data_type {data_type} has no v2 datatype"))?;
    let ints = |msg: &DynamicMessage, field: &str| -> Vec<i64> {
        msg.get_field_by_name(field)
            .and_then(|v| {
                v.as_list()
                    .map(|l| l.iter().filter_map(Value::as_i64).collect())
            })
            .unwrap_or_default()
    };
    let shape = ints(item, "dims");
    // Present even when empty: `reshape: { shape: [ ] }` makes a scalar of each batch item.
    let reshape = item
        .has_field_by_name("reshape")
        .then(|| item.get_field_by_name("reshape"))
        .flatten()
        .and_then(|v| v.as_message().map(|m| ints(m, "shape")));
    Ok(IoConfig {
        tensor: TensorMetadata {
            name,
            datatype: datatype.into(),
            shape,
        },
        reshape,
        label_filename: string(item, "label_filename"),
    })
}

/// Triton's `TYPE_*` as a v2 datatype.
pub fn v2_datatype(type_name: &str) -> Option<&'static str> {
    Some(match type_name {
        "TYPE_BOOL" => "BOOL",
        "TYPE_UINT8" => "UINT8",
        "TYPE_UINT16" => "UINT16",
        "TYPE_UINT32" => "UINT32",
        "TYPE_UINT64" => "UINT64",
        "TYPE_INT8" => "INT8",
        "TYPE_INT16" => "INT16",
        "TYPE_INT32" => "INT32",
        "TYPE_INT64" => "INT64",
        "TYPE_FP16" => "FP16",
        "TYPE_FP32" => "FP32",
        "TYPE_FP64" => "FP64",
        "TYPE_STRING" => "BYTES",
        "TYPE_BF16" => "BF16",
        _ => return None,
    })
}

fn string(msg: &DynamicMessage, field: &str) -> Option<String> {
    msg.get_field_by_name(field)
        .and_then(|v| v.as_str().map(str::to_string))
        .filter(|s| !s.is_empty())
}

fn enum_name(msg: &DynamicMessage, field: &str) -> Option<String> {
    let number = msg.get_field_by_name(field)?.as_enum_number()?;
    let desc = msg.descriptor().get_field_by_name(field)?;
    let kind = desc.kind();
    let e = kind.as_enum()?;
    Some(
        e.get_value(number)
            .map(|v| v.name().to_string())
            .unwrap_or_else(|| number.to_string()),
    )
}

fn messages(msg: &DynamicMessage, field: &str) -> Vec<DynamicMessage> {
    msg.get_field_by_name(field)
        .and_then(|v| {
            v.as_list()
                .map(|l| l.iter().filter_map(|m| m.as_message().cloned()).collect())
        })
        .unwrap_or_default()
}

/// The set fields of `msg` outside `allowed`, as `prefix` + name (map keys included).
fn ignored_fields(msg: &DynamicMessage, allowed: &[&str], prefix: &str, out: &mut Vec<String>) {
    for (field, value) in msg.fields() {
        if allowed.contains(&field.name()) {
            continue;
        }
        match value {
            Value::Map(map) => {
                let mut keys: Vec<String> = map
                    .keys()
                    .map(|k| match k {
                        MapKey::String(s) => s.clone(),
                        other => format!("{other:?}"),
                    })
                    .collect();
                keys.sort();
                out.push(format!("{prefix}{} {{{}}}", field.name(), keys.join(", ")));
            }
            _ => out.push(format!("{prefix}{}", field.name())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn honoured_fields_are_read_and_the_others_named() {
        let c = parse(
            r#"
name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "PROBS" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" } ]
instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_GPU } ]
version_policy: { latest { num_versions: 2 } }
dynamic_batching { preferred_batch_size: [ 4, 8 ] }
parameters { key: "b" value: { string_value: "y" } }
parameters { key: "a" value: { string_value: "x" } }
"#,
        )
        .unwrap();
        assert_eq!(c.name.as_deref(), Some("mlp"));
        assert_eq!(c.max_batch_size, 8);
        assert_eq!(c.inputs[0].tensor.datatype, "FP32");
        assert_eq!(c.inputs[0].tensor.shape, vec![16]);
        assert_eq!(c.outputs[0].label_filename.as_deref(), Some("labels.txt"));
        assert_eq!(c.instances, Some(3));
        assert_eq!(c.version_policy, VersionPolicy::Latest(2));
        assert_eq!(
            c.ignored,
            [
                "dynamic_batching",
                "parameters {a, b}",
                "instance_group[1].kind (KIND_GPU: runs on the CPU)"
            ]
        );
    }

    #[test]
    fn lists_of_messages_may_leave_the_colon_out() {
        assert_eq!(
            colon_before_lists(
                "input [ { dims: [ 1 ] } ]\n# a [comment]\nname: \"a[b\"\noutput: [ ]"
            ),
            "input :[ { dims: [ 1 ] } ]\n# a [comment]\nname: \"a[b\"\noutput: [ ]"
        );
    }

    /// Realistic configs (tests/fixtures/pbtxt) parse, and what is not honoured is named.
    #[test]
    fn triton_configs_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pbtxt");
        let mut read_any = false;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let c = read(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(c.name.is_some(), "{}", path.display());
            read_any = true;
        }
        assert!(read_any);
        let tuned = read(&dir.join("tuned_onnx.pbtxt")).unwrap();
        assert_eq!(tuned.version_policy, VersionPolicy::Specific(vec![1, 3]));
        assert_eq!(tuned.instances, Some(3));
        assert_eq!(tuned.max_batch_size, 32);
        assert_eq!(tuned.inputs[1].tensor.shape, vec![128]);
        for ignored in [
            "input[1].optional",
            "instance_group[0].rate_limiter",
            "instance_group[1].gpus",
            "instance_group[1].kind (KIND_GPU: runs on the CPU)",
            "parameters {intra_op_thread_count, x}",
            "optimization",
        ] {
            assert!(
                tuned.ignored.iter().any(|i| i == ignored),
                "{ignored} not in {:?}",
                tuned.ignored
            );
        }
    }

    /// Zero instances or versions is refused, as Triton refuses it, not read as one; a
    /// byte-order mark is not a syntax error.
    #[test]
    fn zero_counts_are_refused_and_a_bom_is_skipped() {
        let e = |text: &str| parse(text).unwrap_err().message;
        assert_eq!(
            e("instance_group [ { count: 2 }, { count: 0 } ]"),
            "instance_group[1].count must be at least 1, not 0"
        );
        assert_eq!(
            e("version_policy: { latest { num_versions: 0 } }"),
            "version_policy.latest.num_versions must be at least 1, not 0"
        );
        assert_eq!(parse("instance_group [ { } ]").unwrap().instances, Some(1));
        assert_eq!(
            parse("version_policy: { latest { } }")
                .unwrap()
                .version_policy,
            VersionPolicy::Latest(1)
        );
        let bom = parse("\u{feff}name: \"m\"\nmax_batch_size: 4\n").unwrap();
        assert_eq!((bom.name.as_deref(), bom.max_batch_size), (Some("m"), 4));
    }

    #[test]
    fn policies_and_defaults() {
        assert_eq!(parse("").unwrap().version_policy, VersionPolicy::Latest(1));
        assert_eq!(parse("").unwrap().instances, None);
        assert_eq!(
            parse("version_policy: { all { } }").unwrap().version_policy,
            VersionPolicy::All
        );
        assert_eq!(
            parse("version_policy: { specific { versions: [1, 3] } }")
                .unwrap()
                .version_policy,
            VersionPolicy::Specific(vec![1, 3])
        );
    }

    /// `reshape` is honoured, an empty shape (a scalar per batch item) included, and told
    /// apart from no reshape at all.
    #[test]
    fn reshape_is_read_when_present() {
        let config = parse(
            "input [ { name: \"A\" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } },\n\
             { name: \"B\" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } },\n\
             { name: \"C\" data_type: TYPE_FP32 dims: [ 4 ] } ]",
        )
        .unwrap();
        let reshapes: Vec<_> = config.inputs.iter().map(|i| i.reshape.clone()).collect();
        assert_eq!(reshapes, [Some(vec![]), Some(vec![2, 2]), None]);
        assert_eq!(config.ignored, Vec::<String>::new());
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse("name: \"m\"\nmax_batch_size: 1\nbogus_field: 3\n").unwrap_err();
        assert_eq!(e.line, Some(3));
        assert_eq!(
            e.message,
            "field 'bogus_field' not found for message 'inference.ModelConfig'"
        );
        assert_eq!(
            parse("input [ { data_type: TYPE_FP32 } ]").unwrap_err(),
            ConfigError::from("input[0] has no name".to_string())
        );
        assert_eq!(
            parse("max_batch_size: -1").unwrap_err().message,
            "max_batch_size must not be negative, not -1"
        );
    }
}
