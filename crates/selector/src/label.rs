//! Label keys and values, checked as the apiserver checks them (`validation.IsQualifiedName`
//! for a key, `validation.IsValidLabelValue` for a value).
//!
//! ```text
//!  key   = [prefix "/"] name      prefix: a DNS subdomain, 1 to 253 characters
//!  name  = 1 to 63 of [A-Za-z0-9-_.], beginning and ending with [A-Za-z0-9]
//!  value = "" or a name
//! ```

/// The longest name (the part of a key after the prefix) and the longest value: the
/// apiserver's `qualifiedNameMaxLength` and `LabelValueMaxLength`.
pub const MAX_NAME_LENGTH: usize = 63;
/// The longest key prefix: a DNS subdomain (`DNS1123SubdomainMaxLength`).
pub const MAX_PREFIX_LENGTH: usize = 253;

/// A key or value the apiserver would refuse, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("label key {key:?}: {reason}")]
    Key { key: String, reason: Reason },
    #[error("label value {value:?}: {reason}")]
    Value { value: String, reason: Reason },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    #[error("the name must not be empty")]
    EmptyName,
    #[error("{0} characters, at most {max} allowed", max = MAX_NAME_LENGTH)]
    TooLong(usize),
    #[error("character {0:?} not allowed (letters, digits, '-', '_' and '.')")]
    Character(char),
    #[error("must begin and end with a letter or digit")]
    Ends,
    #[error("more than one '/' (a key is an optional prefix and '/', then a name)")]
    Slashes,
    #[error("the prefix must be 1 to {max} characters", max = MAX_PREFIX_LENGTH)]
    PrefixLength,
    #[error(
        "the prefix is not a DNS subdomain (lowercase letters, digits, '-' and '.', each \
         dot-separated part beginning and ending with a letter or digit)"
    )]
    Prefix,
}

/// Checks a label key: an optional DNS-subdomain prefix and `/`, then a name.
pub fn validate_key(key: &str) -> Result<(), LabelError> {
    let invalid = |reason| LabelError::Key {
        key: key.to_owned(),
        reason,
    };
    let name = match key.split_once('/') {
        None => key,
        Some((_, name)) if name.contains('/') => return Err(invalid(Reason::Slashes)),
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > MAX_PREFIX_LENGTH {
                return Err(invalid(Reason::PrefixLength));
            }
            if !crate::names::is_dns_subdomain(prefix) {
                return Err(invalid(Reason::Prefix));
            }
            name
        }
    };
    if name.is_empty() {
        return Err(invalid(Reason::EmptyName));
    }
    check_name(name).map_err(invalid)
}

/// Checks a label value: empty, or a name.
pub fn validate_value(value: &str) -> Result<(), LabelError> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value).map_err(|reason| LabelError::Value {
        value: value.to_owned(),
        reason,
    })
}

/// A non-empty name: at most [`MAX_NAME_LENGTH`] of `[A-Za-z0-9-_.]`, alphanumeric at both
/// ends.
fn check_name(name: &str) -> Result<(), Reason> {
    if name.len() > MAX_NAME_LENGTH {
        return Err(Reason::TooLong(name.len()));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(Reason::Character(c));
    }
    let alphanumeric = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alphanumeric(name.chars().next()) || !alphanumeric(name.chars().next_back()) {
        return Err(Reason::Ends);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_reason(key: &str) -> Reason {
        match validate_key(key) {
            Err(LabelError::Key { key: named, reason }) => {
                assert_eq!(named, key);
                reason
            }
            other => panic!("{key:?}: expected a key error, got {other:?}"),
        }
    }

    fn value_reason(value: &str) -> Reason {
        match validate_value(value) {
            Err(LabelError::Value {
                value: named,
                reason,
            }) => {
                assert_eq!(named, value);
                reason
            }
            other => panic!("{value:?}: expected a value error, got {other:?}"),
        }
    }

    #[test]
    fn keys_the_apiserver_accepts() {
        for key in [
            "app",
            "a",
            "App_1.x-y",
            "example.com/tier",
            "kubernetes.io/metadata.name",
            "a-1.b-2/X",
            &"k".repeat(MAX_NAME_LENGTH),
            &format!("{}/n", "p".repeat(MAX_PREFIX_LENGTH)),
        ] {
            assert_eq!(validate_key(key), Ok(()), "{key:?}");
        }
    }

    #[test]
    fn keys_the_apiserver_refuses_say_why() {
        assert_eq!(key_reason(""), Reason::EmptyName);
        assert_eq!(key_reason("example.com/"), Reason::EmptyName);
        assert_eq!(key_reason("/x"), Reason::PrefixLength);
        assert_eq!(
            key_reason(&format!("{}/n", "p".repeat(MAX_PREFIX_LENGTH + 1))),
            Reason::PrefixLength
        );
        assert_eq!(key_reason("Bad_Prefix/x"), Reason::Prefix);
        assert_eq!(key_reason("a..b/x"), Reason::Prefix);
        assert_eq!(key_reason("-a.b/x"), Reason::Prefix);
        assert_eq!(key_reason("a/b/c"), Reason::Slashes);
        assert_eq!(key_reason("bad key"), Reason::Character(' '));
        assert_eq!(key_reason("a=b"), Reason::Character('='));
        assert_eq!(key_reason("-app"), Reason::Ends);
        assert_eq!(key_reason("app."), Reason::Ends);
        assert_eq!(
            key_reason(&"k".repeat(MAX_NAME_LENGTH + 1)),
            Reason::TooLong(64)
        );
    }

    #[test]
    fn values_may_be_empty_else_are_names() {
        for value in ["", "web", "1", "a.b_c-d", &"v".repeat(MAX_NAME_LENGTH)] {
            assert_eq!(validate_value(value), Ok(()), "{value:?}");
        }
        assert_eq!(value_reason("we b"), Reason::Character(' '));
        assert_eq!(value_reason("a/b"), Reason::Character('/'));
        assert_eq!(value_reason("é"), Reason::Character('é'));
        assert_eq!(value_reason("-bad-"), Reason::Ends);
        assert_eq!(value_reason(&"v".repeat(64)), Reason::TooLong(64));
    }

    #[test]
    fn errors_name_the_key_or_value_and_the_limit() {
        assert_eq!(
            validate_value(&"a".repeat(64)).unwrap_err().to_string(),
            format!(
                "label value {:?}: 64 characters, at most 63 allowed",
                "a".repeat(64)
            )
        );
        assert_eq!(
            validate_key("/x").unwrap_err().to_string(),
            "label key \"/x\": the prefix must be 1 to 253 characters"
        );
    }
}
