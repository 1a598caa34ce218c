//! PAX sparse members: GNU tar's PAX formats 0.0, 0.1 and 1.0 mark a sparse file with
//! `GNU.sparse.*` records on an ordinary regular entry, whose data is then the sparse map
//! followed by the chunks. A reader that does not know the records unpacks that raw data as
//! the file. kiln's upstream archives never hold sparse files, so they are refused.

use std::io::Read;

/// Whether the entry's PAX records mark it as a sparse file. Records that cannot be read are
/// left to the tar reader, which fails on them itself.
pub(super) fn is_sparse<R: Read>(e: &mut tar::Entry<'_, R>) -> bool {
    let Ok(Some(records)) = e.pax_extensions() else {
        return false;
    };
    records
        .flatten()
        .any(|x| x.key_bytes().starts_with(b"GNU.sparse."))
}
