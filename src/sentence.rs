//! Errors that are one sentence for a person: each refusal a part makes has a type
//! of its own, so that a caller knows whose refusal it holds and cannot mistake it
//! for another's, while what it says stays one sentence, written where the cause
//! is known.

/// Declares `$name`, an error holding one sentence: made from a `String` or a
/// `&str`, shown as the sentence, and read as the sentence (`Deref<Target =
/// str>`).
macro_rules! sentence_error {
    ($(#[$meta:meta])* $vis:vis struct $name:ident;) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
        #[error("{0}")]
        $vis struct $name(pub String);

        impl From<String> for $name {
            fn from(sentence: String) -> $name {
                $name(sentence)
            }
        }

        impl From<&str> for $name {
            fn from(sentence: &str) -> $name {
                $name(sentence.to_string())
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }
    };
}
