//! The stable mapping of a work key to its virtual shard.
//!
//! `shard = fnv1a64(controller ‖ 0x00 ‖ namespace ‖ 0x00 ‖ name) mod S`, where fnv1a64 is the
//! 64-bit FNV-1a hash (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over the UTF-8
//! bytes. It is simple to reimplement in any language, has no seed, and never changes between
//! releases: a key's shard depends only on the key and `S`.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The shard of `(controller, namespace, name)` among `shard_count` shards.
pub fn shard_of(controller: &str, namespace: &str, name: &str, shard_count: u32) -> u32 {
    let mut hash = FNV_OFFSET;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(FNV_PRIME);
        }
    };
    feed(controller.as_bytes());
    feed(&[0]);
    feed(namespace.as_bytes());
    feed(&[0]);
    feed(name.as_bytes());
    // The remainder is below shard_count, so it fits in u32.
    (hash % u64::from(shard_count.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv1a_and_never_changes() {
        // Published FNV-1a 64 test vectors: "" and "a".
        let fnv = |s: &str| {
            let mut h = FNV_OFFSET;
            for b in s.bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(FNV_PRIME);
            }
            h
        };
        assert_eq!(fnv(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv("a"), 0xaf63_dc4c_8601_ec8c);
        // Pinned values (computed independently): changing them would move every key of
        // every installation.
        assert_eq!(shard_of("apps/v1/ReplicaSet", "default", "web", 256), 175);
        assert_eq!(
            shard_of("apps/v1/Deployment", "kube-system", "coredns", 256),
            248
        );
    }

    #[test]
    fn shards_spread_keys_evenly() {
        let mut counts = vec![0u32; 16];
        for i in 0..16_000 {
            counts[shard_of("apps/v1/ReplicaSet", "default", &format!("web-{i}"), 16) as usize] +=
                1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
    }
}
