//! The index of one key's map state: user key to slot offset.
//!
//! Most keys of windowed and timer state hold a single user key (one
//! window, one timer, one process-function state), so the index keeps the
//! first entry inline and builds a hash map only for a second one. A key's
//! first entry then costs no allocation and no second hash lookup: on the
//! hot path of q4, q5 and q8 a map for every key would allocate for each
//! new key's one entry and free it when the entry goes.

use std::hash::Hash;

use rustc_hash::FxHashMap;

/// User key to slot offset for one key; never empty while stored in a
/// [`super::MapStore`] index (the key is removed with its last entry).
#[derive(Debug)]
pub(crate) enum UserMap<UK> {
    /// Exactly one entry.
    One(UK, u64),
    /// Two or more entries (or fewer after removals: it does not shrink
    /// back, so a key that grew keeps its map while it lives). Boxed, so
    /// that the index's entries stay small (16 bytes for a one-byte user
    /// key instead of 40): the index of a large store is read from memory
    /// on most lookups, and smaller entries miss the caches less.
    Many(Box<FxHashMap<UK, u64>>),
}

impl<UK: Hash + Eq + Clone> UserMap<UK> {
    /// The slot of `user_key`, if present.
    #[inline]
    pub(crate) fn get(&self, user_key: &UK) -> Option<u64> {
        match self {
            UserMap::One(uk, off) => (uk == user_key).then_some(*off),
            UserMap::Many(map) => map.get(user_key).copied(),
        }
    }

    /// Adds `user_key` at slot `off`; the caller checked it is absent.
    pub(crate) fn insert_new(&mut self, user_key: UK, off: u64) {
        debug_assert!(self.get(&user_key).is_none(), "insert_new of a present user key");
        match self {
            UserMap::One(uk, first) => {
                let mut map = FxHashMap::with_capacity_and_hasher(4, Default::default());
                map.insert(uk.clone(), *first);
                map.insert(user_key, off);
                *self = UserMap::Many(Box::new(map));
            }
            UserMap::Many(map) => {
                map.insert(user_key, off);
            }
        }
    }

    /// Removes `user_key`; its slot if it was present. The caller drops
    /// the whole map when [`Self::is_empty`] holds afterwards; a `One` is
    /// never left holding a removed entry, because its removal empties it.
    #[inline]
    pub(crate) fn remove(&mut self, user_key: &UK) -> Option<u64> {
        match self {
            UserMap::One(uk, off) => (uk == user_key).then_some(*off),
            UserMap::Many(map) => map.remove(user_key),
        }
    }

    /// Whether the map is empty after removing `removed` (the result of
    /// [`Self::remove`]): a `One` is empty once its entry went.
    #[inline]
    pub(crate) fn is_empty_after(&self, removed: Option<u64>) -> bool {
        match self {
            UserMap::One(..) => removed.is_some(),
            UserMap::Many(map) => map.is_empty(),
        }
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        match self {
            UserMap::One(..) => 1,
            UserMap::Many(map) => map.len(),
        }
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&UK, u64)> {
        let (one, many) = match self {
            UserMap::One(uk, off) => (Some((uk, *off)), None),
            UserMap::Many(map) => (None, Some(map.iter().map(|(uk, off)| (uk, *off)))),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Applies inserts (of absent keys) and removes to a `UserMap` and a
    /// model map side by side, dropping the `UserMap` when it empties the
    /// way `MapStore` does, and checks they agree after every step.
    fn check(ops: &[(bool, u8)]) {
        let mut map: Option<UserMap<u8>> = None;
        let mut model = BTreeMap::new();
        for (i, &(insert, uk)) in ops.iter().enumerate() {
            let off = i as u64;
            if insert {
                if model.contains_key(&uk) {
                    continue;
                }
                model.insert(uk, off);
                match &mut map {
                    Some(m) => m.insert_new(uk, off),
                    None => map = Some(UserMap::One(uk, off)),
                }
            } else if let Some(m) = &mut map {
                let removed = m.remove(&uk);
                assert_eq!(removed, model.remove(&uk));
                if m.is_empty_after(removed) {
                    map = None;
                }
            }
            assert_eq!(map.is_none(), model.is_empty());
            if let Some(m) = &map {
                assert_eq!(m.len(), model.len());
                let mut seen: Vec<(u8, u64)> = m.iter().map(|(k, o)| (*k, o)).collect();
                seen.sort_unstable();
                assert_eq!(seen, model.iter().map(|(k, o)| (*k, *o)).collect::<Vec<_>>());
                for k in 0..8u8 {
                    assert_eq!(m.get(&k), model.get(&k).copied());
                }
            }
        }
    }

    #[test]
    fn the_index_entry_of_a_small_user_key_is_two_words() {
        assert_eq!(std::mem::size_of::<UserMap<u8>>(), 16);
    }

    #[test]
    fn one_entry_grows_into_a_map_and_removal_empties() {
        check(&[
            (true, 1),
            (false, 2),
            (true, 2),
            (false, 1),
            (false, 2),
            (true, 3),
            (false, 3),
        ]);
    }

    proptest! {
        #[test]
        fn agrees_with_a_model(ops in proptest::collection::vec((any::<bool>(), 0u8..8), 0..64)) {
            check(&ops);
        }
    }
}
