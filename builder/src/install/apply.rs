//! The all-or-nothing half of `kiln install`: directories are made and every file is staged
//! as a temp file beside its target, then each target is renamed into place (the old one kept
//! as a hard-linked backup). Every change is journalled; the first failure undoes them all in
//! reverse, so a refused or failed install leaves the root as it was.

use std::collections::BTreeMap;
use std::io::{self, Read, Write as _};
use std::path::Path;
use std::rc::Rc;

use sha2::{Digest, Sha256};

use crate::install::error::{hostile, io_err, split, InstallError};
use crate::install::root::{Dir, Root};

/// A file or link the plan writes.
#[derive(Debug, Clone)]
pub(super) struct Write {
    /// The parent directory (a root-relative path).
    pub parent: String,
    /// The name in it.
    pub name: String,
    /// Whether something (kiln's own, unmodified) is there now and gets replaced.
    pub replace: bool,
}

/// Every change an install makes, decided before the first one.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Directories to create, parents first.
    pub mkdirs: Vec<String>,
    /// Files and links to write, by layer path.
    pub write: BTreeMap<String, Write>,
    /// Files kiln installed earlier that this layer dropped: (path, parent, name).
    pub remove: Vec<(String, String, String)>,
}

/// One change, and how to take it back.
#[derive(Debug)]
enum Undo {
    MadeDir {
        parent: Rc<Dir>,
        name: String,
    },
    Temp {
        dir: Rc<Dir>,
        tmp: String,
    },
    Added {
        dir: Rc<Dir>,
        name: String,
    },
    Replaced {
        dir: Rc<Dir>,
        name: String,
        backup: String,
    },
    Removed {
        dir: Rc<Dir>,
        name: String,
        backup: String,
    },
}

/// A file staged beside its target.
#[derive(Debug)]
struct Staged {
    dir: Rc<Dir>,
    name: String,
    tmp: String,
    replace: bool,
}

/// The journal of one install.
#[derive(Debug)]
pub(super) struct Transaction<'a> {
    root: &'a Root,
    dirs: BTreeMap<String, Rc<Dir>>,
    staged: BTreeMap<String, Staged>,
    undo: Vec<Undo>,
    changes: usize,
    fail_at: Option<usize>,
    durable: bool,
}

impl<'a> Transaction<'a> {
    /// A transaction on `root`, with the directories the plan found already open.
    pub fn new(
        root: &'a Root,
        dirs: BTreeMap<String, Rc<Dir>>,
        fail_at: Option<usize>,
        durable: bool,
    ) -> Transaction<'a> {
        Transaction {
            root,
            dirs,
            staged: BTreeMap::new(),
            undo: Vec::new(),
            changes: 0,
            fail_at,
            durable,
        }
    }

    /// Runs `f`; on success drops the backups, on failure undoes every change made.
    pub fn run(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<(), InstallError>,
    ) -> Result<(), InstallError> {
        match f(self) {
            Ok(()) => {
                self.finish();
                Ok(())
            }
            Err(e) => {
                let problems = self.rollback();
                if problems.is_empty() {
                    Err(e)
                } else {
                    Err(InstallError::RollbackFailed {
                        source: Box::new(e),
                        problems,
                    })
                }
            }
        }
    }

    /// Counts one change; the injected fault fires here.
    fn step(&mut self, what: &Path) -> Result<(), InstallError> {
        let n = self.changes;
        self.changes += 1;
        if self.fail_at == Some(n) {
            return Err(io_err(what)(io::Error::other(format!(
                "injected failure at change {n}"
            ))));
        }
        Ok(())
    }

    fn dir(&self, rel: &str) -> Result<Rc<Dir>, InstallError> {
        self.dirs
            .get(rel)
            .cloned()
            .ok_or_else(|| InstallError::Root {
                root: self.root.host_path(""),
                why: format!("directory /{rel} was not resolved by the plan"),
            })
    }

    /// Creates the planned directories, parents first.
    pub fn make_dirs(&mut self, mkdirs: &[String]) -> Result<(), InstallError> {
        for rel in mkdirs {
            let (up, name) = split(rel);
            let parent = self.dir(up)?;
            let host = parent.host(name);
            self.step(&host)?;
            let d = parent.mkdir(name).map_err(io_err(&host))?;
            self.undo.push(Undo::MadeDir {
                parent,
                name: name.to_string(),
            });
            self.dirs.insert(rel.clone(), Rc::new(d));
        }
        Ok(())
    }

    /// Writes `r` into a temp file beside `path`'s target, checking it hashes to `sha256`.
    #[allow(clippy::too_many_arguments)]
    pub fn stage_file(
        &mut self,
        path: &str,
        w: &Write,
        r: &mut dyn Read,
        mode: u32,
        sha256: &str,
        archive: &Path,
        entry: &str,
    ) -> Result<(), InstallError> {
        let dir = self.dir(&w.parent)?;
        let host = dir.host(&w.name);
        self.step(&host)?;
        let (tmp, mut f) = dir.create_temp().map_err(io_err(dir.path()))?;
        self.undo.push(Undo::Temp {
            dir: dir.clone(),
            tmp: tmp.clone(),
        });
        let tmp_host = dir.host(&tmp);
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = r.read(&mut buf).map_err(io_err(archive))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            f.write_all(&buf[..n]).map_err(io_err(&tmp_host))?;
        }
        if hex::encode(h.finalize()) != sha256 {
            return Err(hostile(
                archive,
                entry,
                "content changed between the check and the write",
            ));
        }
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io_err(&tmp_host))?;
        if self.durable {
            f.sync_all().map_err(io_err(&tmp_host))?;
        }
        self.staged.insert(
            path.to_string(),
            Staged {
                dir,
                name: w.name.clone(),
                tmp,
                replace: w.replace,
            },
        );
        Ok(())
    }

    /// Makes a temp symlink to `target` beside `path`'s target.
    pub fn stage_link(&mut self, path: &str, w: &Write, target: &str) -> Result<(), InstallError> {
        let dir = self.dir(&w.parent)?;
        let host = dir.host(&w.name);
        self.step(&host)?;
        let tmp = dir.symlink_temp(target).map_err(io_err(dir.path()))?;
        self.undo.push(Undo::Temp {
            dir: dir.clone(),
            tmp: tmp.clone(),
        });
        self.staged.insert(
            path.to_string(),
            Staged {
                dir,
                name: w.name.clone(),
                tmp,
                replace: w.replace,
            },
        );
        Ok(())
    }

    /// Whether `path` has been staged.
    pub fn is_staged(&self, path: &str) -> bool {
        self.staged.contains_key(path)
    }

    /// Renames the staged file for `path` into place, keeping a backup of what it replaces.
    pub fn commit(&mut self, path: &str) -> Result<(), InstallError> {
        let Some(s) = self.staged.get(path) else {
            return Err(InstallError::Root {
                root: self.root.host_path(""),
                why: format!("/{path} was not staged"),
            });
        };
        let (dir, name, tmp, replace) = (s.dir.clone(), s.name.clone(), s.tmp.clone(), s.replace);
        let host = dir.host(&name);
        self.step(&host)?;
        if replace {
            let backup = dir.backup(&name).map_err(io_err(&host))?;
            if let Err(e) = dir.rename(&tmp, &name) {
                let _ = dir.unlink(&backup);
                return Err(io_err(&host)(e));
            }
            self.undo.push(Undo::Replaced { dir, name, backup });
        } else {
            // Nothing may have appeared there since the plan looked.
            dir.rename_noreplace(&tmp, &name).map_err(io_err(&host))?;
            self.undo.push(Undo::Added { dir, name });
        }
        Ok(())
    }

    /// Moves a file kiln installed earlier aside (deleted on success, restored on failure).
    pub fn remove(&mut self, parent: &str, name: &str) -> Result<(), InstallError> {
        let dir = self.dir(parent)?;
        let host = dir.host(name);
        self.step(&host)?;
        let backup = dir.move_aside(name).map_err(io_err(&host))?;
        self.undo.push(Undo::Removed {
            dir,
            name: name.to_string(),
            backup,
        });
        Ok(())
    }

    /// Undoes every change, newest first; returns what could not be undone.
    fn rollback(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut note = |what: String, r: io::Result<()>| match r {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && what.starts_with("removing temp") => {}
            Err(e) => problems.push(format!("{what}: {e}")),
        };
        while let Some(u) = self.undo.pop() {
            match u {
                Undo::Added { dir, name } => note(
                    format!("removing {}", dir.host(&name).display()),
                    dir.unlink(&name),
                ),
                Undo::Replaced { dir, name, backup } | Undo::Removed { dir, name, backup } => note(
                    format!("restoring {} from {backup}", dir.host(&name).display()),
                    dir.rename(&backup, &name),
                ),
                Undo::Temp { dir, tmp } => note(
                    format!("removing temp {}", dir.host(&tmp).display()),
                    dir.unlink(&tmp),
                ),
                Undo::MadeDir { parent, name } => note(
                    format!("removing directory {}", parent.host(&name).display()),
                    parent.rmdir(&name),
                ),
            }
        }
        problems
    }

    /// Drops the backups and flushes every directory touched (when durable).
    fn finish(&mut self) {
        let durable = self.durable;
        let sync = |d: &Dir| {
            if durable {
                d.sync()
            }
        };
        for u in std::mem::take(&mut self.undo) {
            match u {
                Undo::Replaced { dir, backup, .. } | Undo::Removed { dir, backup, .. } => {
                    if let Err(e) = dir.unlink(&backup) {
                        eprintln!(
                            "kiln: warning: could not remove backup {}: {e}",
                            dir.host(&backup).display()
                        );
                    }
                    sync(&dir);
                }
                Undo::Added { dir, .. } => sync(&dir),
                Undo::MadeDir { parent, .. } => sync(&parent),
                Undo::Temp { .. } => {}
            }
        }
    }
}
