//! e2fsprogs' `debugfs`, driven as a library: the unprivileged way into an ext4 root. It
//! opens the filesystem inside the working copy (`FILE?offset=N`, the unix I/O manager's
//! option), reads and writes it in user space, and needs neither root, a loop device nor FUSE.
//!
//! debugfs reports a failed command on stderr and still exits 0, so every session is judged by
//! its stderr: a line other than the version banner is an error, unless the caller said which
//! messages it expects. Commands echo on stdout as `debugfs: CMD` when read from a script
//! (`-f`), which is how `ls -p` output is split per command.
//!
//! Paths reach debugfs through its command parser, which splits on white space and quotes: kiln
//! passes only paths made of a safe set of bytes ([`safe`]), and host paths relative to the
//! session's working directory, so nothing the user names (OUT's directory) is parsed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::image::error::ImageError;

/// One directory entry as `ls -p` prints it (`/INODE/MODE/UID/GID/NAME/SIZE/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The full `i_mode` (type and permission bits).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes (0 for a directory).
    pub size: u64,
}

/// File type bits of `i_mode` (`S_IFMT`), and the types kiln tells apart.
pub const S_IFMT: u32 = 0o170000;
/// A directory.
pub const S_IFDIR: u32 = 0o040000;
/// A regular file.
pub const S_IFREG: u32 = 0o100000;
/// A symbolic link.
pub const S_IFLNK: u32 = 0o120000;

impl Entry {
    /// The type bits.
    pub fn kind(&self) -> u32 {
        self.mode & S_IFMT
    }
}

/// Whether `s` can be passed to debugfs's parser as one word: letters, digits and `._+@:=,-/`,
/// not empty. Layer paths are checked by the archive rules before; this is the parser's own
/// limit, and a path outside it is refused, never quoted.
pub fn safe(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+@:=,-/".contains(&b))
}

/// A filesystem at a byte offset of an image file.
#[derive(Debug, Clone)]
pub struct Fs {
    spec: String,
    image: PathBuf,
    time: u64,
}

impl Fs {
    /// The ext4 filesystem at `offset` in `image`. Every time debugfs stamps (inode times,
    /// the superblock's write time) is `SOURCE_DATE_EPOCH`, or kiln's default epoch, as the
    /// SBOM's: e2fsprogs' `E2FSPROGS_FAKE_TIME` (lib/ext2fs, `fs->now`). So the same base,
    /// layer and epoch give the same bytes.
    pub fn new(image: &Path, offset: u64) -> Fs {
        Fs {
            spec: format!("{}?offset={offset}", image.display()),
            image: image.to_path_buf(),
            time: crate::layer_contract::epoch_from_env()
                .unwrap_or(crate::layer_contract::DEFAULT_EPOCH),
        }
    }

    /// Runs `script` (one command per line) in `cwd`, writable when `write`. Fails when
    /// debugfs prints anything to stderr but its banner and lines containing one of `expected`.
    /// Returns stdout.
    pub fn run(
        &self,
        script: &str,
        write: bool,
        cwd: &Path,
        expected: &[&str],
    ) -> Result<String, ImageError> {
        let mut cmd = Command::new("debugfs");
        if write {
            cmd.arg("-w");
        }
        let mut child = cmd
            .args(["-f", "-"])
            .arg(&self.spec)
            .env("E2FSPROGS_FAKE_TIME", self.time.to_string())
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ImageError::Tool {
                tool: "debugfs".into(),
                why: format!("could not run it ({e}); the unprivileged mode needs e2fsprogs"),
            })?;
        let mut stdin = child.stdin.take().expect("piped");
        let text = script.to_string();
        // Fed from a thread: a long script must not block on a full stdout pipe.
        let feeder = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
        let out = child.wait_with_output().map_err(|e| ImageError::Tool {
            tool: "debugfs".into(),
            why: e.to_string(),
        })?;
        let fed = feeder.join().is_ok_and(|r| r.is_ok());
        let err = String::from_utf8_lossy(&out.stderr);
        let bad: Vec<&str> = err
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("debugfs "))
            .filter(|l| !expected.iter().any(|x| l.contains(x)))
            .collect();
        if !out.status.success() || !bad.is_empty() || !fed {
            let mut shown: Vec<&str> = bad.iter().take(8).copied().collect();
            if bad.len() > 8 {
                shown.push("…");
            }
            return Err(ImageError::Tool {
                tool: "debugfs".into(),
                why: format!(
                    "{} on {}: {}",
                    if write { "writing" } else { "reading" },
                    self.spec,
                    if shown.is_empty() {
                        format!("exited with {}", out.status)
                    } else {
                        shown.join("; ")
                    }
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The entries of each directory in `dirs` (absolute paths in the filesystem), by name;
    /// a directory that does not exist (or is not a directory) is absent from the answer.
    pub fn list(
        &self,
        dirs: &[String],
        cwd: &Path,
    ) -> Result<BTreeMap<String, BTreeMap<String, Entry>>, ImageError> {
        if dirs.is_empty() {
            return Ok(BTreeMap::new());
        }
        let script: String = dirs.iter().map(|d| format!("ls -p {d}\n")).collect();
        let out = self.run(
            &script,
            false,
            cwd,
            &[
                "File not found by ext2_lookup",
                "Ext2 inode is not a directory",
            ],
        )?;
        Ok(parse_listings(&out))
    }

    /// The bytes of the file at `path` (absolute in the filesystem), `None` when there is
    /// none; at most `MAX_CAT` bytes (a manifest or an env file, not a payload).
    pub fn cat(&self, path: &str) -> Result<Option<Vec<u8>>, ImageError> {
        const MAX_CAT: usize = 16 << 20;
        if !safe(path) {
            return Ok(None);
        }
        // Its size first, so a huge file in a hostile base is never read into memory.
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let dir = if dir.is_empty() { "/" } else { dir };
        let listed = self.list(&[dir.to_string()], Path::new("/"))?;
        match listed.get(dir).and_then(|m| m.get(name)) {
            None => return Ok(None),
            Some(e) if e.kind() != S_IFREG => return Ok(None),
            Some(e) if e.size > MAX_CAT as u64 => {
                return Err(ImageError::Tool {
                    tool: "debugfs".into(),
                    why: format!(
                        "{path} in {} is {} bytes, expected at most {MAX_CAT}",
                        self.spec, e.size
                    ),
                })
            }
            Some(_) => {}
        }
        let out = Command::new("debugfs")
            .arg("-R")
            .arg(format!("cat {path}"))
            .arg(&self.spec)
            .output()
            .map_err(|e| ImageError::Tool {
                tool: "debugfs".into(),
                why: format!("could not run it ({e}); the unprivileged mode needs e2fsprogs"),
            })?;
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("File not found by ext2_lookup") {
            return Ok(None);
        }
        if let Some(l) = err
            .lines()
            .find(|l| !l.trim().is_empty() && !l.starts_with("debugfs "))
        {
            return Err(ImageError::Tool {
                tool: "debugfs".into(),
                why: format!("reading {path} in {}: {l}", self.spec),
            });
        }
        if out.stdout.len() > MAX_CAT {
            return Err(ImageError::Tool {
                tool: "debugfs".into(),
                why: format!("{path} in {} is over {MAX_CAT} bytes", self.spec),
            });
        }
        Ok(Some(out.stdout))
    }

    /// Runs `e2fsck -fn` on the filesystem: a full check that changes nothing.
    pub fn check(&self) -> Result<(), ImageError> {
        let out = Command::new("e2fsck")
            .arg("-fn")
            .arg(&self.spec)
            .output()
            .map_err(|e| ImageError::Tool {
                tool: "e2fsck".into(),
                why: format!("could not run it ({e})"),
            })?;
        if out.status.success() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let first: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("Pass ") && !l.trim().is_empty())
            .take(6)
            .collect();
        Err(ImageError::Tool {
            tool: "e2fsck".into(),
            why: format!(
                "the root filesystem of {} is inconsistent after the write ({}): {}",
                self.image.display(),
                out.status,
                first.join("; ")
            ),
        })
    }
}

/// Splits a session's stdout into `ls -p` listings: `debugfs: ls -p DIR` starts one.
fn parse_listings(out: &str) -> BTreeMap<String, BTreeMap<String, Entry>> {
    // (directory, entries, whether its `.` was listed: a directory that could not be
    // listed prints none, an empty one prints `.` and `..`).
    let mut all = BTreeMap::new();
    let mut cur: Option<(String, BTreeMap<String, Entry>, bool)> = None;
    let mut close = |c: Option<(String, BTreeMap<String, Entry>, bool)>| {
        if let Some((d, m, true)) = c {
            all.insert(d, m);
        }
    };
    for line in out.lines() {
        if let Some(dir) = line.strip_prefix("debugfs: ls -p ") {
            close(cur.take());
            cur = Some((dir.trim().to_string(), BTreeMap::new(), false));
            continue;
        }
        let Some((_, entries, listed)) = cur.as_mut() else {
            continue;
        };
        if let Some((name, e)) = parse_entry(line) {
            match name.as_str() {
                "." => *listed = true,
                ".." => {}
                _ => {
                    entries.insert(name, e);
                }
            }
        }
    }
    close(cur);
    all
}

/// `/INODE/MODE/UID/GID/NAME/SIZE/` (debugfs/ls.c, `-p`); a name cannot hold `/`.
fn parse_entry(line: &str) -> Option<(String, Entry)> {
    let body = line.strip_prefix('/')?.strip_suffix('/')?;
    let f: Vec<&str> = body.split('/').collect();
    let [_ino, mode, uid, gid, name, size] = f[..] else {
        return None;
    };
    let mode = u32::from_str_radix(mode, 8).ok()?;
    Some((
        name.to_string(),
        Entry {
            mode,
            uid: uid.parse().ok()?,
            gid: gid.parse().ok()?,
            size: if size.is_empty() {
                0
            } else {
                size.parse().ok()?
            },
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_split_per_command() {
        let out = "debugfs: ls -p /etc\n/13/040755/0/0/.//\n/2/040755/0/0/..//\n\
/14/120777/0/0/kiln/8/\n/15/100644/0/0/x/3/\n\ndebugfs: ls -p /nope\ndebugfs: ls -p /usr\n\
/3/040755/0/0/.//\n/2/040755/0/0/..//\n/4/040700/1000/1000/bin//\n";
        let m = parse_listings(out);
        assert_eq!(m["/etc"]["kiln"].kind(), S_IFLNK);
        assert_eq!(m["/etc"]["x"].size, 3);
        assert_eq!(m["/usr"]["bin"].mode, 0o040700);
        assert_eq!(m["/usr"]["bin"].uid, 1000);
        assert!(!m.contains_key("/nope"), "{m:?}");
    }

    #[test]
    fn only_plain_words_pass() {
        assert!(safe("usr/lib/systemd/system/kubelet.service"));
        assert!(safe(
            "etc/systemd/system/multi-user.target.wants/kiln@x.service"
        ));
        for bad in ["", "a b", "a\"b", "a\nb", "a\\b", "a#b", "é"] {
            assert!(!safe(bad), "{bad:?}");
        }
    }
}
