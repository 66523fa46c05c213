//! The bounds on the audiences one request may ask for.

use super::JwtError;

/// Checks the audiences of a JWT-SVID request: at least one (`audience must be specified`), at most
/// `max_count` (`limits.jwtAudiencesPerRequest`), none empty and none longer than `max_bytes`
/// (`limits.jwtAudienceBytes`). Duplicates are allowed; the token then lists the audience as asked.
pub fn check_audiences(
    audiences: &[String],
    max_count: usize,
    max_bytes: usize,
) -> Result<(), JwtError> {
    if audiences.is_empty() {
        return Err(JwtError::AudienceMissing);
    }
    if audiences.len() > max_count {
        return Err(JwtError::TooManyAudiences {
            count: audiences.len(),
            max: max_count,
        });
    }
    for (index, audience) in audiences.iter().enumerate() {
        if audience.is_empty() {
            return Err(JwtError::EmptyAudience { index });
        }
        if audience.len() > max_bytes {
            return Err(JwtError::AudienceTooLong {
                index,
                len: audience.len(),
                max: max_bytes,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn within_bounds_is_accepted() {
        check_audiences(&strings(&["a", "bb", "a"]), 3, 2).expect("within bounds");
    }

    #[test]
    fn no_audience_is_refused_with_the_workload_api_message() {
        let err = check_audiences(&[], 32, 1024).expect_err("refused");
        assert!(matches!(err, JwtError::AudienceMissing));
        assert_eq!(err.to_string(), "audience must be specified");
    }

    #[test]
    fn too_many_audiences_are_refused() {
        let err = check_audiences(&strings(&["a", "b", "c"]), 2, 1024).expect_err("refused");
        assert!(
            matches!(err, JwtError::TooManyAudiences { count: 3, max: 2 }),
            "{err:?}"
        );
        assert!(err.to_string().contains("limits.jwtAudiencesPerRequest"));
    }

    #[test]
    fn an_empty_or_long_audience_is_refused_by_position() {
        let err = check_audiences(&strings(&["a", ""]), 32, 1024).expect_err("refused");
        assert!(
            matches!(err, JwtError::EmptyAudience { index: 1 }),
            "{err:?}"
        );
        let err = check_audiences(&strings(&["a", "abcd"]), 32, 3).expect_err("refused");
        assert!(
            matches!(
                err,
                JwtError::AudienceTooLong {
                    index: 1,
                    len: 4,
                    max: 3
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("limits.jwtAudienceBytes"));
    }
}
