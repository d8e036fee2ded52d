//! The impls every text-backed type of the core writes the same way, in one place so a new id or
//! kind cannot get them subtly different: a validated string newtype converts from and into
//! `String` (serde goes through them) and displays as its text; a closed enum that names each
//! variant displays by that name and parses back by looking it up in its `ALL`.

/// For a `struct $ty(String)` whose `$ty::new` validates: `TryFrom<String>` through `new` (so
/// serde refuses what `new` refuses), `From<$ty> for String`, and `Display` as the text itself.
macro_rules! string_newtype_impls {
    ($ty:ident, $error:ty) => {
        impl TryFrom<String> for $ty {
            type Error = $error;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$ty> for String {
            fn from(value: $ty) -> Self {
                value.0
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

/// For an enum with `const ALL` and `fn as_str(self) -> &'static str`: `Display` as its name, and
/// `FromStr` that finds the variant of that name in `ALL`, so the names are written once (in
/// `as_str`); `|text| refusal` makes the error for a text that names none.
macro_rules! named_enum_impls {
    ($ty:ident, $error:ty, |$text:ident| $refuse:expr) => {
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $error;
            fn from_str($text: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .into_iter()
                    .find(|variant| variant.as_str() == $text)
                    .ok_or_else(|| $refuse)
            }
        }
    };
}

pub(crate) use named_enum_impls;
pub(crate) use string_newtype_impls;
