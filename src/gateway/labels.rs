//! Classification labels: files named in the config, and labels built-in models carry.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::Config;
use crate::models::{builtin_models, BuiltinSettings};
use crate::protocol::classify::parse_labels;

#[derive(Default)]
pub struct Labels {
    /// From config files: (model, output) → labels. Apply to every backend.
    configured: HashMap<(String, String), Arc<Vec<String>>>,
    /// Carried by built-in models. Apply only when the model runs in-process, since an
    /// external model of the same name is a different model.
    builtin: HashMap<(String, String), Arc<Vec<String>>>,
}

impl Labels {
    pub fn load(config: &Config) -> Result<Labels, String> {
        let mut configured = HashMap::new();
        for (model, mc) in &config.models {
            for (output, path) in &mc.labels {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    format!(
                        "cannot read the labels of model '{model}' output '{output}' from {}: {e}",
                        path.display()
                    )
                })?;
                configured.insert(
                    (model.clone(), output.clone()),
                    Arc::new(parse_labels(&text)),
                );
            }
        }
        let mut builtin = HashMap::new();
        for (name, m) in builtin_models(&[], &BuiltinSettings::default())? {
            for o in &m.metadata().outputs {
                if let Some(l) = m.labels(&o.name) {
                    builtin.insert((name.clone(), o.name.clone()), Arc::new(l));
                }
            }
        }
        Ok(Labels {
            configured,
            builtin,
        })
    }

    /// Whether the config names a label file for this output.
    pub fn is_configured(&self, model: &str, output: &str) -> bool {
        self.configured
            .contains_key(&(model.to_string(), output.to_string()))
    }

    pub fn get(&self, model: &str, output: &str, in_process: bool) -> Option<Arc<Vec<String>>> {
        let key = (model.to_string(), output.to_string());
        self.configured
            .get(&key)
            .or_else(|| in_process.then(|| self.builtin.get(&key)).flatten())
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_label_per_line() {
        assert_eq!(parse_labels("a\r\n\nc\n"), vec!["a", "", "c"]);
    }

    #[test]
    fn builtin_labels_only_in_process() {
        let l = Labels::load(&Config::worker("127.0.0.1:0".parse().unwrap(), &[])).unwrap();
        assert_eq!(l.get("classifier", "OUTPUT0", true).unwrap()[3], "cat");
        assert!(l.get("classifier", "OUTPUT0", false).is_none());
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let mut c = Config::worker("127.0.0.1:0".parse().unwrap(), &[]);
        c.models
            .entry("m".into())
            .or_default()
            .labels
            .insert("OUT".into(), "/nonexistent/labels.txt".into());
        let e = Labels::load(&c).err().unwrap();
        assert!(
            e.starts_with(
                "cannot read the labels of model 'm' output 'OUT' from /nonexistent/labels.txt:"
            ),
            "{e}"
        );
    }
}
