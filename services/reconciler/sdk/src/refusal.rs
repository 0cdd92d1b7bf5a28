//! What an apiserver refusal was, asked of the error itself, as client-go's
//! `apierrors.IsNotFound` and its siblings answer it: by the Status's reason, or by the HTTP
//! code when the reason is not one the apiserver defines (a path the apiserver does not
//! serve answers a plain-text 404, which client-go counts as `NotFound` as well).

use switchyard_k8s::kube;

/// The reasons `metav1.StatusReason` defines (`StatusReasonUnknown`, empty, is not one).
const KNOWN_REASONS: [&str; 18] = [
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "Gone",
    "Invalid",
    "ServerTimeout",
    "StoreReadError",
    "Timeout",
    "TooManyRequests",
    "BadRequest",
    "MethodNotAllowed",
    "NotAcceptable",
    "RequestEntityTooLarge",
    "UnsupportedMediaType",
    "InternalError",
    "Expired",
];

/// The apiserver's refusals a controller tells apart, on `kube::Error`.
pub trait Refusal {
    /// 404 `NotFound`: the object, or the resource, is not there.
    fn is_not_found(&self) -> bool;
    /// 409 `Conflict`: a write based on a stale read, or a failed precondition.
    fn is_conflict(&self) -> bool;
    /// 409 `AlreadyExists`: a creation of a name that is taken.
    fn is_already_exists(&self) -> bool;
    /// 405 `MethodNotAllowed`: the resource does not serve the verb at this path.
    fn is_method_not_allowed(&self) -> bool;
}

fn refused(error: &kube::Error, reason: &str, code: u16) -> bool {
    match error {
        kube::Error::Api(status) => {
            status.reason == reason
                || (!KNOWN_REASONS.contains(&status.reason.as_str()) && status.code == code)
        }
        _ => false,
    }
}

impl Refusal for kube::Error {
    fn is_not_found(&self) -> bool {
        refused(self, "NotFound", 404)
    }

    fn is_conflict(&self) -> bool {
        refused(self, "Conflict", 409)
    }

    fn is_already_exists(&self) -> bool {
        // AlreadyExists and Conflict share 409: only the reason tells them apart.
        matches!(self, kube::Error::Api(status) if status.reason == "AlreadyExists")
    }

    fn is_method_not_allowed(&self) -> bool {
        refused(self, "MethodNotAllowed", 405)
    }
}

#[cfg(test)]
mod tests {
    use switchyard_k8s::kube::core::Status;

    use super::*;

    fn answer(code: u16, reason: &str) -> kube::Error {
        let mut status = Status::failure("refused", reason);
        status.code = code;
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn refusals_are_told_by_reason_or_by_code_when_the_reason_is_not_the_apiserver_s() {
        assert!(answer(404, "NotFound").is_not_found());
        // A plain-text 404 from a path the apiserver does not serve.
        assert!(answer(404, "").is_not_found());
        assert!(!answer(404, "Gone").is_not_found());
        assert!(answer(409, "Conflict").is_conflict());
        assert!(!answer(409, "AlreadyExists").is_conflict());
        assert!(answer(409, "AlreadyExists").is_already_exists());
        assert!(!answer(409, "").is_already_exists());
        assert!(answer(405, "").is_method_not_allowed());
        assert!(!answer(500, "InternalError").is_not_found());
    }
}
