//! Kubernetes' name rules (RFC 1123), written once for every check of a name that arrives in a
//! configuration, a flag or a request.

/// A DNS label: 1 to 63 lowercase letters, digits and '-', starting and ending with a letter
/// or a digit (a namespace's name, a version).
pub fn is_dns_label(name: &str) -> bool {
    name.len() <= 63 && label_shaped(name)
}

/// A DNS subdomain: at most 253 characters of label-shaped parts joined by '.' (an API group,
/// a service account's or most objects' name, a label key's prefix). As the apiserver's
/// `IsDNS1123Subdomain`, a part is not held to a label's 63 characters.
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(label_shaped)
}

fn label_shaped(part: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    part.starts_with(alphanumeric)
        && part.ends_with(alphanumeric)
        && part.chars().all(|c| alphanumeric(c) || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains_as_kubernetes_checks_them() {
        for good in ["a", "kube-system", "x1", &"a".repeat(63)] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
        for good in [
            "apps",
            "example.switchyard.io",
            "greeting-switchyard-reconciler",
        ] {
            assert!(is_dns_subdomain(good), "{good}");
        }
        let long = vec!["a".repeat(63); 4].join(".");
        assert_eq!(long.len(), 255);
        for bad in ["", "a..b", ".a", "a.", "a.-b", "Apps", long.as_str()] {
            assert!(!is_dns_subdomain(bad), "{bad:?}");
        }
    }
}
