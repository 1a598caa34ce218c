//! The block compressors kiln's squashfs writer speaks: zstd (id 6) and zlib, which squashfs
//! calls gzip (id 1). A block is stored only when compressing it makes it smaller.

use std::io::Write;

/// Default zstd level of squashfs-tools (no compressor-options block is written for it).
pub const ZSTD_DEFAULT_LEVEL: i32 = 15;
/// Default zlib level of squashfs-tools.
pub const GZIP_DEFAULT_LEVEL: u32 = 9;

/// The data block size kiln uses (what `mksquashfs -b 131072` sets).
pub const BLOCK_SIZE: u32 = 128 * 1024;

/// A squashfs compressor and its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// zstd at a level (1..=22).
    Zstd {
        /// Compression level.
        level: i32,
    },
    /// zlib at a level (1..=9), window 15, default strategy.
    Gzip {
        /// Compression level.
        level: u32,
    },
}

/// Per-thread compressor state (zstd keeps a reusable context).
pub enum Context {
    /// A zstd context set to the codec's level.
    Zstd(Box<zstd::bulk::Compressor<'static>>),
    /// zlib needs none.
    Gzip,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Context::Zstd(_) => "Context::Zstd",
            Context::Gzip => "Context::Gzip",
        })
    }
}

impl Codec {
    /// zstd at `level`.
    pub fn zstd(level: i32) -> Codec {
        Codec::Zstd { level }
    }

    /// zlib at `level`.
    pub fn gzip(level: u32) -> Codec {
        Codec::Gzip { level }
    }

    /// The superblock's compression id.
    pub fn id(&self) -> u16 {
        match self {
            Codec::Gzip { .. } => 1,
            Codec::Zstd { .. } => 6,
        }
    }

    /// The compressor-options block, when the level is not the default readers assume.
    pub fn options(&self) -> Option<Vec<u8>> {
        match *self {
            Codec::Zstd { level } if level != ZSTD_DEFAULT_LEVEL => {
                Some((level as u32).to_le_bytes().to_vec())
            }
            Codec::Gzip { level } if level != GZIP_DEFAULT_LEVEL => {
                let mut v = level.to_le_bytes().to_vec();
                v.extend_from_slice(&15u16.to_le_bytes()); // window bits
                v.extend_from_slice(&0u16.to_le_bytes()); // strategies: default only
                Some(v)
            }
            _ => None,
        }
    }

    /// Whether the level is one the compressor accepts.
    pub fn check(&self) -> Result<(), String> {
        match *self {
            Codec::Zstd { level } if !(1..=22).contains(&level) => {
                Err(format!("zstd level 1..=22, found {level}"))
            }
            Codec::Gzip { level } if !(1..=9).contains(&level) => {
                Err(format!("gzip level 1..=9, found {level}"))
            }
            _ => Ok(()),
        }
    }

    /// Everything that decides the compressed bytes of a block, in the chunk cache's terms.
    /// The library version is part of it because another zstd or zlib may compress the same
    /// block differently, and a warm bake must match a cold one.
    pub fn cache_codec(&self, block_size: u32, group: u64) -> crate::bake::chunk_cache::Codec {
        let format = format!("kiln-squashfs-blocks-v1 group={group}");
        match *self {
            Codec::Zstd { level } => {
                let mut c =
                    crate::bake::chunk_cache::Codec::zstd(level, block_size as u64, &format);
                c.name = "squashfs-zstd".into();
                c
            }
            Codec::Gzip { level } => crate::bake::chunk_cache::Codec {
                name: "squashfs-zlib".into(),
                library: "flate2-1 miniz_oxide".into(),
                level: level as i32,
                chunk_size: block_size as u64,
                format,
            },
        }
    }

    /// A fresh per-thread context.
    pub fn context(&self) -> Context {
        match *self {
            Codec::Zstd { level } => match zstd::bulk::Compressor::new(level) {
                Ok(c) => Context::Zstd(Box::new(c)),
                // Only an allocation failure gets here; blocks are then stored uncompressed,
                // which readers accept.
                Err(_) => Context::Gzip,
            },
            Codec::Gzip { .. } => Context::Gzip,
        }
    }

    /// Compresses `data`; `None` when that would not make it smaller (store it as is).
    pub fn compress(&self, ctx: &mut Context, data: &[u8]) -> Option<Vec<u8>> {
        let out = match (self, ctx) {
            (Codec::Zstd { .. }, Context::Zstd(c)) => c.compress(data).ok()?,
            (Codec::Gzip { level }, _) => {
                let mut e = flate2::write::ZlibEncoder::new(
                    Vec::with_capacity(data.len() / 2),
                    flate2::Compression::new(*level),
                );
                e.write_all(data).ok()?;
                e.finish().ok()?
            }
            (Codec::Zstd { .. }, Context::Gzip) => return None,
        };
        (out.len() < data.len()).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_to_grow() {
        let text = b"kubelet kubelet kubelet kubelet kubelet kubelet kubelet".repeat(100);
        for codec in [Codec::zstd(15), Codec::zstd(3), Codec::gzip(9)] {
            let mut ctx = codec.context();
            let c = codec.compress(&mut ctx, &text).unwrap();
            let back = match codec {
                Codec::Zstd { .. } => zstd::bulk::decompress(&c, text.len()).unwrap(),
                Codec::Gzip { .. } => {
                    let mut d = flate2::read::ZlibDecoder::new(&c[..]);
                    let mut v = Vec::new();
                    std::io::Read::read_to_end(&mut d, &mut v).unwrap();
                    v
                }
            };
            assert_eq!(back, text);
            assert_eq!(codec.compress(&mut ctx, b"x"), None, "{codec:?}");
        }
    }

    #[test]
    fn options_only_for_non_default_levels() {
        assert_eq!(Codec::zstd(15).options(), None);
        assert_eq!(Codec::zstd(19).options(), Some(vec![19, 0, 0, 0]));
        assert_eq!(Codec::gzip(9).options(), None);
        assert_eq!(
            Codec::gzip(6).options(),
            Some(vec![6, 0, 0, 0, 15, 0, 0, 0])
        );
        assert!(Codec::zstd(23).check().is_err());
        assert!(Codec::gzip(0).check().is_err());
        assert_ne!(
            Codec::zstd(15).cache_codec(4096, 1),
            Codec::zstd(14).cache_codec(4096, 1)
        );
    }
}
