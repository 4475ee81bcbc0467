//! The node's wireguard key: created once (0600, atomically, base64 as `wg genkey` writes it), read at every
//! start, never logged and never sent to the store; its public half computed here (X25519, RFC 7748), so that
//! the lease can announce it before any device exists.

use std::fmt;
use std::io::{self, Read};
use std::path::Path;

use crate::path::{key_text, parse_key};

/// A private key. Its Debug and Display never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct PrivateKey([u8; 32]);

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(..)")
    }
}

impl PrivateKey {
    /// 32 random bytes, clamped as X25519 wants them.
    fn generate() -> io::Result<PrivateKey> {
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        bytes[0] &= 248;
        bytes[31] &= 127;
        bytes[31] |= 64;
        Ok(PrivateKey(bytes))
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn public_key(&self) -> [u8; 32] {
        x25519_base(&self.0)
    }
}

/// The key in `path`, created there first if there is none. A file that holds no key is an error (naming the
/// file, not its content).
pub fn load_or_create(path: &Path) -> io::Result<PrivateKey> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_key(&text).map(PrivateKey).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{} holds no wireguard key", path.display()))
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let key = PrivateKey::generate()?;
            if let Some(dir) = path.parent() {
                cnicore::state::ensure_dir(dir, 0o755)?;
            }
            match cnicore::state::create_exclusive(path, format!("{}\n", key_text(&key.0)).as_bytes(), 0o600) {
                Ok(()) => Ok(key),
                // Another process made it first: that one is the key.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => load_or_create(path),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

// X25519 (RFC 7748) over GF(2^255 - 19), five 51-bit limbs. Only ever run on this node's own key, once.

type Fe = [u64; 5];
const MASK: u64 = (1 << 51) - 1;

fn carry(mut h: [u128; 5]) -> Fe {
    for i in 0..4 {
        h[i + 1] += h[i] >> 51;
        h[i] &= MASK as u128;
    }
    h[0] += (h[4] >> 51) * 19;
    h[4] &= MASK as u128;
    h[1] += h[0] >> 51;
    h[0] &= MASK as u128;
    h.map(|limb| limb as u64)
}

fn add(a: &Fe, b: &Fe) -> Fe {
    carry(std::array::from_fn(|i| (a[i] + b[i]) as u128))
}

/// a - b, with 4p added so that no limb goes below zero.
fn sub(a: &Fe, b: &Fe) -> Fe {
    const FOUR_P: Fe =
        [0x1f_ffff_ffff_ffb4, 0x1f_ffff_ffff_fffc, 0x1f_ffff_ffff_fffc, 0x1f_ffff_ffff_fffc, 0x1f_ffff_ffff_fffc];
    carry(std::array::from_fn(|i| (a[i] + FOUR_P[i] - b[i]) as u128))
}

fn mul(a: &Fe, b: &Fe) -> Fe {
    let a: [u128; 5] = a.map(u128::from);
    let b: [u128; 5] = b.map(u128::from);
    let b19: [u128; 5] = b.map(|limb| limb * 19);
    carry([
        a[0] * b[0] + a[1] * b19[4] + a[2] * b19[3] + a[3] * b19[2] + a[4] * b19[1],
        a[0] * b[1] + a[1] * b[0] + a[2] * b19[4] + a[3] * b19[3] + a[4] * b19[2],
        a[0] * b[2] + a[1] * b[1] + a[2] * b[0] + a[3] * b19[4] + a[4] * b19[3],
        a[0] * b[3] + a[1] * b[2] + a[2] * b[1] + a[3] * b[0] + a[4] * b19[4],
        a[0] * b[4] + a[1] * b[3] + a[2] * b[2] + a[3] * b[1] + a[4] * b[0],
    ])
}

fn mul_small(a: &Fe, k: u64) -> Fe {
    carry(a.map(|limb| u128::from(limb) * u128::from(k)))
}

/// z^(p - 2) = 1/z.
fn invert(z: &Fe) -> Fe {
    // p - 2 = 2^255 - 21, little-endian.
    let mut exponent = [0xffu8; 32];
    exponent[0] = 0xeb;
    exponent[31] = 0x7f;
    let mut result: Fe = [1, 0, 0, 0, 0];
    for bit in (0..255).rev() {
        result = mul(&result, &result);
        if (exponent[bit / 8] >> (bit % 8)) & 1 == 1 {
            result = mul(&result, z);
        }
    }
    result
}

fn from_bytes(bytes: &[u8; 32]) -> Fe {
    let load = |offset: usize| {
        let mut word = [0u8; 8];
        let end = (offset + 8).min(32);
        word[..end - offset].copy_from_slice(&bytes[offset..end]);
        u64::from_le_bytes(word)
    };
    [load(0) & MASK, (load(6) >> 3) & MASK, (load(12) >> 6) & MASK, (load(19) >> 1) & MASK, (load(24) >> 12) & MASK]
}

fn to_bytes(h: &Fe) -> [u8; 32] {
    // Twice: the first pass may leave limb 1 just over 51 bits.
    let mut h = carry(carry(h.map(u128::from)).map(u128::from));
    // Subtract p once if h >= p: q is 1 exactly then.
    let mut q = (h[0] + 19) >> 51;
    for limb in &h[1..] {
        q = (limb + q) >> 51;
    }
    h[0] += 19 * q;
    for i in 0..4 {
        h[i + 1] += h[i] >> 51;
        h[i] &= MASK;
    }
    h[4] &= MASK;
    let mut out = [0u8; 32];
    let (mut acc, mut bits, mut at) = (0u128, 0, 0);
    for limb in h {
        acc |= u128::from(limb) << bits;
        bits += 51;
        while bits >= 8 && at < 32 {
            out[at] = acc as u8;
            acc >>= 8;
            bits -= 8;
            at += 1;
        }
    }
    if at < 32 {
        out[at] = acc as u8;
    }
    out
}

fn swap(condition: u64, a: &mut Fe, b: &mut Fe) {
    let mask = 0u64.wrapping_sub(condition);
    for i in 0..5 {
        let t = mask & (a[i] ^ b[i]);
        a[i] ^= t;
        b[i] ^= t;
    }
}

/// X25519(scalar, u) per RFC 7748's ladder.
fn x25519(scalar: &[u8; 32], u: &[u8; 32]) -> [u8; 32] {
    let mut k = *scalar;
    k[0] &= 248;
    k[31] &= 127;
    k[31] |= 64;
    let mut u = *u;
    u[31] &= 127;
    let x1 = from_bytes(&u);
    let (mut x2, mut z2, mut x3, mut z3): (Fe, Fe, Fe, Fe) = ([1, 0, 0, 0, 0], [0; 5], x1, [1, 0, 0, 0, 0]);
    let mut swapped = 0;
    for t in (0..255).rev() {
        let bit = u64::from((k[t / 8] >> (t % 8)) & 1);
        swapped ^= bit;
        swap(swapped, &mut x2, &mut x3);
        swap(swapped, &mut z2, &mut z3);
        swapped = bit;
        let a = add(&x2, &z2);
        let aa = mul(&a, &a);
        let b = sub(&x2, &z2);
        let bb = mul(&b, &b);
        let e = sub(&aa, &bb);
        let c = add(&x3, &z3);
        let d = sub(&x3, &z3);
        let da = mul(&d, &a);
        let cb = mul(&c, &b);
        let sum = add(&da, &cb);
        x3 = mul(&sum, &sum);
        let difference = sub(&da, &cb);
        z3 = mul(&x1, &mul(&difference, &difference));
        x2 = mul(&aa, &bb);
        z2 = mul(&e, &add(&aa, &mul_small(&e, 121_665)));
    }
    swap(swapped, &mut x2, &mut x3);
    swap(swapped, &mut z2, &mut z3);
    to_bytes(&mul(&x2, &invert(&z2)))
}

/// The public key of a private one: X25519 with the base point 9.
fn x25519_base(scalar: &[u8; 32]) -> [u8; 32] {
    let mut nine = [0u8; 32];
    nine[0] = 9;
    x25519(scalar, &nine)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> [u8; 32] {
        let bytes: Vec<u8> = (0..32).map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap()).collect();
        bytes.try_into().unwrap()
    }

    #[test]
    fn rfc_7748_vectors() {
        // Section 6.1: Alice's and Bob's key pairs, and their shared secret both ways.
        let alice = hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let alice_public = hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        let bob = hex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb");
        let bob_public = hex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
        assert_eq!(x25519_base(&alice), alice_public);
        assert_eq!(x25519_base(&bob), bob_public);
        let shared = hex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
        assert_eq!(x25519(&alice, &bob_public), shared);
        assert_eq!(x25519(&bob, &alice_public), shared);
        // Section 5.2: a scalar and a u-coordinate with its top bit set (ignored).
        let scalar = hex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4");
        let u = hex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c");
        assert_eq!(x25519(&scalar, &u), hex("c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"));
    }

    #[test]
    fn a_key_is_created_once_0600_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("fabricd-wgkey-{}", std::process::id()));
        let path = dir.join("wgkey");
        let key = load_or_create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(load_or_create(&path).unwrap(), key, "kept across restarts");
        assert_eq!(format!("{key:?}"), "PrivateKey(..)");
        // A pair as OpenSSL computes it (python3-cryptography), in the files' base64.
        std::fs::write(&path, "YNqHbfBQKaGvzefSSuufuE8sZ/QJjVQLrHwXyvQOUH4=\n").unwrap();
        let known = load_or_create(&path).unwrap();
        assert_eq!(key_text(&known.public_key()), "gOTUhKdGb0cV4OoRlCS57vzxJa99hYLPbkJqlWDW/Do=");
        std::fs::write(&path, "not a key").unwrap();
        let error = load_or_create(&path).unwrap_err();
        assert!(error.to_string().ends_with("holds no wireguard key") && !error.to_string().contains("not a key"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
