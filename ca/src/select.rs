//! Which MeshIdentity selects a dataplane (docs/certificates.md, "Which identity a dataplane gets").

use std::collections::BTreeMap;

use meshca_identity::LabelMap;

/// Picks the candidate that selects a dataplane with `labels`.
///
/// Each candidate is `(name, matchLabels, value)`; `None` as matchLabels is a selector that matches
/// nothing, `Some({})` matches everything. Among the candidates whose matchLabels all equal the
/// dataplane's labels, the one with the most matchLabels wins; a tie goes to the lexicographically
/// smallest name. The result does not depend on the order of the candidates (for distinct names).
pub fn select<'a, T>(
    candidates: impl IntoIterator<Item = (&'a str, Option<&'a BTreeMap<String, String>>, T)>,
    labels: &LabelMap,
) -> Option<T> {
    let mut best: Option<(usize, &'a str, T)> = None;
    for (name, match_labels, value) in candidates {
        let Some(match_labels) = match_labels else {
            continue;
        };
        let matches = match_labels
            .iter()
            .all(|(k, v)| labels.get(k).is_some_and(|have| have == v));
        if !matches {
            continue;
        }
        let score = match_labels.len();
        let better = match &best {
            None => true,
            Some((best_score, best_name, _)) => {
                score > *best_score || (score == *best_score && name < *best_name)
            }
        };
        if better {
            best = Some((score, name, value));
        }
    }
    best.map(|(_, _, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn most_specific_match_wins_then_smallest_name() {
        let dp = map(&[("app", "web"), ("version", "v2"), ("zone", "z1")]);
        let all = map(&[]);
        let app = map(&[("app", "web")]);
        let app_version = map(&[("app", "web"), ("version", "v2")]);
        let app_zone = map(&[("app", "web"), ("zone", "z1")]);
        let other = map(&[("app", "db"), ("version", "v2"), ("zone", "z1")]);

        let candidates = vec![
            ("catch-all", Some(&all), 1),
            ("by-app", Some(&app), 2),
            ("z-app-version", Some(&app_version), 3),
            ("a-app-zone", Some(&app_zone), 4),
            ("other", Some(&other), 5),
            ("nothing", None, 6),
        ];
        assert_eq!(
            select(candidates.clone(), &LabelMap::from(dp.clone())),
            Some(4)
        );
        assert_eq!(
            select(candidates[..3].to_vec(), &LabelMap::from(dp.clone())),
            Some(3)
        );
        assert_eq!(
            select(candidates[..2].to_vec(), &LabelMap::from(dp.clone())),
            Some(2)
        );
        assert_eq!(
            select(candidates[..1].to_vec(), &LabelMap::from(dp.clone())),
            Some(1)
        );
        assert_eq!(
            select(candidates[4..].to_vec(), &LabelMap::from(dp.clone())),
            None
        );
        // `matchLabels: {}` matches a dataplane without labels; `selector: {}` never matches.
        assert_eq!(
            select(vec![("x", Some(&all), 1)], &LabelMap::new()),
            Some(1)
        );
        assert_eq!(select(vec![("x", None, 1)], &LabelMap::new()), None::<i32>);
        // A label with a different value does not match.
        assert_eq!(
            select(
                vec![("x", Some(&map(&[("app", "api")])), 1)],
                &LabelMap::from(dp.clone())
            ),
            None
        );
    }

    type Candidate<'a> = (&'a str, Option<&'a BTreeMap<String, String>>, usize);

    fn label_map() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map("[abc]", "[xy]", 0..3)
    }

    proptest! {
        #[test]
        fn result_is_independent_of_candidate_order(
            selectors in proptest::collection::vec(proptest::option::weighted(0.8, label_map()), 0..8),
            dataplane in label_map(),
            seed in any::<u64>(),
        ) {
            let names: Vec<String> = (0..selectors.len()).map(|i| format!("id-{}", (i * 7) % 11)).collect();
            let mut candidates: Vec<Candidate<'_>> = names
                .iter()
                .zip(&selectors)
                .enumerate()
                .map(|(i, (n, s))| (n.as_str(), s.as_ref(), i))
                .collect();
            // Names are distinct for fewer than 11 candidates.
            let forward = select(candidates.clone(), &LabelMap::from(dataplane.clone()));
            candidates.reverse();
            let reversed = select(candidates.clone(), &LabelMap::from(dataplane.clone()));
            let len = candidates.len().max(1);
            candidates.rotate_left((seed as usize) % len);
            let rotated = select(candidates, &LabelMap::from(dataplane.clone()));
            prop_assert_eq!(forward, reversed);
            prop_assert_eq!(forward, rotated);
        }
    }
}
