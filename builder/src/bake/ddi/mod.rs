//! A signed Discoverable Disk Image around a finished sysext squashfs, byte for byte the
//! layout `systemd-repart --make-ddi=sysext` (systemd 257) writes from a fixed seed: a GPT
//! with the root data partition, its dm-verity hash tree, and the PKCS#7 signature of the
//! root hash that systemd checks against `/etc/verity.d` before it merges the extension.

pub mod gpt;
pub mod pkcs7;
pub mod verity;

#[cfg(test)]
mod repart_tests;
#[cfg(test)]
mod test_tools;

use crate::atomic_file::{AtomicFile, WriteError};
use crate::supply::lock::Arch;
use gpt::{Extent, GptDisk, PartitionSpec, SECTOR};
use hmac::{Hmac, Mac};
use p256::ecdsa::SigningKey;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use verity::{TreeBuilder, VerityParams, BLOCK};

/// The signature partition's fixed size (repart's `VERITY_SIG_SIZE`).
pub const SIGNATURE_SIZE: u64 = 16384;

/// GPT attribute bit 60: read-only (set on the data and hash partitions, as 257 does).
const READ_ONLY: u64 = 1 << 60;

/// The image's mode, as for every bake output.
const MODE: u32 = 0o644;

/// Why a DDI was not written. Nothing is left at the destination in any case.
#[derive(Debug, thiserror::Error)]
pub enum DdiError {
    /// Reading the squashfs or writing the image failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The squashfs file has no bytes.
    #[error("{path}: expected a squashfs image, found an empty file")]
    Empty {
        /// The squashfs.
        path: PathBuf,
    },
    /// The certificate cannot go with the signing key.
    #[error("signing {path}: {source}")]
    Certificate {
        /// The image being written.
        path: PathBuf,
        /// What is wrong with the certificate.
        source: pkcs7::CertError,
    },
    /// The signature JSON does not fit its partition (a very large certificate).
    #[error("{path}: the verity signature JSON is {found} bytes, expected at most {SIGNATURE_SIZE}; use a smaller certificate")]
    SignatureTooLarge {
        /// The image being written.
        path: PathBuf,
        /// The JSON's length.
        found: usize,
    },
}

impl From<WriteError> for DdiError {
    fn from(e: WriteError) -> DdiError {
        DdiError::Io {
            action: e.action,
            path: e.path,
            source: e.source,
        }
    }
}

/// What [`write_signed_ddi`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DdiInfo {
    /// The dm-verity root hash, lower-case hex (what was signed).
    pub root_hash: String,
    /// The root data partition (the squashfs, zero-padded to 4 KiB).
    pub data: Extent,
    /// The verity hash partition.
    pub verity: Extent,
    /// The verity signature partition.
    pub signature: Extent,
    /// The image size in bytes.
    pub size: u64,
    /// The signing certificate as PEM, for the nodes' `/etc/verity.d/*.crt`.
    pub certificate_pem: String,
}

/// What systemd-repart derives from `--seed=`: keyed HMAC-SHA256 of a label.
fn seeded(seed: &[u8; 16], label: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(seed).expect("HMAC takes any key length");
    mac.update(label);
    mac.finalize().into_bytes().into()
}

/// The first 16 bytes as a random (version 4, variant 1) UUID.
fn uuid_v4(hash: &[u8; 32]) -> [u8; 16] {
    let mut b: [u8; 16] = hash[..16].try_into().expect("16 bytes");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

/// Writes `out`, a signed sysext DDI of `squashfs` for `arch`, as `systemd-repart
/// --make-ddi=sysext --seed=SEED` (257) would lay it out, signed with `key` whose
/// certificate is `cert_der`. `seed` is the seed UUID's bytes in text order; the same inputs
/// give the same bytes. The image goes to a temp file beside `out` and is renamed over it
/// only when complete.
///
/// Two cases differ from repart 257 on purpose: a squashfs whose length is not a multiple of
/// 4096 is zero-padded and its last block hashed (repart's tree leaves that block out, so the
/// verity device would cut the filesystem short; kiln's own squashfs is always padded), and
/// an image under about 4 MiB keeps the 1 MiB layout (repart's libfdisk aligns such a tiny
/// disk to 4 KiB instead).
pub fn write_signed_ddi(
    squashfs: &Path,
    out: &Path,
    arch: Arch,
    seed: [u8; 16],
    key: &SigningKey,
    cert_der: &[u8],
) -> Result<DdiInfo, DdiError> {
    let read_err = |source| DdiError::Io {
        action: "reading",
        path: squashfs.to_path_buf(),
        source,
    };
    let mut input = File::open(squashfs).map_err(read_err)?;
    let empty = || DdiError::Empty {
        path: squashfs.to_path_buf(),
    };
    write_signed_ddi_with(out, arch, seed, key, cert_der, |file| {
        // The data partition: the squashfs copied to 1 MiB (hashed again below).
        let n = io::copy(&mut input, file).map_err(|e| DdiError::Io {
            action: "copying",
            path: squashfs.to_path_buf(),
            source: e,
        })?;
        if n == 0 {
            return Err(empty());
        }
        Ok(())
    })
}

/// [`write_signed_ddi`] where `fill` writes the data partition's filesystem itself, from
/// the file's current position (1 MiB into the image; kiln's squashfs writer writes there
/// directly, so the image is not a second copy of it). `fill` may leave the position
/// anywhere; the data is what lies between 1 MiB and the file's end, zero-padded to 4 KiB.
pub fn write_signed_ddi_with<E: From<DdiError>>(
    out: &Path,
    arch: Arch,
    seed: [u8; 16],
    key: &SigningKey,
    cert_der: &[u8],
    fill: impl FnOnce(&mut File) -> Result<(), E>,
) -> Result<DdiInfo, E> {
    let cert_err = |source| DdiError::Certificate {
        path: out.to_path_buf(),
        source,
    };
    pkcs7::check_certificate(cert_der, key).map_err(cert_err)?;
    let write_err = |source| DdiError::Io {
        action: "writing",
        path: out.to_path_buf(),
        source,
    };
    let mut image = AtomicFile::create(out, ".kiln-", ".tmp").map_err(DdiError::from)?;
    let file = image.file_mut();
    let start = 2048 * SECTOR;
    file.seek(SeekFrom::Start(start)).map_err(write_err)?;
    fill(file)?;
    let end = file.metadata().map_err(write_err)?.len();
    if end <= start {
        return Err(DdiError::Empty {
            path: out.to_path_buf(),
        }
        .into());
    }
    // Hash the data partition where it lies (it is in the page cache: just written).
    file.seek(SeekFrom::Start(start)).map_err(write_err)?;
    let params = VerityParams {
        salt: seeded(&seed, b"verity-salt"),
        uuid: uuid_v4(&seeded(&seed, b"verity-uuid")),
    };
    let tree = copy_hashing(&mut file.take(end - start), &mut io::sink(), params)
        .map_err(|e| match e {
            Copy::Read(e) | Copy::Write(e) => write_err(e),
        })?
        .ok_or_else(|| DdiError::Empty {
            path: out.to_path_buf(),
        })?;
    // The zero padding of a last partial block, then the hash area and the signature.
    file.seek(SeekFrom::Start(end)).map_err(write_err)?;
    let padding = (end - start).next_multiple_of(BLOCK as u64) - (end - start);
    file.write_all(&vec![0u8; padding as usize])
        .map_err(write_err)?;
    file.write_all(&tree.hash_area).map_err(write_err)?;

    let root_hash = hex::encode(tree.root_hash);
    let signature = signature_partition(&root_hash, key, cert_der, out)?;
    file.write_all(&signature).map_err(write_err)?;

    let disk = layout(arch, seed, &tree);
    file.seek(SeekFrom::Start(0)).map_err(write_err)?;
    file.write_all(&disk.head()).map_err(write_err)?;
    file.seek(SeekFrom::Start(disk.total_size() - 33 * SECTOR))
        .map_err(write_err)?;
    file.write_all(&disk.tail()).map_err(write_err)?;
    image.commit(MODE).map_err(DdiError::from)?;

    let [data, verity, signature] = disk.extents().try_into().expect("three partitions");
    Ok(DdiInfo {
        root_hash,
        data,
        verity,
        signature,
        size: disk.total_size(),
        certificate_pem: pkcs7::certificate_pem(cert_der),
    })
}

/// Why [`copy_hashing`] stopped.
enum Copy {
    Read(io::Error),
    Write(io::Error),
}

/// Copies `input` to `out`'s position, zero-padding it to whole blocks, and hashes each
/// block into a tree; `None` for empty input.
fn copy_hashing(
    input: &mut impl Read,
    out: &mut impl Write,
    params: VerityParams,
) -> Result<Option<verity::VerityTree>, Copy> {
    const CHUNK: usize = 256 * BLOCK;
    let mut tree = TreeBuilder::new(params);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let mut filled = 0;
        while filled < CHUNK {
            match input.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Copy::Read(e)),
            }
        }
        let padded = filled.next_multiple_of(BLOCK);
        buf[filled..padded].fill(0);
        for block in buf[..padded].chunks_exact(BLOCK) {
            tree.push(block.try_into().expect("a whole block"));
        }
        out.write_all(&buf[..padded]).map_err(Copy::Write)?;
        if filled < CHUNK {
            return Ok(tree.finish());
        }
    }
}

/// The signature partition: repart's compact JSON (rootHash, certificateFingerprint,
/// signature, in that order), NUL-padded to [`SIGNATURE_SIZE`]. What is signed is the root
/// hash's 64 hex characters, as systemd and the kernel check it.
fn signature_partition(
    root_hash: &str,
    key: &SigningKey,
    cert_der: &[u8],
    out: &Path,
) -> Result<Vec<u8>, DdiError> {
    use base64::Engine as _;
    let pkcs7 = pkcs7::sign_detached(root_hash.as_bytes(), key, cert_der).map_err(|source| {
        DdiError::Certificate {
            path: out.to_path_buf(),
            source,
        }
    })?;
    let json = format!(
        r#"{{"rootHash":"{root_hash}","certificateFingerprint":"{}","signature":"{}"}}"#,
        hex::encode(Sha256::digest(cert_der)),
        base64::engine::general_purpose::STANDARD.encode(pkcs7)
    );
    let mut bytes = json.into_bytes();
    if bytes.len() > SIGNATURE_SIZE as usize {
        return Err(DdiError::SignatureTooLarge {
            path: out.to_path_buf(),
            found: bytes.len(),
        });
    }
    bytes.resize(SIGNATURE_SIZE as usize, 0);
    Ok(bytes)
}

/// The GPT: repart's partition names, types and UUIDs (data and hash partitions named by
/// the root hash's halves, the rest derived from the seed).
fn layout(arch: Arch, seed: [u8; 16], tree: &verity::VerityTree) -> GptDisk {
    let types = gpt::root_types(arch);
    let half = |i: usize| -> [u8; 16] {
        tree.root_hash[16 * i..16 * (i + 1)]
            .try_into()
            .expect("16 bytes")
    };
    let sig_type = gpt::uuid_bytes(types.signature);
    let data_size = tree.data_blocks * BLOCK as u64;
    let part = |type_uuid, uuid, size, attributes, suffix: &str| PartitionSpec {
        type_uuid,
        uuid,
        size,
        attributes,
        name: format!("root-{}{suffix}", types.arch),
    };
    GptDisk::new(
        uuid_v4(&seeded(&seed, b"disk-uuid")),
        vec![
            part(
                gpt::uuid_bytes(types.data),
                half(0),
                data_size,
                READ_ONLY,
                "",
            ),
            part(
                gpt::uuid_bytes(types.verity),
                half(1),
                tree.hash_area.len() as u64,
                READ_ONLY,
                "-verity",
            ),
            part(
                sig_type,
                uuid_v4(&seeded(&seed, &sig_type)),
                SIGNATURE_SIZE,
                0,
                "-verity-sig",
            ),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::test_tools::{run, tool};
    use super::*;
    use crate::image::partition::{guid_text, read_table};

    const EPOCH: u64 = 1_700_000_000;
    /// The research spec's repart 252 run (E1): `--seed=0f0e0d0c-0b0a-0908-0706-050403020100`.
    const E1_SEED: [u8; 16] = [15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0];

    fn key(n: u8) -> SigningKey {
        SigningKey::from_slice(&Sha256::digest([n, 0xdd])).unwrap()
    }

    /// Stand-in squashfs bytes: any bytes do for the layout, and an odd length exercises
    /// the padding of the last block.
    fn squashfs(dir: &Path, len: usize) -> PathBuf {
        let mut bytes = Vec::with_capacity(len + 32);
        let mut x = Sha256::digest(b"kiln ddi test squashfs");
        while bytes.len() < len {
            bytes.extend_from_slice(&x);
            x = Sha256::digest(x);
        }
        bytes.truncate(len);
        let path = dir.join("ext.squashfs");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    struct Written {
        dir: tempfile::TempDir,
        image: PathBuf,
        info: DdiInfo,
        cert: Vec<u8>,
    }

    fn write(arch: Arch, seed: [u8; 16], len: usize) -> Written {
        let dir = tempfile::tempdir().unwrap();
        let src = squashfs(dir.path(), len);
        let image = dir.path().join("ext.raw");
        let cert = pkcs7::self_signed_certificate(&key(1), "kiln ddi test", EPOCH);
        let info = write_signed_ddi(&src, &image, arch, seed, &key(1), &cert).unwrap();
        Written {
            dir,
            image,
            info,
            cert,
        }
    }

    fn slice(bytes: &[u8], e: Extent) -> &[u8] {
        &bytes[e.offset as usize..(e.offset + e.size) as usize]
    }

    fn put(dir: &Path, name: &str, bytes: &[u8]) -> String {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    }

    /// The seed derivations reproduce the UUIDs repart wrote in the spec's E1 run.
    #[test]
    fn seed_uuids_match_repart() {
        let disk = uuid_v4(&seeded(&E1_SEED, b"disk-uuid"));
        assert_eq!(
            guid_text(&gpt::on_disk(disk)),
            "358235cc-87c0-46b1-a612-e72eea06c4f4"
        );
        let sig_type = gpt::uuid_bytes(gpt::root_types(Arch::Amd64).signature);
        let sig = uuid_v4(&seeded(&E1_SEED, &sig_type));
        assert_eq!(
            guid_text(&gpt::on_disk(sig)),
            "339463a6-b097-48bc-bb14-8023a0bb60e5"
        );
    }

    /// The image's partitions, read back by kiln's GPT reader, hold the padded squashfs, a
    /// hash tree `veritysetup verify` accepts (and refuses after a data byte flips), and the
    /// signature JSON whose PKCS#7 OpenSSL verifies over the root hash; `sgdisk -v` finds no
    /// problem. The UUIDs are the root hash halves and the seed's.
    #[test]
    fn image_checks_out_with_real_tools() {
        let vs = tool("veritysetup", "cryptsetup-bin");
        let sgdisk = tool("sgdisk", "gdisk");
        let openssl = tool("openssl", "openssl");
        let w = write(Arch::Amd64, E1_SEED, 300 * BLOCK + 123);
        let d = w.dir.path();
        let img = std::fs::read(&w.image).unwrap();
        assert_eq!(img.len() as u64, w.info.size);
        let table = read_table(img.as_slice()).unwrap();
        let extents: Vec<Extent> = table
            .partitions
            .iter()
            .map(|p| Extent {
                offset: p.offset,
                size: p.size,
            })
            .collect();
        assert_eq!(extents, [w.info.data, w.info.verity, w.info.signature]);
        let check = run(&sgdisk, &["-v", w.image.to_str().unwrap()]).unwrap();
        assert!(check.contains("No problems found"), "{check}");
        // The data and hash partitions are named by the root hash's halves; the disk and
        // the signature partition by E1's seed, as repart named them.
        let rh = &w.info.root_hash;
        let text = |h: &str| {
            format!(
                "{}-{}-{}-{}-{}",
                &h[0..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..32]
            )
        };
        let uuids = [
            ("1", text(&rh[..32])),
            ("2", text(&rh[32..])),
            ("3", "339463a6-b097-48bc-bb14-8023a0bb60e5".to_string()),
        ];
        for (n, uuid) in uuids {
            let info = run(&sgdisk, &["-i", n, w.image.to_str().unwrap()]).unwrap();
            let want = format!("Partition unique GUID: {}", uuid.to_uppercase());
            assert!(info.contains(&want), "{want}\n{info}");
        }
        let print = run(&sgdisk, &["-p", w.image.to_str().unwrap()]).unwrap();
        assert!(
            print.contains("Disk identifier (GUID): 358235CC-87C0-46B1-A612-E72EEA06C4F4"),
            "{print}"
        );

        let src = std::fs::read(d.join("ext.squashfs")).unwrap();
        let data = slice(&img, w.info.data);
        assert_eq!(data.len(), 301 * BLOCK);
        assert_eq!(&data[..src.len()], src.as_slice());
        assert!(data[src.len()..].iter().all(|&b| b == 0));

        let data_path = put(d, "data", data);
        let hash_path = put(d, "hash", slice(&img, w.info.verity));
        run(&vs, &["verify", &data_path, &hash_path, rh]).expect("veritysetup accepts");
        let dump = run(&vs, &["dump", &hash_path]).unwrap();
        assert!(dump.contains("Data blocks:     \t301"), "{dump}");
        let mut flipped = data.to_vec();
        flipped[200 * BLOCK] ^= 0x80;
        let flipped_path = put(d, "flipped", &flipped);
        assert!(run(&vs, &["verify", &flipped_path, &hash_path, rh]).is_err());

        let sig = slice(&img, w.info.signature);
        let end = sig.iter().position(|&b| b == 0).unwrap();
        assert!(sig[end..].iter().all(|&b| b == 0));
        let json: serde_json::Value = serde_json::from_slice(&sig[..end]).unwrap();
        assert_eq!(json["rootHash"], rh.as_str());
        assert_eq!(
            json["certificateFingerprint"],
            hex::encode(Sha256::digest(&w.cert))
        );
        use base64::Engine as _;
        let der = base64::engine::general_purpose::STANDARD
            .decode(json["signature"].as_str().unwrap())
            .unwrap();
        let sig_path = put(d, "sig.der", &der);
        let cert_path = put(d, "cert.pem", w.info.certificate_pem.as_bytes());
        let content = put(d, "roothash", rh.as_bytes());
        run(
            &openssl,
            &[
                "cms",
                "-verify",
                "-inform",
                "DER",
                "-in",
                &sig_path,
                "-binary",
                "-content",
                &content,
                "-CAfile",
                &cert_path,
                "-purpose",
                "any",
                "-out",
                "/dev/null",
            ],
        )
        .expect("openssl accepts the root hash signature");
    }

    /// Same inputs, same bytes; another seed or architecture changes them.
    #[test]
    fn deterministic() {
        let a = write(Arch::Arm64, [7; 16], 5 * BLOCK);
        let b = write(Arch::Arm64, [7; 16], 5 * BLOCK);
        let (a_img, b_img) = (
            std::fs::read(&a.image).unwrap(),
            std::fs::read(&b.image).unwrap(),
        );
        assert_eq!(a_img, b_img);
        assert_eq!(a.info, b.info);
        let c = write(Arch::Arm64, [8; 16], 5 * BLOCK);
        assert_ne!(std::fs::read(&c.image).unwrap(), a_img);
        let x = write(Arch::Amd64, [7; 16], 5 * BLOCK);
        assert_ne!(std::fs::read(&x.image).unwrap(), a_img);
    }

    /// A refused input leaves neither the image nor a temp file behind, and the error
    /// names the file at fault.
    #[test]
    fn failures_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ext.raw");
        let cert = pkcs7::self_signed_certificate(&key(1), "kiln ddi test", EPOCH);
        let empty = dir.path().join("empty.squashfs");
        std::fs::write(&empty, b"").unwrap();
        let missing = dir.path().join("missing.squashfs");
        let src = squashfs(dir.path(), BLOCK);
        let cases: [(&Path, &SigningKey, &str); 3] = [
            (
                &empty,
                &key(1),
                "empty.squashfs: expected a squashfs image, found an empty file",
            ),
            (&missing, &key(1), "reading "),
            (
                &src,
                &key(2),
                "the certificate's public key is not the signing key's",
            ),
        ];
        for (input, k, want) in cases {
            let err = write_signed_ddi(input, &out, Arch::Amd64, [1; 16], k, &cert).unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
            let mut left: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            left.sort();
            assert_eq!(left, ["empty.squashfs", "ext.squashfs"], "{want}");
        }
        let err =
            write_signed_ddi(&missing, &out, Arch::Amd64, [1; 16], &key(1), &cert).unwrap_err();
        assert!(err.to_string().contains("missing.squashfs"), "{err}");
    }
}
