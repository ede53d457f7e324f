//! [`LazyClient`]: an SDK client made when it is first used.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, LazyLock};

type Make<C> = Box<dyn FnOnce() -> C + Send>;

/// An SDK client made on first use, then shared by every clone; it derefs to the client.
///
/// Making an SDK client resolves its configuration and runtime plugins and parses its
/// service's endpoint rules and partitions, which a function's start-up need not wait for
/// (docs/aws.md, "Start-up", has what it costs). A function makes one when an event first
/// needs it; one its events never need is never made.
pub struct LazyClient<C: 'static>(Arc<LazyLock<C, Make<C>>>);

impl<C: 'static> LazyClient<C> {
    pub fn new(make: impl FnOnce() -> C + Send + 'static) -> Self {
        Self(Arc::new(LazyLock::new(Box::new(make))))
    }
}

/// A client made already.
impl<C: Send + 'static> From<C> for LazyClient<C> {
    fn from(client: C) -> Self {
        Self::new(move || client)
    }
}

impl<C: 'static> Deref for LazyClient<C> {
    type Target = C;

    fn deref(&self) -> &C {
        &self.0
    }
}

impl<C: 'static> Clone for LazyClient<C> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<C: 'static> fmt::Debug for LazyClient<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::any::type_name::<Self>())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn a_lazy_client_is_made_once_on_first_use_and_shared_by_its_clones() {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let client = LazyClient::new(|| {
            MADE.fetch_add(1, Ordering::SeqCst);
            String::from("client")
        });
        let clone = client.clone();
        assert_eq!(MADE.load(Ordering::SeqCst), 0, "made before its first use");
        assert_eq!(clone.len(), 6);
        assert_eq!(&*client, "client");
        assert_eq!(MADE.load(Ordering::SeqCst), 1, "made once for both");
    }
}
