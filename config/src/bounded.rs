//! Bounds on reading the operator's files (files themselves are read through `meshca_files`: only
//! regular files, never more than a limit, never blocking on a FIFO or a device); and YAML that nests
//! no deeper than a limit, checked before the parser sees it (its cost grows with the square of the
//! depth).

/// Bounds on reading the resources directory (the `limits:` settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadLimits {
    /// The largest resource file, in bytes.
    pub file_bytes: u64,
    /// The most resource files read.
    pub files: usize,
    /// How deeply a document may nest.
    pub depth: usize,
    /// The largest certificate or key a data source may hold, in bytes.
    pub data_source_bytes: u64,
}

impl Default for LoadLimits {
    fn default() -> Self {
        crate::Limits::default().load()
    }
}

impl crate::Limits {
    /// The limits on reading resource files and data sources.
    pub fn load(&self) -> LoadLimits {
        LoadLimits {
            file_bytes: self.resource_file_bytes,
            files: usize::try_from(self.resource_files).unwrap_or(usize::MAX),
            depth: usize::try_from(self.yaml_depth).unwrap_or(usize::MAX),
            data_source_bytes: self.data_source_bytes,
        }
    }
}

/// An upper bound of how deeply the YAML in `text` nests: block levels (by indentation and `- `
/// sequence entries) plus flow levels (`{`, `[`), counted without parsing. Brackets inside quoted
/// strings or comments are counted too, so the bound is never below the real depth.
pub(crate) fn nesting_depth(text: &str) -> usize {
    let mut deepest = 0;
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    for line in text.lines() {
        let content = line.trim_start_matches(' ');
        let indent = line.len() - content.len();
        let blank = content.is_empty() || content.starts_with('#');
        if flow == 0 && !blank {
            while indents.last().is_some_and(|&top| top > indent) {
                indents.pop();
            }
            if indents.last() != Some(&indent) {
                indents.push(indent);
            }
        }
        let mut rest = content;
        let mut entries = 0;
        while let Some(after) = rest.strip_prefix("- ") {
            entries += 1;
            rest = after.trim_start_matches(' ');
        }
        let mut line_deepest = flow;
        for byte in rest.bytes() {
            match byte {
                b'{' | b'[' => {
                    flow += 1;
                    line_deepest = line_deepest.max(flow);
                }
                b'}' | b']' => flow = flow.saturating_sub(1),
                _ => {}
            }
        }
        deepest = deepest.max(indents.len() + entries + line_deepest);
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn depth_of_block_flow_and_mixed_yaml() {
        assert_eq!(nesting_depth(""), 0);
        assert_eq!(nesting_depth("a: 1\nb: 2\n"), 1);
        assert_eq!(nesting_depth("a:\n  b:\n    c: 1\nd: 2\n"), 3);
        assert_eq!(nesting_depth("a: {b: {c: [1, 2]}}\n"), 4);
        assert_eq!(nesting_depth("a:\n  - - x\n"), 4);
        let deep = format!("{}{}", "{a: ".repeat(50_000), "}".repeat(50_000));
        assert_eq!(
            nesting_depth(&deep),
            50_001,
            "the document level and every brace"
        );
    }

    #[test]
    fn a_kuma_resource_is_shallow() {
        let mesh = crate::default_resources_yaml();
        assert!(nesting_depth(mesh) < 16, "{}", nesting_depth(mesh));
    }

    proptest! {
        /// The pre-scan never reports less than the real depth of a flow document.
        #[test]
        fn never_below_the_real_flow_depth(depth in 0usize..40, noise in "[a-z :,]{0,20}") {
            let text = format!("{}{noise}{}", "[".repeat(depth), "]".repeat(depth));
            prop_assert!(nesting_depth(&text) >= depth);
        }
    }
}
