//! Reading a kiln rootfs layer's tar headers without decompressing its file data.
//!
//! `kiln bake --format rootfs` writes the `.tar.zst` as independent zstd frames, each stating
//! its content size, and gives each 8 MiB chunk of a big file a frame of its own
//! ([`crate::bake::rootfs`]). [`Frames`] is a `Read + Seek` view of the decompressed stream
//! that, asked to seek past whole frames, skips them by walking their block headers (RFC 8878,
//! section 3.1.1: frame header, then blocks of 3-byte headers, then the optional checksum)
//! instead of decompressing them. With `tar::Archive::entries_with_seek`, measuring a layer
//! costs its headers and small files, not its binaries.
//!
//! A frame this reader cannot skip (no content size, a skippable or unknown frame) or that
//! states more than [`MAX_FRAME`] is not guessed at: the reader stops with an error and the
//! caller measures the layer the streaming way.

use std::io::{self, Read, Seek, SeekFrom};

/// The most one frame may decompress to here (kiln's frames are 8 MiB of content at most,
/// plus a batch's headers).
pub const MAX_FRAME: u64 = 64 << 20;

const MAGIC: u32 = 0xFD2F_B528;

/// What a frame header says: where the frame ends in the compressed stream and what it
/// decompresses to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frame {
    compressed: u64,
    content: u64,
}

fn unsupported(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, why)
}

fn read_le(r: &mut impl Read, n: usize) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b[..n])?;
    Ok(u64::from_le_bytes(b))
}

/// Parses the frame that starts at `src`'s position, leaving `src` at its end. `Ok(None)`
/// at the end of the stream.
fn frame(src: &mut (impl Read + Seek)) -> io::Result<Option<Frame>> {
    let start = src.stream_position()?;
    let mut m = [0u8; 4];
    match src.read(&mut m[..1])? {
        0 => return Ok(None),
        _ => src.read_exact(&mut m[1..])?,
    }
    let magic = u32::from_le_bytes(m);
    if magic != MAGIC {
        return Err(unsupported(format!(
            "not a zstd frame at byte {start} (magic {magic:08x})"
        )));
    }
    let fhd = read_le(src, 1)? as u8;
    let single = fhd & 0x20 != 0;
    if !single {
        read_le(src, 1)?; // window descriptor
    }
    let did = [0, 1, 2, 4][(fhd & 3) as usize];
    if did > 0 {
        read_le(src, did)?;
    }
    let content = match (fhd >> 6, single) {
        (0, false) => {
            return Err(unsupported(format!(
                "the zstd frame at byte {start} does not state its size"
            )))
        }
        (0, true) => read_le(src, 1)?,
        (1, _) => read_le(src, 2)? + 256,
        (2, _) => read_le(src, 4)?,
        _ => read_le(src, 8)?,
    };
    if content > MAX_FRAME {
        return Err(unsupported(format!(
            "the zstd frame at byte {start} states {content} bytes, over {MAX_FRAME}"
        )));
    }
    loop {
        let h = read_le(src, 3)?;
        let last = h & 1 != 0;
        let size = match (h >> 1) & 3 {
            0 | 2 => h >> 3,
            1 => 1,
            _ => {
                return Err(unsupported(format!(
                    "reserved block type in the frame at byte {start}"
                )))
            }
        };
        src.seek(SeekFrom::Current(size as i64))?;
        if last {
            break;
        }
    }
    if fhd & 0x04 != 0 {
        src.seek(SeekFrom::Current(4))?;
    }
    let end = src.stream_position()?;
    Ok(Some(Frame {
        compressed: end - start,
        content,
    }))
}

/// A `Read + Seek` view of a multi-frame zstd stream that skips frames it is asked to seek
/// past. Seeking backwards works within the frame last decompressed only.
#[derive(Debug)]
pub struct Frames<R> {
    src: R,
    /// Position in the decompressed stream.
    pos: u64,
    /// The frame last decompressed, and where it starts in the decompressed stream.
    buf: Vec<u8>,
    buf_start: u64,
    /// Where the next unread frame starts: compressed, and decompressed.
    next_src: u64,
    next_start: u64,
    /// Frames decompressed and frames skipped (for tests and the curious).
    pub decompressed: u64,
    /// Frames skipped without decompressing.
    pub skipped: u64,
}

impl<R: Read + Seek> Frames<R> {
    /// Reads `src` from its start.
    pub fn new(src: R) -> Frames<R> {
        Frames {
            src,
            pos: 0,
            buf: Vec::new(),
            buf_start: 0,
            next_src: 0,
            next_start: 0,
            decompressed: 0,
            skipped: 0,
        }
    }

    /// Makes `buf` hold `pos`, skipping the frames before it. `false` at the end.
    fn load(&mut self) -> io::Result<bool> {
        loop {
            self.src.seek(SeekFrom::Start(self.next_src))?;
            let Some(f) = frame(&mut self.src)? else {
                return Ok(false);
            };
            let (at, start) = (self.next_src, self.next_start);
            self.next_src += f.compressed;
            self.next_start += f.content;
            if start + f.content <= self.pos {
                self.skipped += 1;
                continue;
            }
            self.src.seek(SeekFrom::Start(at))?;
            let mut raw = vec![0u8; f.compressed as usize];
            self.src.read_exact(&mut raw)?;
            let data = zstd::bulk::decompress(&raw, f.content as usize)?;
            if data.len() as u64 != f.content {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the zstd frame at byte {at} decompressed to {} bytes, its header says {}",
                        data.len(),
                        f.content
                    ),
                ));
            }
            self.decompressed += 1;
            self.buf = data;
            self.buf_start = start;
            return Ok(true);
        }
    }
}

impl<R: Read + Seek> Read for Frames<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let end = self.buf_start + self.buf.len() as u64;
        if !(self.buf_start..end).contains(&self.pos) && !self.load()? {
            return Ok(0);
        }
        let at = (self.pos - self.buf_start) as usize;
        let n = out.len().min(self.buf.len() - at);
        out[..n].copy_from_slice(&self.buf[at..at + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read + Seek> Seek for Frames<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(_) => None,
        };
        match target {
            Some(t) if t >= self.pos || t >= self.buf_start => {
                self.pos = t;
                Ok(t)
            }
            _ => Err(unsupported(
                "seeking back before the current zstd frame".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn frames(parts: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            out.extend(zstd::bulk::compress(p, 3).unwrap());
        }
        out
    }

    #[test]
    fn reads_all_frames_and_skips_the_ones_seeked_past() {
        let a = vec![b'a'; 1000];
        let b = vec![b'b'; 300_000];
        let c = b"the end".to_vec();
        let z = frames(&[&a, &b, &c]);
        let mut all = Vec::new();
        Frames::new(Cursor::new(&z)).read_to_end(&mut all).unwrap();
        assert_eq!(all, [a.clone(), b.clone(), c.clone()].concat());

        let mut f = Frames::new(Cursor::new(&z));
        let mut head = [0u8; 10];
        f.read_exact(&mut head).unwrap();
        f.seek(SeekFrom::Current(990 + 300_000)).unwrap();
        let mut rest = Vec::new();
        f.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, c);
        assert_eq!((f.decompressed, f.skipped), (2, 1));
    }

    #[test]
    fn what_it_cannot_skip_is_an_error_not_a_guess() {
        // A streamed frame (no content size).
        let mut e = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        io::Write::write_all(&mut e, b"streamed").unwrap();
        let z = e.finish().unwrap();
        let mut out = Vec::new();
        let err = Frames::new(Cursor::new(&z))
            .read_to_end(&mut out)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Unsupported, "{err}");
        // Not zstd at all.
        let err = Frames::new(Cursor::new(b"not zstd".to_vec()))
            .read_to_end(&mut out)
            .unwrap_err();
        assert!(err.to_string().contains("not a zstd frame"), "{err}");
        // A truncated frame.
        let z = frames(&[&[7u8; 5000]]);
        let err = Frames::new(Cursor::new(&z[..z.len() - 3]))
            .read_to_end(&mut out)
            .unwrap_err();
        assert_ne!(err.kind(), io::ErrorKind::Unsupported, "{err}");
    }
}
