//! Zero-byte packing of page images, for snapshots carried inline in the
//! checkpoint's manifest, where every byte is synced on the checkpoint's
//! critical path.
//!
//! A state page is mostly zero bytes: free slots, the high bytes of small
//! keys, counters and epoch stamps. Packing (the scheme of Cap'n Proto's
//! packed encoding) takes the page as 8-byte words; each word becomes a tag
//! byte whose bit `b` says byte `b` is non-zero, then those non-zero bytes.
//! A zero word's tag is followed by the count (0-255) of further zero words
//! it stands for. A page of the 10,000-key benchmark (78 of 127 slots
//! used) packs to about a third of its size, at about 2.7 µs per 4 KiB page
//! (a SIMD shuffle gains too little to be worth its `unsafe`:
//! docs/notebook/benchmarks-2026-12.md, "Checkpoints");
//! dense pages grow by at most one byte in eight, and are then stored as
//! plain images instead (the caller compares).

/// Most further zero words one zero tag stands for.
const MAX_ZERO_RUN: usize = 255;

/// Appends the packed form of `src` (a whole number of 8-byte words) to
/// `out`.
pub(crate) fn pack(src: &[u8], out: &mut Vec<u8>) {
    assert!(
        src.len().is_multiple_of(8),
        "packing {} bytes: not whole words",
        src.len()
    );
    let n = src.len() / 8;
    let word = |i: usize| u64::from_le_bytes(src[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    // Room for the worst case (every word with its tag), cut back at the end.
    let start = out.len();
    out.resize(start + n * 9 + 2, 0);
    let dst = &mut out[start..];
    let (mut i, mut o) = (0, 0);
    while i < n {
        let w = word(i);
        i += 1;
        if w == 0 {
            let mut run = 0;
            while i < n && run < MAX_ZERO_RUN && word(i) == 0 {
                run += 1;
                i += 1;
            }
            dst[o] = 0;
            dst[o + 1] = run as u8;
            o += 2;
            continue;
        }
        // Branch-free: every byte is stored, the cursor advances past the
        // non-zero ones only.
        let out9 = &mut dst[o..o + 9];
        let (mut tag, mut k) = (0u8, 1);
        for b in 0..8 {
            let byte = (w >> (8 * b)) as u8;
            let nz = usize::from(byte != 0);
            out9[k] = byte;
            k += nz;
            tag |= (nz as u8) << b;
        }
        out9[0] = tag;
        o += k;
    }
    out.truncate(start + o);
}

/// Unpacks `src` into `dst` (a whole number of words), which it must fill
/// exactly. Errors say what is wrong with `src`; nothing panics on any
/// input.
pub(crate) fn unpack(mut src: &[u8], dst: &mut [u8]) -> Result<(), &'static str> {
    assert!(
        dst.len().is_multiple_of(8),
        "unpacking into {} bytes: not whole words",
        dst.len()
    );
    let n = dst.len() / 8;
    let next = |src: &mut &[u8]| -> Result<u8, &'static str> {
        let (&b, rest) = src.split_first().ok_or("packed page ends early")?;
        *src = rest;
        Ok(b)
    };
    let mut i = 0;
    while i < n {
        let tag = next(&mut src)?;
        for b in 0..8 {
            dst[i * 8 + b] = if tag & (1 << b) != 0 { next(&mut src)? } else { 0 };
        }
        i += 1;
        if tag == 0 {
            let run = next(&mut src)? as usize;
            if i + run > n {
                return Err("a run of zero words goes past the page end");
            }
            dst[i * 8..(i + run) * 8].fill(0);
            i += run;
        }
    }
    if !src.is_empty() {
        return Err("packed bytes left over after a whole page");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pages of words that are mostly zero, partly zero or dense.
    fn page() -> impl Strategy<Value = Vec<u8>> {
        let word = prop_oneof![
            4 => Just(0u64),
            3 => 0u64..70_000,
            1 => any::<u64>(),
        ];
        proptest::collection::vec(word, 0..700).prop_map(|ws| ws.iter().flat_map(|w| w.to_le_bytes()).collect())
    }

    proptest! {
        #[test]
        fn unpack_restores_what_pack_packed(src in page()) {
            let mut packed = Vec::new();
            pack(&src, &mut packed);
            prop_assert!(packed.len() <= src.len() + src.len() / 8 + 2);
            let mut back = vec![0xAAu8; src.len()];
            prop_assert_eq!(unpack(&packed, &mut back), Ok(()));
            prop_assert_eq!(back, src);
        }

        #[test]
        fn unpack_never_panics_and_never_overruns(bytes in proptest::collection::vec(any::<u8>(), 0..300), words in 0usize..64) {
            let mut dst = vec![0u8; words * 8];
            let _ = unpack(&bytes, &mut dst);
        }
    }

    #[test]
    fn zero_pages_pack_to_a_few_bytes_and_wrong_lengths_are_refused() {
        let zero = vec![0u8; 4096];
        let mut packed = Vec::new();
        pack(&zero, &mut packed);
        assert_eq!(packed.len(), 4, "512 zero words: two tags, two runs");
        let mut small = vec![0u8; 2048];
        assert!(unpack(&packed, &mut small).is_err(), "a run past the end");
        let mut big = vec![0u8; 8192];
        assert_eq!(unpack(&packed, &mut big), Err("packed page ends early"));
    }
}
