//! The string form: `app=web,tier!=db,env in (a,b),!legacy`.
//!
//! The input is split at the commas outside parentheses, then each requirement is read on
//! its own; it accepts what the apiserver's `labels.Parse` accepts (whitespace being space,
//! tab, CR and LF, as its lexer has it), except `>` and `<`.

use crate::{
    Requirement,
    label::{LabelError, validate_key, validate_value},
};

/// A selector the apiserver would refuse: the input and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{selector:?}: {problem}")]
pub struct ParseError {
    pub selector: String,
    pub problem: Problem,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("empty requirement at offset {offset} (a leading, trailing or doubled comma)")]
    EmptyRequirement { offset: usize },
    #[error("unclosed '(' at offset {offset}")]
    Unclosed { offset: usize },
    #[error("unmatched ')' at offset {offset}")]
    Unmatched { offset: usize },
    #[error("nested '(' at offset {offset}")]
    Nested { offset: usize },
    #[error("{requirement:?}: unknown operator {operator:?} (expected =, ==, !=, in or notin)")]
    UnknownOperator {
        requirement: String,
        operator: String,
    },
    #[error(
        "{requirement:?}: the values of {operator} must be in parentheses, as in \"key {operator} (a,b)\""
    )]
    Unparenthesized {
        requirement: String,
        operator: &'static str,
    },
    #[error("{requirement:?}: text after ')'")]
    AfterParenthesis { requirement: String },
    #[error(
        "{requirement:?}: expected key, !key, key=value, key==value, key!=value, \
         key in (a,b) or key notin (a,b)"
    )]
    Malformed { requirement: String },
    #[error(transparent)]
    Label(#[from] LabelError),
}

/// The apiserver lexer's whitespace.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn trim(s: &str) -> &str {
    s.trim_matches(is_space)
}

pub(crate) fn parse(input: &str) -> Result<Vec<Requirement>, ParseError> {
    let fail = |problem| ParseError {
        selector: input.to_owned(),
        problem,
    };
    if trim(input).is_empty() {
        return Ok(Vec::new());
    }
    split(input)
        .map_err(fail)?
        .into_iter()
        .map(|(offset, part)| requirement(offset, part).map_err(fail))
        .collect()
}

/// The requirements with their byte offsets: `input` split at the commas outside
/// parentheses, after checking that parentheses pair up and do not nest.
fn split(input: &str) -> Result<Vec<(usize, &str)>, Problem> {
    let mut parts = Vec::new();
    let mut open = None;
    let mut start = 0;
    for (offset, c) in input.char_indices() {
        match (c, open) {
            ('(', None) => open = Some(offset),
            ('(', Some(_)) => return Err(Problem::Nested { offset }),
            (')', Some(_)) => open = None,
            (')', None) => return Err(Problem::Unmatched { offset }),
            (',', None) => {
                parts.push((start, &input[start..offset]));
                start = offset + 1;
            }
            _ => {}
        }
    }
    if let Some(offset) = open {
        return Err(Problem::Unclosed { offset });
    }
    parts.push((start, &input[start..]));
    Ok(parts)
}

/// One requirement; `offset` is where it starts in the input. Its parentheses, if any, are
/// one balanced pair (checked by [`split`]).
fn requirement(offset: usize, part: &str) -> Result<Requirement, Problem> {
    let text = trim(part);
    if text.is_empty() {
        return Err(Problem::EmptyRequirement { offset });
    }
    let key = |key: &str| -> Result<String, Problem> {
        let key = trim(key);
        validate_key(key)?;
        Ok(key.to_owned())
    };
    let value = |value: &str| -> Result<String, Problem> {
        let value = trim(value);
        validate_value(value)?;
        Ok(value.to_owned())
    };
    if let Some(rest) = text.strip_prefix('!')
        && !rest.starts_with('=')
    {
        return Ok(Requirement::DoesNotExist(key(rest)?));
    }
    // The first '=' is one of `!=`, `==` or `=`.
    if let Some(eq) = text.find('=') {
        let (left, right) = (&text[..eq], &text[eq + 1..]);
        return Ok(if let Some(left) = left.strip_suffix('!') {
            Requirement::NotEquals(key(left)?, value(right)?)
        } else {
            let right = right.strip_prefix('=').unwrap_or(right);
            Requirement::Equals(key(left)?, value(right)?)
        });
    }
    if let Some(open) = text.find('(') {
        let close = text[open..].find(')').map_or(text.len(), |i| open + i);
        if !trim(text.get(close + 1..).unwrap_or_default()).is_empty() {
            return Err(Problem::AfterParenthesis {
                requirement: text.to_owned(),
            });
        }
        let Some((left, operator)) = trim(&text[..open]).rsplit_once(is_space) else {
            return Err(Problem::Malformed {
                requirement: text.to_owned(),
            });
        };
        type Make = fn(String, Vec<String>) -> Requirement;
        let make: Make = match operator {
            "in" => Requirement::In,
            "notin" => Requirement::NotIn,
            other => {
                return Err(Problem::UnknownOperator {
                    requirement: text.to_owned(),
                    operator: other.to_owned(),
                });
            }
        };
        let key = key(left)?;
        // Repeats dropped with a set, so that a long list costs linear time, not quadratic.
        let mut values: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for v in text[open + 1..close].split(',') {
            let v = value(v)?;
            if seen.insert(v.clone()) {
                values.push(v);
            }
        }
        return Ok(make(key, values));
    }
    if let Some(operator) = text.matches(['<', '>']).next() {
        return Err(Problem::UnknownOperator {
            requirement: text.to_owned(),
            operator: operator.to_owned(),
        });
    }
    let mut words = text.split(is_space).filter(|w| !w.is_empty());
    let unparenthesized = |operator| Problem::Unparenthesized {
        requirement: text.to_owned(),
        operator,
    };
    match (words.next(), words.next()) {
        (Some(key), None) => {
            validate_key(key)?;
            Ok(Requirement::Exists(key.to_owned()))
        }
        (_, Some("in")) => Err(unparenthesized("in")),
        (_, Some("notin")) => Err(unparenthesized("notin")),
        _ => Err(Problem::Malformed {
            requirement: text.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::label::Reason;

    fn problem(input: &str) -> Problem {
        let error = parse(input).expect_err(input);
        assert_eq!(error.selector, input);
        error.problem
    }

    fn key_error(key: &str, reason: Reason) -> Problem {
        Problem::Label(LabelError::Key {
            key: key.into(),
            reason,
        })
    }

    fn value_error(value: &str, reason: Reason) -> Problem {
        Problem::Label(LabelError::Value {
            value: value.into(),
            reason,
        })
    }

    #[test]
    fn a_long_value_list_keeps_each_value_once_in_its_order() {
        let values: Vec<String> = (0..1000).map(|n| format!("v{n}")).collect();
        let listed = [values.clone(), values.clone()].concat().join(",");
        assert_eq!(
            parse(&format!("k in ({listed})")).unwrap(),
            [Requirement::In("k".into(), values)]
        );
    }

    #[test]
    fn requirements_in_every_form() {
        let s = |v: &[&str]| v.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            parse("a=1,b==2,c!=3,d in (x, y),e notin(z),f,!g,h=,i in (,x,,x)").unwrap(),
            [
                Requirement::Equals("a".into(), "1".into()),
                Requirement::Equals("b".into(), "2".into()),
                Requirement::NotEquals("c".into(), "3".into()),
                Requirement::In("d".into(), s(&["x", "y"])),
                Requirement::NotIn("e".into(), s(&["z"])),
                Requirement::Exists("f".into()),
                Requirement::DoesNotExist("g".into()),
                Requirement::Equals("h".into(), String::new()),
                Requirement::In("i".into(), s(&["", "x"])),
            ]
        );
        assert_eq!(
            parse("\ta\n=\r1 , ! b ,c\tin\t(\tx\t)").unwrap(),
            [
                Requirement::Equals("a".into(), "1".into()),
                Requirement::DoesNotExist("b".into()),
                Requirement::In("c".into(), s(&["x"])),
            ]
        );
        assert_eq!(
            parse("x in ()").unwrap(),
            [Requirement::In("x".into(), s(&[""]))]
        );
    }

    #[test]
    fn commas_and_parentheses_out_of_place() {
        assert_eq!(
            problem("app=web,,tier=x"),
            Problem::EmptyRequirement { offset: 8 }
        );
        assert_eq!(
            problem("controller=a,"),
            Problem::EmptyRequirement { offset: 13 }
        );
        assert_eq!(problem(",a"), Problem::EmptyRequirement { offset: 0 });
        assert_eq!(problem("a, ,b"), Problem::EmptyRequirement { offset: 2 });
        assert_eq!(problem("env in (a,b"), Problem::Unclosed { offset: 7 });
        assert_eq!(problem("controller=a)"), Problem::Unmatched { offset: 12 });
        assert_eq!(problem("a in ((b))"), Problem::Nested { offset: 6 });
        assert_eq!(
            problem("a in (b) c"),
            Problem::AfterParenthesis {
                requirement: "a in (b) c".into()
            }
        );
    }

    #[test]
    fn operators_the_grammar_does_not_have() {
        assert_eq!(
            problem("env within (a)"),
            Problem::UnknownOperator {
                requirement: "env within (a)".into(),
                operator: "within".into()
            }
        );
        assert_eq!(
            problem("bad key within (a b)"),
            Problem::UnknownOperator {
                requirement: "bad key within (a b)".into(),
                operator: "within".into()
            }
        );
        assert_eq!(
            problem("replicas > 1"),
            Problem::UnknownOperator {
                requirement: "replicas > 1".into(),
                operator: ">".into()
            }
        );
        assert_eq!(
            problem("env in a"),
            Problem::Unparenthesized {
                requirement: "env in a".into(),
                operator: "in"
            }
        );
        assert_eq!(
            problem("env notin a"),
            Problem::Unparenthesized {
                requirement: "env notin a".into(),
                operator: "notin"
            }
        );
        for malformed in ["con troller", "in(a)", "a b c"] {
            assert_eq!(
                problem(malformed),
                Problem::Malformed {
                    requirement: malformed.into()
                }
            );
        }
    }

    #[test]
    fn bad_keys_and_values_are_named() {
        assert_eq!(
            problem("bad key!=x"),
            key_error("bad key", Reason::Character(' '))
        );
        assert_eq!(
            problem("app=we b"),
            value_error("we b", Reason::Character(' '))
        );
        assert_eq!(
            problem("controller=-bad-"),
            value_error("-bad-", Reason::Ends)
        );
        assert_eq!(
            problem("Bad_Prefix/x=1"),
            key_error("Bad_Prefix/x", Reason::Prefix)
        );
        assert_eq!(problem("/x"), key_error("/x", Reason::PrefixLength));
        assert_eq!(problem("!"), key_error("", Reason::EmptyName));
        assert_eq!(problem("!=a"), key_error("", Reason::EmptyName));
        assert_eq!(problem("=a"), key_error("", Reason::EmptyName));
        assert_eq!(problem("a===b"), value_error("=b", Reason::Character('=')));
        assert_eq!(
            problem("a=b!=c"),
            value_error("b!=c", Reason::Character('!'))
        );
        assert_eq!(problem("!a=b"), key_error("a=b", Reason::Character('=')));
        assert_eq!(problem("a=(b)"), value_error("(b)", Reason::Character('(')));
        assert_eq!(
            problem("a b in (c)"),
            key_error("a b", Reason::Character(' '))
        );
        assert_eq!(
            problem("a in (b c)"),
            value_error("b c", Reason::Character(' '))
        );
        assert_eq!(problem("a in (x,-y)"), value_error("-y", Reason::Ends));
        let long = "a".repeat(64);
        assert_eq!(
            problem(&format!("controller={long}")),
            value_error(&long, Reason::TooLong(64))
        );
    }

    #[test]
    fn messages_name_the_selector_and_the_problem() {
        let message = |input: &str| parse(input).unwrap_err().to_string();
        assert_eq!(
            message("controller in (a"),
            "\"controller in (a\": unclosed '(' at offset 14"
        );
        assert_eq!(
            message("controller=not a value"),
            "\"controller=not a value\": label value \"not a value\": character ' ' not \
             allowed (letters, digits, '-', '_' and '.')"
        );
        assert_eq!(
            message("a=1,,b=2"),
            "\"a=1,,b=2\": empty requirement at offset 4 (a leading, trailing or doubled comma)"
        );
    }
}
