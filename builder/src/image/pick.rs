//! Which partition of a table is the root filesystem: by type GUID, by label, or the one
//! the user names.

use crate::image::partition::{guid, Partition, Table};

/// Partition labels that name the root filesystem on a partition of a generic type:
/// Ubuntu cloud images (`cloudimg-rootfs`), Debian/mkosi (`root`), Flatcar (`ROOT`).
pub const ROOT_LABELS: &[&str] = &["cloudimg-rootfs", "root", "ROOT"];

/// Why no root partition was chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    /// `--partition N` names no partition.
    #[error("has no partition {number} (partitions: {have})")]
    NoSuchPartition {
        /// The number asked for.
        number: u32,
        /// The numbers there.
        have: String,
    },
    /// No partition looks like a root.
    #[error("has no root partition: expected a GPT root type ({}, {}), a Linux filesystem or Flatcar root partition labelled {}, or one MBR partition of type 0x83; found {found}; name it with --partition N", guid::ROOT_X86_64, guid::ROOT_ARM64, ROOT_LABELS.join("/"))]
    None {
        /// What is there.
        found: String,
    },
    /// More than one does.
    #[error(
        "has {count} partitions that could be the root ({which}); name one with --partition N"
    )]
    Ambiguous {
        /// How many.
        count: usize,
        /// Their numbers.
        which: String,
    },
}

fn describe(parts: &[Partition]) -> String {
    if parts.is_empty() {
        return "no partitions".into();
    }
    parts
        .iter()
        .map(|p| {
            if p.label.is_empty() {
                format!("{} type {}", p.number, p.kind)
            } else {
                format!("{} type {} label {:?}", p.number, p.kind, p.label)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The root partition: `number` when given; else by GPT root type, then by a root label on
/// a Linux or Flatcar root type, or the only MBR Linux (0x83) partition.
pub fn pick_root(table: &Table, number: Option<u32>) -> Result<Partition, PickError> {
    let parts = &table.partitions;
    if let Some(n) = number {
        return parts
            .iter()
            .find(|p| p.number == n)
            .cloned()
            .ok_or_else(|| PickError::NoSuchPartition {
                number: n,
                have: describe(parts),
            });
    }
    let tiers: [&dyn Fn(&Partition) -> bool; 2] = [
        &|p| p.kind == guid::ROOT_X86_64 || p.kind == guid::ROOT_ARM64,
        &|p| {
            ((p.kind == guid::LINUX_DATA || p.kind == guid::COREOS_ROOT)
                && ROOT_LABELS.contains(&p.label.as_str()))
                || p.kind == "0x83"
        },
    ];
    for tier in tiers {
        let hits: Vec<&Partition> = parts.iter().filter(|p| tier(p)).collect();
        match hits.len() {
            0 => continue,
            1 => return Ok(hits[0].clone()),
            n => {
                return Err(PickError::Ambiguous {
                    count: n,
                    which: describe(&hits.into_iter().cloned().collect::<Vec<_>>()),
                })
            }
        }
    }
    Err(PickError::None {
        found: describe(parts),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::partition::Scheme;

    fn p(number: u32, kind: &str, label: &str) -> Partition {
        Partition {
            number,
            offset: u64::from(number) << 20,
            size: 1 << 20,
            kind: kind.into(),
            label: label.into(),
        }
    }

    #[test]
    fn picks_the_root() {
        let esp = p(1, "c12a7328-f81f-11d2-ba4b-00a0c93ec93b", "EFI");
        let cases: Vec<(Vec<Partition>, Result<u32, &str>)> = vec![
            (vec![esp.clone(), p(2, guid::ROOT_X86_64, "")], Ok(2)),
            (vec![esp.clone(), p(2, guid::ROOT_ARM64, "x")], Ok(2)),
            // A root type wins over a root label.
            (
                vec![p(1, guid::LINUX_DATA, "root"), p(2, guid::ROOT_X86_64, "")],
                Ok(2),
            ),
            (
                vec![esp.clone(), p(2, guid::LINUX_DATA, "cloudimg-rootfs")],
                Ok(2),
            ),
            (
                vec![
                    p(9, guid::COREOS_ROOT, "ROOT"),
                    p(3, guid::LINUX_DATA, "USR-A"),
                ],
                Ok(9),
            ),
            (vec![p(1, "0x83", "")], Ok(1)),
            (
                vec![p(1, "0x83", ""), p(2, "0x83", "")],
                Err("has 2 partitions"),
            ),
            (
                vec![p(1, guid::LINUX_DATA, "data")],
                Err("has no root partition"),
            ),
            (vec![], Err("found no partitions")),
        ];
        for (parts, want) in cases {
            let t = Table {
                scheme: Scheme::Gpt,
                partitions: parts.clone(),
            };
            match (pick_root(&t, None), want) {
                (Ok(got), Ok(n)) => assert_eq!(got.number, n, "{parts:?}"),
                (Err(e), Err(s)) => assert!(e.to_string().contains(s), "{e} lacks {s}"),
                (got, want) => panic!("{parts:?}: {got:?}, want {want:?}"),
            }
        }
    }
}
