//! A blocked Bloom filter of 128-bit digests: a key's eleven bits all lie in one 512-bit block
//! (one cache line), chosen from the digest's own bytes, which are uniform already. Sixteen
//! bits per key of its capacity let about one absent key in a thousand through once it is
//! full, fewer before.

/// A 64-byte block of bits.
type Block = [u64; 8];

const BITS_PER_KEY: usize = 16;
const BITS_SET: usize = 11;

pub struct Bloom {
    blocks: Vec<Block>,
}

impl Bloom {
    /// An empty filter for `capacity` keys.
    pub fn with_capacity(capacity: usize) -> Bloom {
        Bloom { blocks: vec![[0u64; 8]; Bloom::blocks_for(capacity)] }
    }

    /// What a filter for `capacity` keys takes.
    pub fn bytes_for(capacity: usize) -> usize {
        Bloom::blocks_for(capacity) * std::mem::size_of::<Block>()
    }

    /// The most keys a filter of at most `bytes` is sized for (0 when even the smallest does
    /// not fit).
    pub fn capacity_for(bytes: usize) -> usize {
        bytes / std::mem::size_of::<Block>() * 512 / BITS_PER_KEY
    }

    fn blocks_for(capacity: usize) -> usize {
        capacity.saturating_mul(BITS_PER_KEY).div_ceil(512).max(1)
    }

    fn add(&mut self, key: &[u8; 16]) {
        let (block, bits) = positions(self.blocks.len(), key);
        for bit in bits {
            self.blocks[block][(bit / 64) as usize] |= 1 << (bit % 64);
        }
    }

    /// Adds every key of `keys`. In a filter larger than the caches each key's block is a
    /// cache miss; reading a batch's blocks before setting their bits lets the misses overlap
    /// instead of coming one after another.
    pub fn add_all(&mut self, keys: &[[u8; 16]]) {
        const BATCH: usize = 16;
        let blocks = self.blocks.len();
        for batch in keys.chunks(BATCH) {
            let touched = batch.iter().fold(0, |seen, key| seen ^ self.blocks[block_of(blocks, key)][0]);
            std::hint::black_box(touched);
            batch.iter().for_each(|key| self.add(key));
        }
    }

    /// False only for a key that was never added.
    pub fn might_hold(&self, key: &[u8; 16]) -> bool {
        let (block, bits) = positions(self.blocks.len(), key);
        bits.iter().all(|bit| self.blocks[block][(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }

    pub fn bytes(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<Block>()
    }
}

/// The block of a key (the top bits of its first 8 bytes, scaled to the block count) and its
/// bits in it (9 bits each: seven from its last 8 bytes, four from the low bits of its first
/// 8, which the block hardly depends on).
fn positions(blocks: usize, key: &[u8; 16]) -> (usize, [u32; BITS_SET]) {
    let high = u64::from_le_bytes(key[..8].try_into().expect("8 bytes"));
    let low = u64::from_le_bytes(key[8..].try_into().expect("8 bytes"));
    let bits = std::array::from_fn(|i| {
        let source = if i < 7 { low >> (9 * i) } else { high >> (9 * (i - 7)) };
        (source & 511) as u32
    });
    (block_of(blocks, key), bits)
}

fn block_of(blocks: usize, key: &[u8; 16]) -> usize {
    let high = u64::from_le_bytes(key[..8].try_into().expect("8 bytes"));
    ((u128::from(high) * blocks as u128) >> 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn key(i: u64) -> [u8; 16] {
        Sha256::digest(i.to_le_bytes())[..16].try_into().expect("16 bytes")
    }

    fn filled(n: u64) -> Bloom {
        let mut bloom = Bloom::with_capacity(n as usize);
        bloom.add_all(&(0..n).map(key).collect::<Vec<_>>());
        bloom
    }

    #[test]
    fn holds_every_key_it_was_given() {
        let bloom = filled(50_000);
        assert!((0..50_000).all(|i| bloom.might_hold(&key(i))));
    }

    #[test]
    fn lets_about_one_absent_key_in_a_thousand_through_when_full() {
        let bloom = filled(50_000);
        let passed = (1_000_000..1_200_000).filter(|&i| bloom.might_hold(&key(i))).count();
        assert!((40..600).contains(&passed), "{passed} of 200000 absent keys passed");
    }

    #[test]
    fn an_empty_filter_holds_nothing() {
        assert!(!Bloom::with_capacity(0).might_hold(&key(1)));
        assert_eq!(Bloom::with_capacity(0).bytes(), 64);
        assert_eq!(Bloom::bytes_for(1_000_000), 2_000_000);
        assert_eq!(Bloom::capacity_for(2_000_000), 1_000_000);
        assert_eq!(Bloom::capacity_for(63), 0);
        assert!(Bloom::bytes_for(Bloom::capacity_for(64 << 20)) <= 64 << 20);
    }
}
