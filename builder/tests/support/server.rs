//! Loopback HTTP server placeholder.
