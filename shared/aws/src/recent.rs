//! Event items read in the last few seconds, kept by the warm process.
//!
//! An event item never changes once written (its expiry aside, which no read returns), so a
//! copy read a moment ago is as good as a read. The deliver path reads a first attempt's event
//! twice in a row: to check that it lists the delivery (`DynamoStore::committed`), then for its
//! payload. With this, it reads it once; so do the deliveries of one event in one batch.
//! Only found items are kept: an event not written yet is read again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::item::{attribute_size, Item};

/// How long a copy is used.
const KEEP_FOR: Duration = Duration::from_secs(5);
/// The most bytes kept: a payload may be 256 KB, and a function has 256 MB.
const MAX_BYTES: usize = 8 << 20;

#[derive(Debug, Default, Clone)]
pub(crate) struct RecentEvents(Arc<Mutex<Kept>>);

#[derive(Debug, Default)]
struct Kept {
    items: HashMap<String, (Instant, usize, Item)>,
    bytes: usize,
}

impl RecentEvents {
    /// The item under `pk`, if it was read within [`KEEP_FOR`].
    pub(crate) fn get(&self, pk: &str) -> Option<Item> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.items
            .get(pk)
            .filter(|(at, _, _)| at.elapsed() < KEEP_FOR)
            .map(|(_, _, item)| item.clone())
    }

    pub(crate) fn keep(&self, pk: &str, item: &Item) {
        let size: usize = item.iter().map(|(k, v)| k.len() + attribute_size(v)).sum();
        if size > MAX_BYTES / 4 {
            return;
        }
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.bytes + size > MAX_BYTES {
            kept.items.retain(|_, (at, _, _)| at.elapsed() < KEEP_FOR);
            kept.bytes = kept.items.values().map(|(_, size, _)| size).sum();
            if kept.bytes + size > MAX_BYTES {
                kept.items.clear();
                kept.bytes = 0;
            }
        }
        if let Some((_, old, _)) = kept.items.insert(pk.to_owned(), (Instant::now(), size, item.clone())) {
            kept.bytes -= old;
        }
        kept.bytes += size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::types::AttributeValue;

    fn item(bytes: usize) -> Item {
        HashMap::from([("payload".to_owned(), AttributeValue::S("x".repeat(bytes)))])
    }

    #[test]
    fn a_kept_item_is_found_and_the_bytes_stay_bounded() {
        let recent = RecentEvents::default();
        assert_eq!(recent.get("EVT#a"), None);
        recent.keep("EVT#a", &item(10));
        assert_eq!(recent.get("EVT#a"), Some(item(10)));
        // Past the bound the old copies go (all of them, when none has expired).
        for i in 0..40 {
            recent.keep(&format!("EVT#{i}"), &item(1 << 20));
        }
        let kept = recent.0.lock().unwrap();
        assert!(kept.bytes <= MAX_BYTES, "{} bytes kept", kept.bytes);
        assert_eq!(kept.bytes, kept.items.values().map(|(_, size, _)| size).sum::<usize>());
    }

    #[test]
    fn an_item_too_large_to_keep_is_read_again() {
        let recent = RecentEvents::default();
        recent.keep("EVT#big", &item(MAX_BYTES));
        assert_eq!(recent.get("EVT#big"), None);
    }
}
