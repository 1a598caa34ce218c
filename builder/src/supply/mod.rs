//! The supply chain: everything between an upstream release and a verified blob on disk.
//!
//! [`lock`] pins every artifact (URL, size, sha256); [`sign`] checks and makes the lock's
//! minisign signature; [`store`] is the content-addressed blob store every byte lands in after
//! it was hashed; [`fetch`] fills a store from mirrors and upstream; [`mirror`] keeps an
//! air-gapped copy; [`inspect`] is the binary gate that refuses a file built for the wrong OS
//! or architecture; [`outdated`] says when a lock falls behind upstream's patch releases;
//! [`advisory`] audits a lock against known advisories and the lock's signed [`waiver`]s.
//! Nothing here knows about images, bakes or provisioners.

pub mod advisory;
pub mod fetch;
pub mod inspect;
pub mod layer_trust;
pub mod lock;
pub mod lock_edit;
pub mod lock_image;
pub mod mirror;
pub mod mirror_images;
pub mod names;
pub mod outdated;
pub mod registry;
pub mod sign;
pub mod skew;
pub mod store;
pub mod waiver;
