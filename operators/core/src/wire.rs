//! [`Wire`]: what crosses a process boundary of a timely cluster, as JSON text.
//!
//! timely serialises exchanged data with bincode, which cannot read back the JSON-oriented serde
//! attributes of the query flow's types (`skip_serializing_if` on optional context fields: bincode has
//! no field names, so an absent field shifts every later one). Streams of such types are exchanged
//! wrapped in `Wire`, which carries their JSON. Inside one process timely moves the data without
//! serialising it, so the wrapper costs nothing there.

use serde::de::{DeserializeOwned, Error as _};
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `T`, exchanged as its JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct Wire<T>(pub T);

impl<T: Serialize> Serialize for Wire<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let json = serde_json::to_string(&self.0).map_err(S::Error::custom)?;
        serializer.serialize_str(&json)
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Wire<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let json = String::deserialize(deserializer)?;
        serde_json::from_str(&json)
            .map(Wire)
            .map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Sparse {
        #[serde(skip_serializing_if = "Option::is_none", default)]
        note: Option<String>,
        score: f32,
        after: Vec<u32>,
    }

    #[test]
    fn types_with_skipped_fields_survive_a_binary_round_trip() {
        for value in [
            Sparse {
                note: None,
                score: 0.125,
                after: vec![1, 2],
            },
            Sparse {
                note: Some("n".into()),
                score: -3.5e-7,
                after: vec![],
            },
        ] {
            let bytes = bincode::serialize(&Wire(value.clone())).expect("serialise");
            let back: Wire<Sparse> = bincode::deserialize(&bytes).expect("deserialise");
            assert_eq!(back.0, value);
        }
        // Without the wrapper the skipped field breaks the binary format.
        let bytes = bincode::serialize(&Sparse {
            note: None,
            score: 1.0,
            after: vec![7],
        })
        .expect("serialise");
        assert!(bincode::deserialize::<Sparse>(&bytes).map_or(true, |s| s.after != vec![7]));
    }
}
