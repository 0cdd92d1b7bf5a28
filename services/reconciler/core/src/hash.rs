//! The hashes kube-controller-manager names objects with: Go's `hash/fnv` over bytes, printed
//! in decimal and spelled with `rand.SafeEncodeString`'s alphabet.

/// FNV's 32-bit offset basis.
pub const FNV32_OFFSET_BASIS: u32 = 0x811c_9dc5;
const FNV32_PRIME: u32 = 0x0100_0193;

/// FNV-1a, 32 bits (`fnv.New32a`), continuing from `hash`.
pub fn fnv32a(bytes: &[u8], mut hash: u32) -> u32 {
    for byte in bytes {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(FNV32_PRIME);
    }
    hash
}

/// FNV-1, 32 bits (`fnv.New32`): multiply, then xor. Continues from `hash`.
pub fn fnv32(bytes: &[u8], mut hash: u32) -> u32 {
    for byte in bytes {
        hash = hash.wrapping_mul(FNV32_PRIME);
        hash ^= u32::from(*byte);
    }
    hash
}

/// `rand.SafeEncodeString`: no vowels and no look-alike characters, so no words are spelled.
pub fn safe_encode(text: &str) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    text.chars()
        .map(|c| char::from(ALPHANUMS[(c as usize) % ALPHANUMS.len()]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fnv_variants_are_gos() {
        // Go: fnv.New32() and fnv.New32a() over "hello".
        assert_eq!(fnv32(b"hello", FNV32_OFFSET_BASIS), 0xb6fa_7167);
        assert_eq!(fnv32a(b"hello", FNV32_OFFSET_BASIS), 0x4f9f_2cab);
        // '0' is 48, and 48 % 27 is 21: "4".
        assert_eq!(safe_encode("0123456789"), "456789bcdf");
    }
}
