//! The Greeting's admission webhooks, served by the example's binary beside its controller
//! (`--webhook-addr`): a mutating one gives a Greeting created with an empty message its
//! default, and a validating one refuses a message written in capitals.

use switchyard_sdk::{
    Verdict, Webhooks,
    kube::{ResourceExt, core::admission::AdmissionRequest},
};

use crate::Greeting;

/// Where the apiserver sends a Greeting's creation to be defaulted.
pub const DEFAULT_PATH: &str = "/mutate-greeting";
/// Where it sends a Greeting's creation or update to be checked.
pub const VALIDATE_PATH: &str = "/validate-greeting";

/// Both webhooks, for [`switchyard_sdk::Registry::webhooks`].
pub fn webhooks() -> Webhooks {
    Webhooks::default()
        .mutate(
            DEFAULT_PATH,
            |request| async move { Ok(defaulted(request)) },
        )
        .validate(VALIDATE_PATH, |request| async move { checked(&request) })
}

/// A Greeting without a message greets by its name; any other is left as it is.
fn defaulted(request: AdmissionRequest<Greeting>) -> Option<Greeting> {
    let mut greeting = request.object?;
    if !greeting.spec.message.is_empty() {
        return None;
    }
    greeting.spec.message = format!("Hello from {}!", greeting.name_any());
    Some(greeting)
}

/// A message with letters, all of them capitals, is shouting.
fn checked(request: &AdmissionRequest<Greeting>) -> Verdict {
    let Some(greeting) = &request.object else {
        return Verdict::allow();
    };
    let message = &greeting.spec.message;
    let mut letters = message.chars().filter(|c| c.is_alphabetic()).peekable();
    if letters.peek().is_some() && letters.all(char::is_uppercase) {
        return Verdict::deny(format!(
            "a Greeting does not shout: write {message:?} in lower case"
        ));
    }
    Verdict::allow()
}
