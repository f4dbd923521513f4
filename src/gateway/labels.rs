//! Classification labels named in the config. Labels that in-process models carry (the
//! built-in classifier's, a repository model's `label_filename`) come from the backend
//! itself (`Backend::labels`), since repository models come and go.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::Config;
use crate::protocol::classify::parse_labels;

#[derive(Default)]
pub struct Labels {
    /// From config files: (model, output) → labels. Apply to every backend.
    configured: HashMap<(String, String), Arc<Vec<String>>>,
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
        Ok(Labels { configured })
    }

    /// Whether the config names a label file for this output.
    pub fn is_configured(&self, model: &str, output: &str) -> bool {
        self.configured
            .contains_key(&(model.to_string(), output.to_string()))
    }

    pub fn get(&self, model: &str, output: &str) -> Option<Arc<Vec<String>>> {
        self.configured
            .get(&(model.to_string(), output.to_string()))
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
